"""Pulsar's canonical example: append '!' to every input."""

from pulsar import Function


class Exclaim(Function):
    def process(self, input, context):
        return input + "!"
