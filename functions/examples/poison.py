"""A function that fails on one message: shows maxMessageRetries and the dead-letter topic.

"poison" always raises; "object" returns something no serde can serialize (a user exception
too); anything else comes back with "!". Every delivery is counted in the function's state
(`pulsar-autoscale functions querystate --name N --key deliveries:<input>`).
"""

from pulsar import Function


class Poison(Function):
    def process(self, input, context):
        context.incr_counter(f"deliveries:{input}", 1)
        if input == "poison":
            raise ValueError("cannot digest a poison message")
        if input == "object":
            return object()
        return f"{input}!"
