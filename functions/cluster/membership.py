"""Membership: who is in the cluster, and alive, from heartbeats on the membership topic.

Every worker publishes a heartbeat every `heartbeat_interval_s` (its REST URL, capacity,
leader epoch when it leads, the instances it runs and their busy time) and
reads every other worker's. A worker is dead `heartbeat_timeout_s` after its last heartbeat, or
at once when it says goodbye. Liveness is measured on the reader's own monotonic clock; only
while catching up on history is the broker's publish time used, so that a heartbeat of a worker
that died long ago does not count.

A worker's own **lease** (`holds_lease`) is the other side of that rule: the others count it alive until
`heartbeat_timeout_s` after they read its last heartbeat, which is no earlier than the moment it began to send
it. So while less than `heartbeat_timeout_s` has passed since then, no other worker can have declared it dead;
after that (it was frozen, or cut off from the broker) what it owns may have moved, and it must not answer as
an owner until a heartbeat goes through again.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable, cast

import pulsar

from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.functions.cluster.tailer import TopicTailer
from pulsar_autoscale.functions.cluster.topics import ClusterTopics

log = logging.getLogger(__name__)
BUSY_SMOOTHING = 0.5
# A heartbeat's send gives up after this many heartbeat timeouts (the client's default is 30 s): one that lands
# later than the timeout no longer keeps the lease, and a stop with the broker gone ends this soon.
SEND_TIMEOUTS = 2


@dataclass(frozen=True)
class LocalReport:
    """What a heartbeat says about the worker that sends it, beyond its identity."""

    running: tuple[str, ...] = ()  # "tenant/ns/name:i" of instances that are receiving
    busy_s: float = 0.0  # cumulative busy seconds of its instances
    leaving: bool = False  # SIGTERM: move my instances away, then I go
    leader_epoch: int | None = None
    hosted: tuple[str, ...] = ()  # every instance it runs, also one still starting (restoring state)


@dataclass(frozen=True)
class Member:
    worker_id: str
    url: str
    capacity: int
    incarnation: str
    seen: float  # time.monotonic() of the last heartbeat
    leaving: bool = False
    leader_epoch: int | None = None
    running: frozenset = frozenset()
    busy_s: float = 0.0
    busy_rate: float = 0.0  # busy seconds per second, smoothed
    hosted: frozenset = frozenset()  # running or starting ("running" of a worker that does not say)

    def view(self) -> dict:
        """Pulsar's WorkerInfo fields, plus ours."""
        host, _, port = self.url.removeprefix("http://").removeprefix("https://").rpartition(":")
        return {
            "workerId": self.worker_id,
            "workerHostname": host,
            "port": int(port or 0),
            "url": self.url,
            "capacity": self.capacity,
            "leaving": self.leaving,
            "busy": round(self.busy_rate, 3),
        }


class JoinTimeout(PulsarAutoscaleError):
    """The membership topic could not be read or written in time."""


class MembershipManager:
    def __init__(
        self,
        client: pulsar.Client,
        topics: ClusterTopics,
        worker_id: str,
        url: str,
        capacity: int,
        report: Callable[[], LocalReport],
        heartbeat_interval_s: float = 0.5,
        heartbeat_timeout_s: float = 2.0,
    ):
        self.worker_id, self.url, self.capacity = worker_id, url, capacity
        self.incarnation = uuid.uuid4().hex[:12]
        self.interval_s, self.timeout_s = heartbeat_interval_s, heartbeat_timeout_s
        self._report = report
        self._members: dict[str, Member] = {}
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self._producer = client.create_producer(
            topics.membership,
            block_if_queue_full=True,
            batching_enabled=False,
            send_timeout_millis=max(int(SEND_TIMEOUTS * heartbeat_timeout_s * 1000), 1000),
        )
        self._closing = threading.Event()
        self._lease_from: float | None = None  # when the last heartbeat that went through began to be sent
        self._tailer = TopicTailer(client, topics.membership, self._apply, f"membership-{worker_id}", self._producer)
        self._thread = threading.Thread(target=self._beat, name="membership-heartbeat", daemon=True)

    # ---- joining ----------------------------------------------------------------------------------
    def join(self, timeout_s: float = 15.0) -> None:
        """Read the members so far, announce ourselves and wait until our own heartbeat is read back."""
        if not self._tailer.caught_up.wait(timeout_s):
            raise JoinTimeout(f"membership topic not readable within {timeout_s:.0f}s")
        self._send(LocalReport())
        with self.changed:
            if not self.changed.wait_for(self._announced, timeout=timeout_s):
                raise JoinTimeout(f"{self.worker_id}: own heartbeat not read back within {timeout_s:.0f}s")
        self._thread.start()
        log.info("%s joined the cluster", self.worker_id)

    def _announced(self) -> bool:
        me = self._members.get(self.worker_id)
        return me is not None and me.incarnation == self.incarnation  # not a previous incarnation's heartbeat

    # ---- heartbeats -----------------------------------------------------------------------------
    def _send(self, report: LocalReport, gone: bool = False) -> None:
        body = {
            "workerId": self.worker_id,
            "url": self.url,
            "capacity": self.capacity,
            "incarnation": self.incarnation,
            "leaving": report.leaving,
            "leaderEpoch": report.leader_epoch,
            "running": list(report.running),
            "hosted": list(report.hosted),
            "busy": report.busy_s,
            "gone": gone,
        }
        started = time.monotonic()
        self._producer.send(json.dumps(body).encode())
        self._lease_from = None if gone else started

    def holds_lease(self) -> bool:
        """Whether no other worker can have declared this one dead yet (see the module's docstring)."""
        lease_from = self._lease_from
        return lease_from is not None and time.monotonic() - lease_from < self.timeout_s

    def _beat(self) -> None:
        while not self._closing.wait(self.interval_s):
            try:
                self._send(self._report())
            except Exception as exc:  # a broker hiccup: the next beat retries
                log.warning("heartbeat failed: %s", exc)

    def beat_now(self) -> None:
        """An extra heartbeat, e.g. right after a change that others wait for (make-before-break)."""
        self._send(self._report())

    def _apply(self, msg: pulsar.Message) -> None:
        body = json.loads(msg.data())
        now = time.monotonic()
        age_s = max(time.time() - msg.publish_timestamp() / 1000.0, 0.0)
        # the tailer's thread may apply a record before the constructor has stored the tailer: not caught up
        caught_up = getattr(self, "_tailer", None) is not None and self._tailer.caught_up.is_set()
        with self.changed:
            inc = body["incarnation"]
            if not caught_up and age_s > self.timeout_s:
                return  # history: that worker may be long gone
            wid = body["workerId"]
            if body.get("gone"):
                if wid in self._members and self._members[wid].incarnation == inc:
                    del self._members[wid]
                self.changed.notify_all()
                return
            seen = now - (age_s if not caught_up else 0.0)
            prev = self._members.get(wid)
            rate = 0.0
            if prev is not None and prev.incarnation == inc and seen > prev.seen:
                sample = max(body["busy"] - prev.busy_s, 0.0) / (seen - prev.seen)
                rate = BUSY_SMOOTHING * sample + (1 - BUSY_SMOOTHING) * prev.busy_rate
            self._members[wid] = Member(
                wid,
                body["url"],
                body["capacity"],
                inc,
                seen,
                body.get("leaving", False),
                body.get("leaderEpoch"),
                frozenset(body.get("running", ())),
                body["busy"],
                rate,
                frozenset(body.get("hosted", body.get("running", ()))),
            )
            self.changed.notify_all()

    # ---- the view ---------------------------------------------------------------------------------
    def _alive_locked(self) -> list[Member]:
        now = time.monotonic()
        return [m for m in self._members.values() if now - m.seen <= self.timeout_s]

    def alive(self) -> list[Member]:
        with self._lock:
            return sorted(self._alive_locked(), key=lambda m: m.worker_id)

    def get(self, worker_id: str) -> Member | None:
        with self._lock:
            return next((m for m in self._alive_locked() if m.worker_id == worker_id), None)

    def leader(self) -> Member | None:
        """The live member with the highest leader epoch in its heartbeat."""
        leaders = [m for m in self.alive() if m.leader_epoch is not None]
        return max(leaders, key=lambda m: cast(int, m.leader_epoch), default=None)  # not None: filtered above

    def close(self, report: LocalReport) -> None:
        """Say goodbye, so the others need not wait for the heartbeat timeout."""
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(2)
        try:
            self._send(replace(report, leaving=True), gone=True)
            self._producer.flush()
        except Exception as exc:
            log.warning("goodbye heartbeat failed: %s", exc)
        self._tailer.close()
        self._producer.close()
