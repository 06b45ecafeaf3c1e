"""The protocol between a spread keyedState function's front and its instances, over their route topics.

A live migration keeps migration.migrate's protocol with `RoutedStores`: release(src, groups) is a
RELEASE marker in src's route topic after the last forwarded record of those groups (src puts them
down when it reaches it: flush, snapshot, forget, then answers on the control topic); open(dst,
groups) an OPEN marker in dst's route topic (dst restores them from the changelog and answers); a
PREPARE marker asks for a pre-copy. Every wait is bounded. The instance's side is
functions/keyed/route_input.py.

Each front has an epoch, one above the highest saved with the assignment, announced to every instance (an EPOCH
marker) before it routes anything. Its markers carry it, and an instance refuses a marker of an older epoch: a front
frozen (SIGSTOP, a long pause) while its migration was under way, which wakes after another front took over, cannot
release or open groups under the new front's feet. Its saved assignments lose to the new front's as well
(functions/keyed/cluster.py reads the highest epoch first).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import pulsar

from pulsar_autoscale.functions.keyed.migration import InstanceStateStores, MigrationError
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.state.changelog import state_topic
from pulsar_autoscale.functions.state.store import StateStore

ROUTE_SUBSCRIPTION = "keyed-route"
MARKER_TIMEOUT_S = 60.0  # an instance may have to start on another worker and restore first
PREPARE_TIMEOUT_S = 300.0  # a pre-copy replays the whole changelog (500 MB: about 10 s here); best effort
RECHECK_S = 0.5  # how often a wait for answers asks again which instances the function still has
# properties of a forwarded record and of a marker
ORIGINAL_ID, ORIGINAL_TOPIC, ORIGINAL_PUBLISH = "kg-mid", "kg-topic", "kg-pub"
OP, GROUPS, NONCE, INSTANCE, DUTY, RATE = "kg-op", "kg-groups", "kg-nonce", "kg-instance", "kg-duty", "kg-mbps"
EPOCH = "kg-epoch"
RELEASE, OPEN, PREPARE, ANNOUNCE = "release", "open", "prepare", "epoch"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyedTopics:
    """The topics of one keyedState function on a cluster, named in one place (its changelog: changelog_of)."""

    tenant: str
    namespace: str
    name: str
    state_id: str = ""

    @classmethod
    def of(cls, cfg: FunctionConfig) -> "KeyedTopics":
        return cls(cfg.tenant, cfg.namespace, cfg.name, cfg.stateId)

    def _topic(self, what: str) -> str:
        return state_topic(self.tenant, self.namespace, self.name, self.state_id, what)

    def route(self, instance_id: int) -> str:
        return self._topic(f"route-{instance_id}")

    @property
    def control(self) -> str:
        return self._topic("control")

    @property
    def assignment(self) -> str:
        return self._topic("assignment")


class RoutedStores:
    """The route topics of instances anywhere in the cluster: markers in them, answers on the control topic
    (a front's epoch stamps its markers: FrontMarkers). The local stores (this worker's instances) answer
    everything else."""

    def __init__(
        self, client: Callable[[], pulsar.Client], topics: KeyedTopics, local: InstanceStateStores, route_subscription_type: str
    ):
        self._client, self._topics, self.local = client, topics, local
        self._subscription_type = route_subscription_type
        self._producers: dict[int, pulsar.Producer] = {}
        self._replies: dict[str, dict] = {}
        self._cond = threading.Condition()
        self._listener: pulsar.Consumer | None = None
        self._lock = threading.Lock()
        self._called_off = False
        # whether the function still has this instance (its current parallelism); the front sets it
        self.wanted: Callable[[int], bool] = lambda _i: True

    # ---- the front's side --------------------------------------------------------------------------
    def producer(self, instance_id: int) -> pulsar.Producer:
        """The one producer of an instance's route topic (records and markers, in order). Its subscription
        is made first, from the earliest message, so nothing forwarded before the instance runs is lost."""
        with self._lock:
            p = self._producers.get(instance_id)
            if p is None:
                topic = self._topics.route(instance_id)
                self._client().subscribe(
                    topic,
                    ROUTE_SUBSCRIPTION,
                    consumer_type=getattr(pulsar.ConsumerType, self._subscription_type),
                    initial_position=pulsar.InitialPosition.Earliest,
                ).close()
                p = self._producers[instance_id] = self._client().create_producer(
                    topic, batching_enabled=False, block_if_queue_full=True, send_timeout_millis=0
                )
            return p

    def listen(self) -> None:
        """Start taking answers (before the first marker is sent)."""
        with self._lock:
            if self._listener is None:
                self._listener = self._client().subscribe(
                    self._topics.control,
                    f"front-{uuid.uuid4().hex[:12]}",
                    consumer_type=pulsar.ConsumerType.Exclusive,
                    initial_position=pulsar.InitialPosition.Latest,
                    message_listener=self._on_reply,
                )

    def _on_reply(self, consumer, msg) -> None:
        consumer.acknowledge(msg)
        try:
            reply = json.loads(msg.data())
        except ValueError:
            return
        with self._cond:
            self._replies[reply.get("nonce")] = reply
            self._cond.notify_all()

    def announce(self, epoch: int, instance_ids: set[int]) -> None:
        """A new front's epoch, first in each instance's route topic: from then on the instance refuses an older
        front's markers. Not answered: an instance that never reads it learns the epoch from the next marker."""
        for instance_id in sorted(instance_ids):
            self.producer(instance_id).send(b"", properties={OP: ANNOUNCE, EPOCH: str(epoch), INSTANCE: str(instance_id)})

    def ask_all(
        self, op: str, groups: dict[int, set[int]], epoch: int, timeout_s: float = MARKER_TIMEOUT_S, **extra: str
    ) -> None:
        """A marker to each instance, then wait for every answer: the instances work in parallel."""
        asked: dict[str, tuple[int, set[int]]] = {}
        for instance_id, gs in groups.items():
            nonce = uuid.uuid4().hex
            self.producer(instance_id).send(
                b"",
                properties={
                    OP: op,
                    GROUPS: ",".join(map(str, sorted(gs))),
                    NONCE: nonce,
                    INSTANCE: str(instance_id),
                    EPOCH: str(epoch),
                    **extra,
                },
            )
            asked[nonce] = (instance_id, gs)
        # An OPEN or PREPARE for an instance the function no longer has (scaled in, maybe drained already) is
        # not waited for: its marker stays first in its route topic, so whoever runs the instance opens the groups
        # before any of their records, and the next migration moves them off it (RELEASE). A RELEASE is waited
        # for: its instance still owns the groups, and runs until they have left (cluster surplus instances).
        skippable = op in (OPEN, PREPARE)

        def settled() -> bool:
            return self._called_off or all(n in self._replies or (skippable and not self.wanted(asked[n][0])) for n in asked)

        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not settled() and time.monotonic() < deadline:
                self._cond.wait(min(RECHECK_S, max(deadline - time.monotonic(), 0)))
            if self._called_off:
                raise MigrationError(f"{self._topics.name}: the {op} was called off (the function is deleted)")
            replies = {n: self._replies.pop(n, None) for n in asked}
        gone = {n for n, r in replies.items() if r is None and skippable and not self.wanted(asked[n][0])}
        if gone:
            log.info(
                "%s: not waiting for the %s of instances %s: the function no longer has them",
                self._topics.name,
                op,
                sorted(asked[n][0] for n in gone),
            )
        missing = [asked[n] for n, r in replies.items() if r is None and n not in gone]
        if missing:
            raise MigrationError(
                f"{self._topics.name}: no confirmation of the {op} within {timeout_s:.0f} s from "
                + ", ".join(f"instance {i} (key groups {sorted(gs)})" for i, gs in missing)
            )
        failed = [f"instance {asked[n][0]}: {r['error']}" for n, r in replies.items() if r and r.get("error")]
        if failed:
            raise MigrationError(f"{self._topics.name}: the {op} failed on " + "; ".join(failed))

    def call_off(self) -> None:
        """The function is deleted: an answer waited for (an instance that will never start) is not awaited."""
        with self._cond:
            self._called_off = True
            self._cond.notify_all()

    def flush_front(self) -> None:
        """Every forward sent so far persisted (and its input record acked by its callback)."""
        with self._lock:
            producers = list(self._producers.values())
        for p in producers:
            p.flush()

    def take_front(self) -> Callable[[], None]:
        """Take the front's route producers and answer listener out (a front that starts after this opens its
        own) and return what closes them: broker round trips, for the caller to run outside its locks (a flush
        waits for the broker as long as it is down)."""
        with self._lock:
            producers, self._producers = list(self._producers.values()), {}
            listener, self._listener = self._listener, None

        def close() -> None:
            for p in producers:
                try:
                    p.flush()
                    p.close()
                except pulsar.PulsarException:
                    pass
            if listener is not None:
                try:
                    listener.unsubscribe()
                except pulsar.PulsarException:
                    listener.close()

        return close

    # ---- this worker's instances (worker.py uses these, as with migration.InstanceStateStores) --------
    def store(self, instance_id: int) -> StateStore:
        return self.local.store(instance_id)

    def restore(self, instance_id: int) -> None:
        self.local.restore(instance_id)

    def forget(self, instance_ids: set[int] | None = None) -> None:
        self.local.forget(instance_ids)

    def snapshot(self, instance_ids: set[int]) -> None:
        self.local.snapshot(instance_ids)

    def close_clean(self) -> None:
        self.take_front()()
        self.local.close_clean()


@dataclass(frozen=True)
class FrontMarkers:
    """migration.InstanceStores for one front: RoutedStores' markers stamped with the front's epoch."""

    stores: RoutedStores
    epoch: int

    def prepare_all(self, groups: dict[int, set[int]], duty: float, mb_per_s: float | None) -> None:
        self.stores.ask_all(PREPARE, groups, self.epoch, PREPARE_TIMEOUT_S, **{DUTY: str(duty), RATE: str(mb_per_s or "")})

    def release_all(self, groups: dict[int, set[int]]) -> None:
        self.stores.ask_all(RELEASE, groups, self.epoch)

    def open_all(self, groups: dict[int, set[int]]) -> None:
        self.stores.ask_all(OPEN, groups, self.epoch)
