"""Counts words in the state store, as Pulsar's WordCountFunction does."""

from pulsar import Function


class WordCount(Function):
    def process(self, input, context):
        for word in input.split():
            context.incr_counter(word, 1)
        return None
