"""Which key group a message's or a key's state lives in, and one group's view with the Context's state verbs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pulsar_autoscale.functions.model.keygroups import key_group
from pulsar_autoscale.functions.state.changelog import COUNTER, VALUE

if TYPE_CHECKING:
    from pulsar_autoscale.functions.state.store import StateStore

# Pulsar's sticky key for a message with neither an ordering nor a partition key (Commands.peekStickyKey):
# Key_Shared sends all such messages to the owner of this key's group, so their state lives there too.
NONE_KEY = "NONE_KEY"


def message_group(message, num_key_groups: int) -> int:
    """The key group of an input message: of its ordering key, else its partition key, else NONE_KEY."""
    ordering = getattr(message, "ordering_key", None)
    key = (ordering() if ordering is not None else None) or message.partition_key() or NONE_KEY
    return key_group(key, num_key_groups)


def state_group(message, num_key_groups: int, keyed: bool) -> int:
    """Where a message's state calls go. A keyedState function's: its message's group, which moves with the
    message's key. Any other function's: its one group, so that a state key has one copy whichever message writes
    it, as in Pulsar's table service (per message group, a counter that messages of 10 keys increment 10 times
    each would read 10, not 100)."""
    return message_group(message, num_key_groups) if keyed else one_group(num_key_groups)


def one_group(num_key_groups: int) -> int:
    """The group that holds all the state of a function without keyedState: unkeyed messages' NONE_KEY group."""
    return key_group(NONE_KEY, num_key_groups)


@dataclass(frozen=True)
class GroupView:
    """One key group of a store, with the Context's state verbs."""

    store: StateStore
    group: int

    def incr_counter(self, key: str, amount: int) -> int:
        return self.store.incr(self.group, key, amount)

    def get_counter(self, key: str) -> int:
        return self.store.read(self.group, COUNTER, key) or 0

    def del_counter(self, key: str) -> None:
        self.store.delete(self.group, COUNTER, key)

    def put_state(self, key: str, value) -> None:
        self.store.put(self.group, key, value)

    def get_state(self, key: str):
        return self.store.read(self.group, VALUE, key)
