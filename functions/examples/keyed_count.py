"""Counts records per message key in the state store (a keyedState function: each key's count lives with
the instance that owns its key group) and says which instance counted: `key:count:instance`."""

from pulsar import Function


class KeyedCount(Function):
    def process(self, input, context):
        key = context.get_message_key() or ""
        count = context.incr_counter(key, 1)
        return f"{key}:{count}:{context.get_instance_id()}"
