"""A keyedState function's process instance: its state stays in the worker, its calls cross a pipe.

The worker owns a keyed function's key-group stores (functions/keyed/migration.py, functions/keyed/cluster.py):
a live migration releases, pre-copies and opens groups there, and REST querystate reads them there. A
process instance therefore keeps no store of its own. Its input (its mailbox or route topic) and its
Context's state calls share one pipe, served in order by one worker thread (`KeyedServer`). For the store,
that thread is the instance's thread, as with the thread runtime: a message's scope, and an
EFFECTIVELY_ONCE transaction holding its group, belong to it. A process that dies between begin and commit
has its transaction rolled back when its pipe closes.

One pipe, and few crossings of it per record (each wakes a worker thread, which then waits for the
worker's GIL; bench/keyed_runtime.py):
- a receive is answered with the message and its scope begun (the worker knows its group and id), so the
  Context's begin costs nothing;
- commit, abort, ack and nack wait for no answer: they go with the next call that does (a batch), and are
  applied in order before it. So an ack always follows its record's commit, and the worker holds it until
  the changelog has the record's changes (`StateStore.when_persisted`). A failure of one of them is
  raised by the next call (the next receive, outside the user's code) and every later ack is dropped: the
  instance fails, and what it took and did not ack is redelivered. The instance loop receives every
  100 ms when idle, so an ack waits at most that long to leave.
"""

from __future__ import annotations

import functools
import logging
import pickle
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import pulsar

from pulsar_autoscale.functions.runtimes.piped_input import PipedMessage, Taken
from pulsar_autoscale.functions.state.backend import STATE_CALLS, apply_call
from pulsar_autoscale.functions.state.groups import state_group
from pulsar_autoscale.functions.state.store import StateStore

if TYPE_CHECKING:
    from pulsar_autoscale.functions.instance.instance import InstanceInput

log = logging.getLogger(__name__)
ONE_WAY = frozenset({"commit", "abort", "ack", "nack"})


@dataclass(frozen=True)
class KeyedParts:
    """What the worker holds for one keyed process instance."""

    open_input: Callable[[], InstanceInput]  # its mailbox or route topic; restores its groups first
    store: StateStore  # its key groups' store on this worker
    client: Callable[[], pulsar.Client]  # the worker's client: the changelog's producers
    num_key_groups: int
    once: bool  # EFFECTIVELY_ONCE: a scope is a transaction with the message's id


def serve_keyed(conn, parts: KeyedParts, name: str) -> None:
    """Worker side: one thread serves the instance's input and state calls, in the order they were sent."""
    threading.Thread(target=KeyedServer(conn, parts).serve, name=f"{name}:keyed", daemon=True).start()


class KeyedServer:
    """Worker side of one keyed process instance's pipe."""

    def __init__(self, conn, parts: KeyedParts):
        self._conn = conn
        self._parts = parts
        self._store = parts.store
        self._input: InstanceInput | None = None
        self._taken = Taken()
        self._failed: Exception | None = None  # a one-way call's failure, for the next answer

    def serve(self) -> None:
        try:
            while True:
                try:
                    *one_way, (op, group, args) = self._conn.recv()  # a batch: one-way calls, then a call
                except (EOFError, OSError):
                    return
                for one_op, _, one_args in one_way:
                    if self._failed is None:
                        try:
                            self._one_way(one_op, one_args)
                        except Exception as exc:
                            log.exception("a keyed process instance's %s failed", one_op)
                            self._failed = _portable(exc)
                if self._failed is not None and op != "close":  # a close nacks what was taken: always safe
                    answer = (False, self._failed)
                else:
                    try:
                        answer = (True, self._answer(op, group, args))
                    except Exception as exc:  # the function's own error (a bad value) or the store's: raised there
                        answer = (False, _portable(exc))
                try:
                    self._conn.send(answer)
                except OSError:
                    return
        finally:
            self._store.abort()  # a message the process never finished: EFFECTIVELY_ONCE rolls back, the group is free
            self._close_input()

    def _one_way(self, op: str, args: tuple) -> None:
        if op in ("commit", "abort"):
            getattr(self._store, op)()
        elif op == "ack":
            msg, keyed_input = self._taken.pop(args[0]), self._opened()
            self._store.when_persisted(lambda: keyed_input.acknowledge(msg))
        else:
            self._opened().negative_acknowledge(self._taken.pop(args[0]))

    def _opened(self) -> InstanceInput:
        """The input, for recv, ack and nack: only the process's RemoteInput sends them, and it exists once the open
        was answered, until its close (the process's last call)."""
        assert self._input is not None
        return self._input

    def _answer(self, op: str, group: int | None, args: tuple):
        if op == "open":
            self._input = self._parts.open_input()
            return None
        if op == "recv":
            return self._receive(*args)
        if op == "close":  # the instance stops
            return self._close_input()
        if op == "attach":
            return self._store.attach_changelog(self._parts.client(), *args)
        if op == "begin":
            self._store.abort()  # a scope begun with the receive for other arguments: not the one asked for
        return apply_call(self._store, op, group, args)

    def _receive(self, timeout_millis: int):
        """The next message, and its scope begun: (message, group, message id or None, (ok, begin's answer))."""
        try:
            msg = self._opened().receive(timeout_millis)
        except pulsar.Timeout:
            return None
        piped = self._taken.take(msg)
        group = state_group(msg, self._parts.num_key_groups, True)
        msg_id = str(msg.message_id()) if self._parts.once else None
        begun: tuple[bool, bool | Exception]
        try:
            begun = (True, self._store.begin(group, msg_id))
        except Exception as exc:  # raised by the Context's begin in the process, as on the thread runtime
            begun = (False, _portable(exc))
        return piped, group, msg_id, begun

    def _close_input(self) -> None:
        keyed_input, self._input = self._input, None
        if keyed_input is not None:
            self._taken.give_back(keyed_input)  # redelivered to the instance started in its place


def _portable(exc: Exception) -> Exception:
    """The exception itself when it crosses the pipe intact, else a RuntimeError that names it."""
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class RemoteStateStore:
    """Process side: the StateStore methods an Instance and its Context call, served by KeyedServer; and,
    through `input()`, the instance's input on the same pipe."""

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.Lock()
        self._one_way: list[tuple] = []  # acks come from producer callbacks on other threads: a lock of its own
        self._one_way_lock = threading.Lock()
        self._begun: list | None = None  # the last message's scope, begun with its receive: group, id, answer

    def call(self, op: str, group: int | None, *args):
        with self._lock:
            with self._one_way_lock:
                batch, self._one_way = self._one_way, []
            batch.append((op, group, args))
            self._conn.send(batch)
            ok, value = self._conn.recv()
        if not ok:
            raise value
        return value

    def send(self, op: str, group: int | None, *args) -> None:
        """A one-way call: it goes with the next call(), which raises its failure."""
        with self._one_way_lock:
            self._one_way.append((op, group, args))

    def input(self) -> "RemoteInput":
        """The instance's input, opened in the worker (its groups restored first)."""
        self.call("open", None)
        return RemoteInput(self)

    def receive(self, timeout_millis: int) -> PipedMessage:
        """The next message; its scope, begun by the worker with it, is what the next begin() answers."""
        answer = self.call("recv", None, timeout_millis)
        if answer is None:
            raise pulsar.Timeout()
        msg, *self._begun = answer
        return msg

    def attach_changelog(self, _client, changelog) -> None:
        """The worker's store writes the changelog, with the worker's client."""
        self.call("attach", None, changelog)

    def group(self, group: int) -> "RemoteGroupView":
        return RemoteGroupView(self, group)

    def begin(self, group: int, msg_id: str | None = None) -> bool:
        begun, self._begun = self._begun, None
        if begun is None or begun[:2] != [group, msg_id]:
            return self.call("begin", None, group, msg_id)
        ok, value = begun[2]
        if not ok:
            raise value
        return value

    def commit(self) -> None:
        self.send("commit", None)

    def abort(self) -> None:
        self.send("abort", None)

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


class RemoteInput:
    """Process side: the consumer interface the instance loop uses, on its state's pipe."""

    def __init__(self, store: RemoteStateStore):
        self._store = store

    def receive(self, timeout_millis: int) -> PipedMessage:
        return self._store.receive(timeout_millis)

    def acknowledge(self, msg: PipedMessage) -> None:
        self._store.send("ack", None, msg.key)

    def negative_acknowledge(self, msg: PipedMessage) -> None:
        self._store.send("nack", None, msg.key)

    def close(self) -> None:
        try:
            self._store.call("close", None)
        except (OSError, EOFError):
            pass


class RemoteGroupView:
    """A key group's state calls (StateStore.group's GroupView), served in the worker."""

    def __init__(self, store: RemoteStateStore, group: int):
        self._store = store
        self.group = group

    def __getattr__(self, name: str):
        if name not in STATE_CALLS:
            raise AttributeError(name)
        return functools.partial(self._store.call, name, self.group)
