"""Assignments: the leader's placement snapshots on the assignment topic, fenced by epoch.

The leader publishes the whole placement (small: one worker id per instance) each time it
changes, with its leader epoch. Every worker reads the topic from the start and keeps the
latest snapshot whose epoch is at least the highest it has seen, so a deposed leader that
writes late is ignored by everyone, and a new leader starts from what the old one wrote
(a rebalance it began is finished from the topic).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field

import pulsar

from pulsar_autoscale.functions.cluster.scheduler import Assignment
from pulsar_autoscale.functions.cluster.tailer import TopicTailer
from pulsar_autoscale.functions.cluster.topics import ClusterTopics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    epoch: int = 0
    leader: str = ""
    assignment: Assignment = field(default_factory=dict)
    rebalanced: tuple[str, ...] = ()  # rebalance request ids already carried out
    unplaced: int = 0  # instances the cluster had no capacity for

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "epoch": self.epoch,
                "leader": self.leader,
                "rebalanced": list(self.rebalanced),
                "unplaced": self.unplaced,
                "assignment": {f: {str(i): w for i, w in p.items()} for f, p in self.assignment.items()},
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Snapshot":
        d = json.loads(data)
        return cls(
            d["epoch"],
            d["leader"],
            {f: {int(i): w for i, w in p.items()} for f, p in d["assignment"].items()},
            tuple(d.get("rebalanced", ())),
            d.get("unplaced", 0),
        )

    def owner(self, fqfn: str, instance_id: int) -> str | None:
        return self.assignment.get(fqfn, {}).get(instance_id)

    def mine(self, worker_id: str) -> dict[str, set[int]]:
        return {f: {i for i, w in p.items() if w == worker_id} for f, p in self.assignment.items()}


class AssignmentTailer:
    def __init__(self, client: pulsar.Client, topics: ClusterTopics, worker_id: str):
        self._snapshot = Snapshot()
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self.ignored = 0  # snapshots from deposed leaders
        self._producer = client.create_producer(topics.assignments, batching_enabled=False)
        self._tailer = TopicTailer(client, topics.assignments, self._apply, f"assignments-{worker_id}", self._producer)

    @property
    def caught_up(self) -> threading.Event:
        return self._tailer.caught_up

    def current(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def _apply(self, msg: pulsar.Message) -> None:
        snap = Snapshot.from_json(msg.data())
        with self.changed:
            if snap.epoch < self._snapshot.epoch:
                self.ignored += 1
                log.warning(
                    "ignored an assignment from deposed leader %s (epoch %d < %d)", snap.leader, snap.epoch, self._snapshot.epoch
                )
                return
            self._snapshot = snap
            self.changed.notify_all()

    def publish(self, snap: Snapshot) -> None:
        """Leader only: the snapshot takes effect when read back, like everyone else's view."""
        self._producer.send(snap.to_json())

    def wait_for(self, predicate, timeout_s: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: predicate(self._snapshot), timeout=timeout_s)

    def close(self) -> None:
        self._tailer.close()
        self._producer.close()
