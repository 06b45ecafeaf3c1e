"""The owner of a function's state on a cluster, for functions without keyedState (docs/state.md, "One copy per
function on a cluster").

Such a function keeps all its state in one key group (state/groups.one_group). The worker that the assignment names
for the function's instance 0 owns that group: it opens it (restored from the changelog, its own group file's
snapshot and the changelog's tail, or the whole changelog when it has no clean file) at the first call after it
became the owner, and serves every instance's state calls in sessions (state/owner_calls.py), its own instances' in
the process and the other workers' over `POST /admin/v3/functions/T/NS/F/state-calls?scope=local`. When the
assignment moves instance 0 elsewhere (scale, rebalance, failover after kill -9, SIGTERM, a worker frozen past the
heartbeat timeout), it ends its sessions (open scopes roll back; their callers send them again to the next owner)
and releases the group (flush and snapshot; after kill -9 the next owner replays the changelog). The new owner
waits HANDOVER_S after it first saw itself named before it restores, so that the old owner's last commits are in
the changelog first. querystate/putstate answer on the owner; any other worker asks it (functions/cluster/peers.py).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import quote

import requests

from pulsar_autoscale.functions.model.errors import NotFound
from pulsar_autoscale.functions.state.changelog import changelog_of
from pulsar_autoscale.functions.state.groups import one_group
from pulsar_autoscale.functions.state.owner_calls import (
    LEASE_LAPSED,
    OwnerSessions,
    OwnerUnavailable,
    SessionLost,
    StateEndpoint,
    wait_ended,
)
from pulsar_autoscale.functions.state.store import StateStore

if TYPE_CHECKING:
    from pulsar_autoscale.functions.cluster.assignments import AssignmentTailer
    from pulsar_autoscale.functions.cluster.membership import MembershipManager

log = logging.getLogger(__name__)
HANDOVER_S = 1.0  # a new owner's wait before it restores: the old owner's last commits reach the changelog
CALL_TIMEOUT_S = 30.0  # one batch of calls on the owner (an EFFECTIVELY_ONCE begin waits for the group's lock)
NOT_OWNER = 421
SESSION_GONE = 409


class _Owned:
    """This worker's ownership of one function's state group."""

    def __init__(self, store: StateStore, leased: Callable[[], bool]):
        self.store = store
        self.sessions = OwnerSessions(store, leased)
        self.lock = threading.Lock()
        self.open = False
        self.seen_since = time.monotonic()


class StateOwnerRouter:
    """Every function's state calls on this worker: served here for the functions whose state this worker owns,
    forwarded to the owner for the others."""

    def __init__(
        self,
        me: str,
        url: str,
        assignments: AssignmentTailer,
        membership: MembershipManager,
        http: requests.Session,
        hosted: Callable[[str], Any],
        client: Callable[[], object],
    ):
        """`hosted(fqfn)`: the worker's HostedFunction (config, state store) or None; `client`: the worker's
        Pulsar client (the changelog)."""
        self.me, self.url = me, url.rstrip("/")
        self._assignments = assignments
        self._membership = membership
        self._http = http
        self._hosted = hosted
        self._client = client
        self._owned: dict[str, _Owned] = {}
        self._lock = threading.Lock()
        self._keys = secrets.token_bytes(32)  # the process instances' state keys: per function, this run only
        log.warning(
            "%s: the state of functions without keyedState has one copy per function on this cluster, "
            "owned by the worker assigned instance 0 and restored from the changelog; a worker's local copy "
            'from before (one per worker) is no longer read (docs/state.md, "One copy per function on a '
            'cluster")',
            me,
        )

    def endpoint(self, fqfn: str) -> StateEndpoint:
        """This worker's state-calls URL for fqfn and the key that opens it: its process instances' transport."""
        return StateEndpoint(self.url + state_calls_path(fqfn), self._key(fqfn))

    def _key(self, fqfn: str) -> str:
        return hmac.new(self._keys, fqfn.encode(), hashlib.sha256).hexdigest()

    def opens(self, fqfn: str, key: str) -> bool:
        """Whether `key` is this worker's state key of fqfn (a process instance of that function here)."""
        return hmac.compare_digest(key, self._key(fqfn))

    def owner(self, fqfn: str) -> str | None:
        return self._assignments.current().owner(fqfn, 0)

    # ---- the callers: instances here, and other workers over HTTP ------------------------------------------
    def handle(self, fqfn: str, session: str, fresh: bool, calls: list) -> list:
        """A batch of one instance thread's state calls (OwnedState's transport)."""
        owner = self.owner(fqfn)
        if owner == self.me:
            return self.serve(fqfn, session, fresh, calls)
        self.follow(fqfn)
        if owner is None:
            raise OwnerUnavailable(f"{fqfn}: no worker is assigned instance 0, the owner of the function's state")
        member = next((m for m in self._membership.alive() if m.worker_id == owner), None)
        if member is None:
            raise OwnerUnavailable(f"{fqfn}: the state's owner {owner} is not a live member")
        try:
            resp = self._http.post(
                f"{member.url}/admin/v3/functions/{fqfn}/state-calls",
                params={"scope": "local"},
                json={"session": session, "fresh": fresh, "calls": calls},
                timeout=CALL_TIMEOUT_S + 5,
            )
        except requests.RequestException as exc:
            raise OwnerUnavailable(f"{fqfn}: the state's owner {owner}: {type(exc).__name__}") from None
        if resp.status_code == SESSION_GONE:
            raise SessionLost(resp.text)
        if resp.status_code != 200:
            raise OwnerUnavailable(f"{fqfn}: the state's owner {owner} answered {resp.status_code}: {resp.text[:200]}")
        return [tuple(a) for a in resp.json()["answers"]]

    def serve(self, fqfn: str, session: str, fresh: bool, calls: list) -> list:
        """Run calls here, as the owner (OwnerUnavailable: this worker is not the owner, or not ready)."""
        owned = self._ensure_open(fqfn)
        answers = owned.sessions.run(session, fresh, calls, CALL_TIMEOUT_S)
        if self.owner(fqfn) != self.me:  # the ownership moved while they ran: they stand (persisted before it moved)
            self.follow(fqfn)
        return answers

    def http_answer(self, fqfn: str, body: dict, local: bool) -> tuple[int, dict]:
        """POST .../state-calls: with scope=local from another worker (served here, as the owner, or 421), without
        from a process instance of this worker (served here or forwarded to the owner)."""
        try:
            serve = self.serve if local else self.handle
            answers = serve(fqfn, body["session"], bool(body.get("fresh")), body["calls"])
        except SessionLost as exc:
            return SESSION_GONE, {"reason": str(exc)}
        except OwnerUnavailable as exc:
            return NOT_OWNER, {"reason": str(exc)}
        return 200, {"answers": answers}

    def local_store(self, fqfn: str) -> StateStore:
        """querystate/putstate: the store here when this worker owns the function's state, restored; NotFound else
        (the admin API then asks the other workers)."""
        try:
            return self._ensure_open(fqfn).store
        except OwnerUnavailable as exc:
            raise NotFound(str(exc)) from None

    # ---- ownership ------------------------------------------------------------------------------------------
    def _ensure_open(self, fqfn: str) -> _Owned:
        if not self._membership.holds_lease():
            raise OwnerUnavailable(f"{fqfn}: {self.me}: {LEASE_LAPSED}")
        if self.owner(fqfn) != self.me:
            self.follow(fqfn)
            raise OwnerUnavailable(f"{fqfn}: {self.me} does not own the function's state (instance 0 is on {self.owner(fqfn)})")
        fn = self._hosted(fqfn)
        if fn is None:
            raise OwnerUnavailable(f"{fqfn}: not hosted on {self.me} yet")
        with self._lock:
            owned = self._owned.get(fqfn)
            if owned is None or owned.store is not fn.state:
                owned = self._owned[fqfn] = _Owned(fn.state, self._membership.holds_lease)
        if owned.open:
            return owned
        with owned.lock:
            if not owned.open:
                wait = HANDOVER_S - (time.monotonic() - owned.seen_since)
                if wait > 0:
                    time.sleep(wait)
                cfg = fn.config
                changelog = changelog_of(cfg)
                owned.store.attach_changelog(self._client(), changelog)
                stats = owned.store.open({one_group(cfg.numKeyGroups)}, restore=True, client=self._client(), changelog=changelog)
                log.info(
                    "%s: %s owns the function's state now: restored %d records in %.2f s (%d group from its snapshot)",
                    fqfn,
                    self.me,
                    stats.records,
                    stats.seconds,
                    stats.from_snapshot,
                )
                owned.open = True
        if self.owner(fqfn) != self.me:
            self.follow(fqfn)
            raise OwnerUnavailable(f"{fqfn}: the ownership of the state moved while it was restored here")
        return owned

    def follow(self, fqfn: str) -> None:
        """The assignment changed: give the function's state up when this worker no longer owns it."""
        if self.owner(fqfn) == self.me:
            with self._lock:
                if fqfn not in self._owned:
                    fn = self._hosted(fqfn)
                    if fn is not None:
                        self._owned[fqfn] = _Owned(fn.state, self._membership.holds_lease)
            return
        with self._lock:
            owned = self._owned.pop(fqfn, None)
        if owned is None:
            return
        threading.Thread(target=self._give_up, args=(fqfn, owned), name=f"state-give-up-{fqfn}", daemon=True).start()

    def _give_up(self, fqfn: str, owned: _Owned) -> None:
        ended = owned.sessions.end_all()
        if not wait_ended(ended, CALL_TIMEOUT_S):
            log.warning(
                "%s: state sessions still running %.0f s after this worker stopped owning the state", fqfn, CALL_TIMEOUT_S
            )
        with owned.lock:
            if not owned.open:
                return
            owned.open = False
            cfg_groups = {one_group(owned.store.num_key_groups)}
            try:
                owned.store.release(cfg_groups)
                log.info("%s: %s gave the function's state up (released, snapshot in its group file)", fqfn, self.me)
            except Exception as exc:  # the broker is away: the file stays unclean, and a later open replays it all
                owned.store.release(cfg_groups, snapshot=False)
                log.warning("%s: giving the function's state up without a snapshot: %s", fqfn, exc)

    def forget(self, fqfn: str) -> None:
        """The function was deleted."""
        with self._lock:
            owned = self._owned.pop(fqfn, None)
        if owned is not None:
            owned.sessions.end_all()


def state_calls_path(fqfn: str) -> str:
    return f"/admin/v3/functions/{quote(fqfn, safe='/')}/state-calls"
