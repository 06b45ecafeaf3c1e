"""A keyedState function's process instance: its state stays in the worker, its calls cross a pipe.

The worker owns a keyed function's key-group stores (functions/migration.py, functions/keyed_cluster.py):
a live migration releases, pre-copies and opens groups there, and REST querystate reads them there. A
process instance therefore keeps no store of its own. Its Context's state calls go to its worker's
store over a pipe, and one worker thread serves them in order (`serve_state`). For the store, that
thread is the instance's thread, as with the thread runtime: a message's scope, and an
EFFECTIVELY_ONCE transaction holding its group, belong to it. A process that dies between begin and
commit has its transaction rolled back when its pipe closes.

The instance's input is the worker's too (its mailbox or route topic, served by piped_input.serve_pipe).
Its acks reach the worker there, and the worker holds each ack until the state changes sent before it
are in the changelog (`PersistedAcks`). So the process runs `when_persisted` callbacks (acks) at once.
A call costs one pipe round trip (benchmarks: bench/keyed_runtime.py).
"""

from __future__ import annotations

import functools
import logging
import pickle
import threading
from dataclasses import dataclass
from typing import Callable

import pulsar

from .piped_input import serve_pipe
from .state import StateStore

log = logging.getLogger(__name__)
STATE_CALLS = frozenset({"incr_counter", "get_counter", "del_counter", "put_state", "get_state"})
SCOPE_CALLS = frozenset({"begin", "commit", "abort", "flush_before_ack", "flush"})


@dataclass(frozen=True)
class KeyedParts:
    """What the worker holds for one keyed process instance."""

    open_input: Callable[[], object]        # its mailbox or route topic; restores its groups first
    store: StateStore                       # its key groups' store on this worker
    client: Callable[[], pulsar.Client]     # the worker's client: the changelog's producers


def serve_keyed(input_conn, state_conn, parts: KeyedParts, name: str) -> None:
    """Worker side: one thread serves the instance's state calls, another its input."""
    threading.Thread(target=serve_state, args=(state_conn, parts.store, parts.client), name=f"{name}:state",
                     daemon=True).start()
    threading.Thread(target=_serve_input, args=(input_conn, parts), name=f"{name}:input", daemon=True).start()


def _serve_input(conn, parts: KeyedParts) -> None:
    try:
        lease = PersistedAcks(parts.open_input(), parts.store)
    except Exception:   # the process then reads the closed pipe and fails, saying so in its status
        log.exception("cannot open the keyed input of a process instance")
        conn.close()
        return
    serve_pipe(conn, lease)


class PersistedAcks:
    """The instance's input, worker side: an ack goes out once the state changes sent before it are in the
    changelog (the thread runtime's Instance does the same through StateStore.when_persisted)."""

    def __init__(self, keyed_input, store: StateStore):
        self._input = keyed_input
        self._store = store

    def receive(self, timeout_millis: int):
        return self._input.receive(timeout_millis)

    def acknowledge(self, msg) -> None:
        self._store.when_persisted(lambda: self._input.acknowledge(msg))

    def negative_acknowledge(self, msg) -> None:
        self._input.negative_acknowledge(msg)

    def close(self) -> None:
        self._input.close()


def serve_state(conn, store: StateStore, client: Callable[[], pulsar.Client]) -> None:
    """Worker side, one thread per process instance: apply its calls in order, answer each."""
    try:
        while True:
            try:
                op, group, args = conn.recv()
            except (EOFError, OSError):
                return
            try:
                answer = (True, _apply(store, client, op, group, args))
            except Exception as exc:   # the function's own error (a bad value) or the store's: raised there
                answer = (False, _portable(exc))
            try:
                conn.send(answer)
            except OSError:
                return
    finally:
        store.abort()   # a message the process never finished: EFFECTIVELY_ONCE rolls back, the group is free


def _apply(store: StateStore, client: Callable[[], pulsar.Client], op: str, group: int | None, args: tuple):
    if op == "attach":
        return store.attach_changelog(client(), *args)
    if op in SCOPE_CALLS:
        return getattr(store, op)(*args)
    if op in STATE_CALLS:
        return getattr(store if group is None else store.group(group), op)(*args)
    raise ValueError(f"unknown state call {op!r}")


def _portable(exc: Exception) -> Exception:
    """The exception itself when it crosses the pipe intact, else a RuntimeError that names it."""
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class RemoteStateStore:
    """Process side: the StateStore methods an Instance and its Context call, served by serve_state."""

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.Lock()

    def call(self, op: str, group: int | None, *args):
        with self._lock:
            self._conn.send((op, group, args))
            ok, value = self._conn.recv()
        if not ok:
            raise value
        return value

    def attach_changelog(self, _client, changelog) -> None:
        """The worker's store writes the changelog, with the worker's client."""
        self.call("attach", None, changelog)

    def group(self, group: int) -> "RemoteGroupView":
        return RemoteGroupView(self, group)

    def begin(self, group: int, msg_id: str | None = None) -> bool:
        return self.call("begin", None, group, msg_id)

    def commit(self) -> None:
        self.call("commit", None)

    def abort(self) -> None:
        self.call("abort", None)

    def flush_before_ack(self) -> None:
        self.call("flush_before_ack", None)

    def flush(self, everything: bool = False) -> None:
        self.call("flush", None, everything)

    def when_persisted(self, callback) -> None:
        """Now: the callback is an ack, and the worker holds acks until the changes before them are persisted."""
        callback()

    def __getattr__(self, name: str):
        if name not in STATE_CALLS:
            raise AttributeError(name)
        return functools.partial(self.call, name, None)


class RemoteGroupView:
    """A key group's state calls (StateStore.group's GroupView), served in the worker."""

    def __init__(self, store: RemoteStateStore, group: int):
        self._store = store
        self.group = group

    def __getattr__(self, name: str):
        if name not in STATE_CALLS:
            raise AttributeError(name)
        return functools.partial(self._store.call, name, self.group)
