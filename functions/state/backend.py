"""What an instance and its Context need of a state store, as a type: the worker's local StateStore and the
process runtime's RemoteStateStore (its calls served by the worker over a pipe) both provide it, so the
instance code is the same whichever runtime hosts it (as Pulsar's Python instance depends on a StateContext
with two implementations)."""

from __future__ import annotations

from typing import Any, Callable, Protocol


class GroupState(Protocol):
    """One key group's state: the Pulsar Context's state verbs."""

    def incr_counter(self, key: str, amount: int) -> int: ...

    def get_counter(self, key: str) -> int: ...

    def del_counter(self, key: str) -> None: ...

    def put_state(self, key: str, value: Any) -> None: ...

    def get_state(self, key: str) -> Any: ...


class StateBackend(Protocol):
    """A function instance's state: per key group, with a message's changes applied as one unit (begin, then
    commit or abort) and acks released once what they depend on is persisted."""

    def attach_changelog(self, client: Any, changelog: Any) -> None: ...

    def group(self, group: int) -> GroupState: ...

    def begin(self, group: int, msg_id: str | None = None) -> bool: ...

    def commit(self) -> None: ...

    def abort(self) -> None: ...

    def flush_before_ack(self) -> None: ...

    def flush(self, everything: bool = False) -> None: ...

    def when_persisted(self, callback: Callable[[], None]) -> None: ...


# the calls a state store is driven by when they cross a process boundary by name (a process instance's pipe,
# an instance's session on the cluster's owner of the state)
STATE_CALLS = frozenset({"incr_counter", "get_counter", "del_counter", "put_state", "get_state"})
SCOPE_CALLS = frozenset({"begin", "commit", "abort", "flush_before_ack", "flush"})


def apply_call(store: Any, op: str, group: int | None, args) -> Any:
    """One call by name on `store` (a StateStore): a scope call, or a state call on the store or on `group`."""
    if op in SCOPE_CALLS:
        return getattr(store, op)(*args)
    if op in STATE_CALLS:
        return getattr(store if group is None else store.group(group), op)(*args)
    raise ValueError(f"unknown state call {op!r}")
