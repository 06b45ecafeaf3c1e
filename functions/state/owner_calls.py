"""One copy of a function's state on a worker cluster: the state calls of instances that do not run on the state's
owner, carried to it (docs/state.md, "One copy per function on a cluster").

A function without keyedState keeps all its state in one key group (`groups.one_group`). On a cluster one worker
owns that group, the one the assignment names for instance 0; every instance, on that worker or another, makes
its Context state calls to it in **sessions**: a session is one instance thread's calls, served in order by one
thread on the owner, so that a message's scope (begin ... commit, under EFFECTIVELY_ONCE a SQLite transaction
holding the group) belongs to one thread there, as a process instance's calls belong to one worker thread
(functions/runtimes/remote_state.py).

- `OwnedState` (the caller's side, a StateBackend): sends each call with the calls before it that need no
  answer. It remembers the current message's calls, and when the owner cannot be reached, is no longer the
  owner, or has lost the session (its thread ended after SESSION_IDLE_S), it sends them again, in a new
  session, to whichever worker owns the state by then, until REPLAY_S has passed. Under EFFECTIVELY_ONCE the
  replayed begin answers False when the old owner committed the message before it went away (its records are
  in the changelog, from which the new owner restored the applied ids): the replayed calls are then dropped.
  `commit` waits for the owner's answer, which comes once the message's records are persisted in the changelog:
  the caller acks its input only then.
- `OwnerSessions` (the owner's side): the session threads, on the owner's StateStore.
"""

from __future__ import annotations

import base64
import logging
import queue
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, TypeGuard

import requests

from pulsar_autoscale.functions.state.backend import STATE_CALLS, apply_call
from pulsar_autoscale.functions.state.store import NotOwnedError, StateRemovedError, StateStore

log = logging.getLogger(__name__)
SESSION_IDLE_S = 15.0  # a session's thread ends (its open scope rolled back) after this long without a call
REPLAY_S = 60.0  # how long a caller tries to reach the owner (a failover takes the heartbeat timeout + a start)
RETRY_PAUSE_S = 0.2
ONE_WAY = frozenset({"abort"})
RETRY = "RETRY: "  # an answer's error that means "not applied here, send it to the owner again"
PERSISTING = frozenset({"commit", "flush_before_ack"})  # answered once persisted: the caller acks after them
LEASE_LAPSED = "this worker's membership lease lapsed (frozen or cut off from the broker): its state may have moved"
# a process instance's key to its function's state calls on its worker (the worker's REST API may check tokens;
# the instance holds none, and this key opens that one function's state calls and nothing else)
STATE_KEY_HEADER = "X-Pulsar-Autoscale-State-Key"


class OwnerUnavailable(RuntimeError):
    """The call did not reach the state's owner, or reached a worker that is not (or no longer) the owner, or a
    session the owner no longer has: the caller sends the message's calls again."""


class SessionLost(OwnerUnavailable):
    """The owner has no such session (its thread ended, or the owner restarted): the scope is gone."""


# ---- values across HTTP (JSON) -------------------------------------------------------------------------
def encode(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"$b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"$b"}:
        return base64.b64decode(value["$b"])
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


# ---- the caller's side -------------------------------------------------------------------------------------
Transport = Callable[[str, bool, list], list]  # (session, fresh, calls) -> [(ok, value or error text)]


class OwnedState:
    """A StateBackend whose calls run on the owner of the function's state, through `transport` (in the worker:
    functions/cluster/state_owner.py's router, which serves them itself when this worker is the owner)."""

    # in the worker: what its process instances call over HTTP instead (cluster_hosting.host_instances sets it)
    endpoint: StateEndpoint | None = None

    def __init__(self, transport: Transport, replay_s: float = REPLAY_S):
        self._transport = transport
        self._replay_s = replay_s
        self._local = threading.local()

    # per thread: the session, the calls waiting to go, and the current scope's calls (for a replay)
    def _thread(self):
        t = self._local
        if not hasattr(t, "session"):
            t.session, t.fresh, t.pending, t.scope, t.skipped = uuid.uuid4().hex, True, [], None, False
            t.deferred = None
        return t

    def _call(self, op: str, group: int | None, *args, one_way: bool = False):
        t = self._thread()
        if t.deferred is not None:  # a message without EFFECTIVELY_ONCE: its scope opens with its first call
            deferred, t.deferred = t.deferred, None
            if op in ("commit", "abort"):
                return None  # it made no state call: nothing to ask of the owner
            self._call("begin", deferred, None, one_way=True)
        call = [op, group, encode(list(args))]
        if t.skipped and (op in STATE_CALLS or op in ("commit", "abort")):
            # the message was applied by an owner that went away before answering: its calls are done already
            if op in ("commit", "abort"):
                t.skipped, t.scope = False, None
            return 0 if op == "get_counter" or op == "incr_counter" else None
        if op == "begin":
            t.scope = []
        if t.scope is not None:
            t.scope.append(call)
        if op in ("commit", "abort"):
            scope, t.scope = t.scope, None
        else:
            scope = t.scope
        if one_way:
            t.pending.append(call)
            return None
        batch, t.pending = t.pending + [call], []
        deadline = time.monotonic() + self._replay_s
        replaying = False
        while True:
            try:
                answers = self._transport(t.session, t.fresh, batch)
                t.fresh = False
                moved = next((v for ok, v in answers if not ok and isinstance(v, str) and v.startswith(RETRY)), None)
                if moved is not None:  # the owner gave the state up while these ran: they did not apply
                    raise OwnerUnavailable(moved)
                break
            except OwnerUnavailable as exc:
                if time.monotonic() > deadline:
                    raise OwnerUnavailable(
                        f"the owner of this function's state did not answer for {self._replay_s:.0f} s: {exc}"
                    ) from None
                if not replaying:
                    log.info("state owner unavailable (%s): sending the message's state calls again", exc)
                replaying = True
                t.session, t.fresh = uuid.uuid4().hex, True  # the old session's thread rolls its scope back
                if op in ("commit", "abort"):
                    batch = [*(scope or []), call] if scope and scope[0][0] == "begin" else [call]
                else:
                    batch = list(scope) if scope and scope[0][0] == "begin" else [call]
                time.sleep(RETRY_PAUSE_S)
        # the answers of the calls before the last are checked too: a one-way abort's failure is raised here
        for ok, value in answers[:-1]:
            if not ok:
                raise RuntimeError(value)
        if replaying and scope and scope[0][0] == "begin" and batch[0][0] == "begin":
            ok, begun = answers[0]
            if ok and begun is False and op != "begin":
                # applied by the old owner before it went away: nothing more of this message is applied
                if op in ("commit", "abort"):
                    return None
                t.skipped = True
                return 0 if op in ("get_counter", "incr_counter") else None
        ok, value = answers[-1]
        if not ok:
            raise RuntimeError(value)
        return decode(value)

    # StateBackend
    def attach_changelog(self, client, changelog) -> None:
        """The owner's store writes the changelog."""

    def group(self, group: int) -> "OwnedGroup":
        return OwnedGroup(self, group)

    def begin(self, group: int, msg_id: str | None = None) -> bool:
        """Under EFFECTIVELY_ONCE the owner decides (the id may be applied already); otherwise the begin waits
        for the message's first state call, so a message that makes none costs no call to the owner."""
        t = self._thread()
        t.skipped = False
        if msg_id is None:
            t.deferred = group
            return True
        t.deferred = None
        return bool(self._call("begin", group, msg_id))

    def commit(self) -> None:
        """Waits for the owner: it answers once the message's records are persisted in the changelog."""
        self._call("commit", None)

    def abort(self) -> None:
        self._call("abort", None, one_way=True)

    def flush_before_ack(self) -> None:
        self._call("flush_before_ack", None)

    def flush(self, everything: bool = False) -> None:
        t = self._thread()
        if t.pending:  # a commit answered once persisted: only a one-way abort may wait here
            self._call("flush", None, False)

    def when_persisted(self, callback) -> None:
        """Now: commit answered once the changes were persisted."""
        callback()

    def __getattr__(self, name: str):
        if name not in STATE_CALLS:
            raise AttributeError(name)
        return lambda *args: self._call(name, None, *args)


@dataclass(frozen=True)
class StateEndpoint:
    """Where a process instance sends its state calls on a cluster: its worker's `.../state-calls`, with the key
    that opens it for this function (it reaches the child over its start pipe, not its command line or
    environment, which other processes of the instance user could read)."""

    url: str
    key: str = field(repr=False)


def is_state_endpoint(state_path: object) -> TypeGuard[StateEndpoint]:
    """A process instance's state "path" that names its worker's state-calls endpoint (a cluster, not keyedState)."""
    return isinstance(state_path, StateEndpoint)


def http_transport(endpoint: StateEndpoint, http: requests.Session) -> Transport:
    """A process instance's calls, to its own worker's `.../state-calls` (which serves them, as the owner, or
    forwards them to the owner), through `http`: with the worker's TLS trust when it serves HTTPS."""
    http.headers[STATE_KEY_HEADER] = endpoint.key
    url = endpoint.url

    def send(session: str, fresh: bool, calls: list) -> list:
        try:
            resp = http.post(url, json={"session": session, "fresh": fresh, "calls": encode(calls)}, timeout=60)
        except requests.RequestException as exc:
            raise OwnerUnavailable(f"{url}: {type(exc).__name__}") from None
        if resp.status_code == 409:
            raise SessionLost(resp.text)
        if resp.status_code != 200:
            raise OwnerUnavailable(f"{url} answered {resp.status_code}: {resp.text[:200]}")
        return [tuple(a) for a in resp.json()["answers"]]

    return send


class OwnedGroup:
    def __init__(self, state: OwnedState, group: int):
        self._state, self.group = state, group

    def __getattr__(self, name: str):
        if name not in STATE_CALLS:
            raise AttributeError(name)
        return lambda *args: self._state._call(name, self.group, *args)


# ---- the owner's side ----------------------------------------------------------------------------------------
class _Session:
    def __init__(self, store: StateStore, name: str, on_end: Callable[[], None], leased: Callable[[], bool]):
        self._store, self._leased = store, leased
        self._inbox: queue.Queue = queue.Queue()
        self._on_end = on_end
        self.ended = False
        threading.Thread(target=self._serve, name=f"state-session-{name}", daemon=True).start()

    def run(self, calls: list, timeout_s: float) -> list:
        answer: queue.Queue = queue.Queue(maxsize=1)
        self._inbox.put((calls, answer))
        try:
            return answer.get(timeout=timeout_s)
        except queue.Empty:
            raise OwnerUnavailable("the state call took too long on the owner") from None

    def end(self) -> None:
        self._inbox.put(None)

    def _serve(self) -> None:
        skipping = False  # a begin answered False (applied already): its message's calls are not applied
        try:
            while True:
                try:
                    item = self._inbox.get(timeout=SESSION_IDLE_S)
                except queue.Empty:
                    item = None
                if item is None:
                    return
                calls, answer = item
                answers = []
                for op, group, args in calls:
                    if op == "begin":
                        skipping = False
                    if skipping and (op in STATE_CALLS or op in ("commit", "abort")):
                        answers.append((True, 0 if op in ("incr_counter", "get_counter") else None))
                        skipping = op not in ("commit", "abort")
                        continue
                    ok, value = _apply(self._store, op, group, args)
                    if ok and op in PERSISTING and not self._leased():
                        # persisted, but this worker may have been frozen past its lease meanwhile and its state
                        # taken over (restored without these records): the caller sends the message again to
                        # whoever owns the state now, rather than ack a message the new owner never saw
                        ok, value = False, f"{RETRY}{LEASE_LAPSED}"
                    if op == "begin" and ok and value is False:
                        skipping = True
                    answers.append((ok, value))
                answer.put(answers)
        finally:
            try:
                self._store.abort()  # a scope the caller never finished: EFFECTIVELY_ONCE rolls back, the group is free
            except Exception:
                log.exception("rolling back an abandoned state session")
            self.ended = True
            self._on_end()
            while True:  # calls that came after the end: their caller sends them again
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    return
                if item is not None:
                    item[1].put([(False, "session ended")])


def _apply(store: StateStore, op: str, group: int | None, args: list) -> tuple[bool, Any]:
    try:
        args = decode(args)
        if op == "commit":
            store.commit()
            store.flush()  # answered once persisted: the caller acks its input after this answer
            return True, None
        if op == "begin":
            if group is None:
                raise ValueError("begin names no key group")
            return True, store.begin(group, *args)
        return True, encode(apply_call(store, op, group, args))
    except (NotOwnedError, StateRemovedError, sqlite3.ProgrammingError) as exc:  # released, deleted or closed here
        return False, f"{RETRY}{type(exc).__name__}: {exc}"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"


class OwnerSessions:
    """The sessions of one function's state on its owner."""

    def __init__(self, store: StateStore, leased: Callable[[], bool] = lambda: True):
        """`leased`: whether this worker still surely owns the state (the cluster membership's lease)."""
        self.store, self._leased = store, leased
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def run(self, session: str, fresh: bool, calls: list, timeout_s: float = 30.0) -> list:
        with self._lock:
            s = self._sessions.get(session)
            if s is None or s.ended:
                if not fresh:
                    raise SessionLost(f"no state session {session} here (it ended, or this worker restarted)")
                s = self._sessions[session] = _Session(self.store, session[:8], lambda: self._forget(session), self._leased)
        answers = s.run(calls, timeout_s)
        if answers == [(False, "session ended")]:
            raise SessionLost(f"state session {session} ended")
        return answers

    def _forget(self, session: str) -> None:
        with self._lock:
            s = self._sessions.get(session)
            if s is not None and s.ended:
                del self._sessions[session]

    def end_all(self) -> list[_Session]:
        """This worker is no longer the owner: every session ends (open scopes roll back; callers replay)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            s.end()
        return sessions


def wait_ended(sessions: list[_Session], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while any(not s.ended for s in sessions):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
