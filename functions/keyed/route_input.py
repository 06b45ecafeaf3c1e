"""What an instance of a spread keyedState function receives: its route topic, markers answered in between.

Each instance, wherever it runs, consumes its route topic with one consumer (`RouteInput`), so a key's
records stay in order end to end, and EFFECTIVELY_ONCE dedupes on the original message id (a record
forwarded twice applies once). The markers are functions/keyed/protocol.py's.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import pulsar

from pulsar_autoscale.broker.lite.nack_redelivery import fence_nacks
from pulsar_autoscale.broker.lite.stalls import StallFence, fence_stalls
from pulsar_autoscale.broker.profile import BrokerProfile
from pulsar_autoscale.functions.instance.instance import NACK_REDELIVERY_DELAY_MS
from pulsar_autoscale.functions.keyed.migration import InstanceStateStores
from pulsar_autoscale.functions.keyed.protocol import (
    ANNOUNCE,
    DUTY,
    EPOCH,
    GROUPS,
    NONCE,
    OP,
    OPEN,
    ORIGINAL_ID,
    ORIGINAL_PUBLISH,
    ORIGINAL_TOPIC,
    PREPARE,
    RATE,
    RELEASE,
    ROUTE_SUBSCRIPTION,
    KeyedTopics,
)
from pulsar_autoscale.functions.keyed.record_scheduling import RecordScheduler
from pulsar_autoscale.functions.state.groups import message_group
from pulsar_autoscale.functions.state.store import StateStore

log = logging.getLogger(__name__)


class RoutedMessageId(str):
    """The original input message's id (str() is what EFFECTIVELY_ONCE and acks by id compare)."""


class RoutedMessage:
    """A record taken from a route topic, seen by the instance as the original input message."""

    def __init__(self, msg):
        self.route_msg = msg
        props = msg.properties()
        self._id = RoutedMessageId(props.get(ORIGINAL_ID, str(msg.message_id())))
        self._topic = props.get(ORIGINAL_TOPIC, msg.topic_name())
        self._publish = int(props.get(ORIGINAL_PUBLISH, msg.publish_timestamp()))
        self._props = {k: v for k, v in props.items() if not k.startswith("kg-")}

    def message_id(self):
        return self._id

    def topic_name(self) -> str:
        return self._topic

    def publish_timestamp(self) -> int:
        return self._publish

    def properties(self) -> dict:
        return dict(self._props)

    def __getattr__(self, name):  # data, partition_key, ordering_key, event_timestamp, redelivery_count ...
        return getattr(self.route_msg, name)


class RouteInput:
    """What an instance of a spread keyedState function holds instead of a consumer: its route topic.

    Markers are taken in the instance's own thread between two records, so a RELEASE finds the groups put
    down (every record before it processed); an OPEN or a PREPARE reads the changelog in a thread of its own
    while the instance's other groups go on (the front sends no record of the groups before the answer).

    The records of groups just opened here (the burst the front held during their move) wait behind those
    of the instance's other groups already here: functions/keyed/record_scheduling.py.

    A marker of a front older than the newest this instance has heard of (`epoch`: the front's at its start, then
    each announcement) is refused with an error answer: that front no longer owns the assignment. An instance that
    replaced a frozen one may never hear a newer front's announcement: the frozen consumer on the same route topic
    (pulsar-lite's Shared route subscription) can hold it. So until it has heard one, its first other marker is
    checked against the saved assignment's epoch (`saved_epoch`) first, an announcement too: the one it reads first
    may be a stale front's, left unacknowledged by the frozen consumer."""

    def __init__(
        self,
        client: pulsar.Client,
        topics: KeyedTopics,
        instance_id: int,
        stores: InstanceStateStores,
        reply: Callable[[dict], None],
        broker: BrokerProfile,
        cfg,
        stall_fence: StallFence | None = None,
        epoch: int = 0,
        saved_epoch: Callable[[], int] = lambda: 0,
    ):
        self._topics, self._id = topics, instance_id
        self.epoch = epoch
        self._saved_epoch: Callable[[], int] | None = saved_epoch  # None once checked or an announcement heard
        self._epoch_lock = threading.Lock()
        self._stores, self._reply = stores, reply
        # The function's retries and dead-letter topic (its first input's), not the route topic's. Where the
        # broker does not count a Failover route's redeliveries, the input counts them (fence_nacks).
        kwargs: dict = {}
        dead_letter_topic = (cfg.dead_letter_topics() or [None])[0]
        if cfg.maxMessageRetries is not None:
            kwargs["dead_letter_policy"] = pulsar.ConsumerDeadLetterPolicy(
                max_redeliver_count=cfg.maxMessageRetries, dead_letter_topic=dead_letter_topic
            )
        route, subscription_type = topics.route(instance_id), broker.route_subscription

        def open_consumer():
            consumer = client.subscribe(
                route,
                ROUTE_SUBSCRIPTION,
                consumer_type=getattr(pulsar.ConsumerType, subscription_type),
                consumer_name=f"{topics.name}:{instance_id}",
                initial_position=pulsar.InitialPosition.Earliest,
                receiver_queue_size=100,
                negative_ack_redelivery_delay_ms=NACK_REDELIVERY_DELAY_MS,
                **kwargs,
            )
            return fence_nacks(
                consumer, cfg, client, broker, NACK_REDELIVERY_DELAY_MS / 1000, subscription_type, dead_letter_topic
            )

        self._consumer = fence_stalls(open_consumer, (route,), ROUTE_SUBSCRIPTION, stall_fence)
        self._opening: dict[int, threading.Event] = {}  # groups an OPEN is restoring in the background
        self._restored = False  # its groups, at the first record (ClusterKeyed.open_input): then no more locks per record
        self._scheduler: RecordScheduler[pulsar.Message] = RecordScheduler()

    @property
    def store(self) -> StateStore:
        return self._stores.store(self._id)

    def receive(self, timeout_millis: int):
        deadline = time.monotonic() + timeout_millis / 1000
        while True:
            msg = self._next(deadline)
            props = msg.properties()
            op = props.get(OP)
            if op is None:
                group = message_group(msg, self.store.num_key_groups)
                opening = self._opening.get(group)
                if opening is not None:  # the front holds a group's records until its open is answered: not here
                    opening.wait()
                self._own(group)
                return RoutedMessage(msg)
            self._take_marker(op, props)
            self._consumer.acknowledge(msg)
            if time.monotonic() >= deadline:
                raise pulsar.Timeout()

    def raise_epoch(self, epoch: int) -> None:
        """A front started on this instance's worker: its epoch is the current one."""
        with self._epoch_lock:
            self.epoch, self._saved_epoch = max(self.epoch, epoch), None

    def _take_marker(self, op: str, props: dict) -> None:
        groups = {int(g) for g in props.get(GROUPS, "").split(",") if g}
        nonce = props.get(NONCE)
        epoch = int(props.get(EPOCH) or 0)
        with self._epoch_lock:
            check, self._saved_epoch = self._saved_epoch, None
        if check is not None:  # an announcement too: a stale front's, redelivered from the frozen consumer's backlog
            try:
                saved = check()
            except (pulsar.PulsarException, TimeoutError) as exc:  # the front retries the step
                with self._epoch_lock:
                    self._saved_epoch = check
                if op != ANNOUNCE:
                    self._reply(
                        {
                            "nonce": nonce,
                            "op": op,
                            "instance": self._id,
                            "error": f"reading the saved assignment's epoch failed: {exc}",
                        }
                    )
                return
            with self._epoch_lock:
                self.epoch = max(self.epoch, saved)
        if epoch < self.epoch:
            log.warning(
                "%s instance %d: refused a %s of key groups %s from a stale front (epoch %d; the current front's is %d)",
                self._topics.name,
                self._id,
                op,
                sorted(groups),
                epoch,
                self.epoch,
            )
            if op != ANNOUNCE:
                self._reply(
                    {
                        "nonce": nonce,
                        "op": op,
                        "instance": self._id,
                        "error": f"refused: a stale front (epoch {epoch}, the current one is {self.epoch})",
                    }
                )
            return
        with self._epoch_lock:
            self.epoch = max(self.epoch, epoch)
        # A pre-copy or an open reads the changelog: in a thread of its own, so that this instance's other
        # groups go on meanwhile (no record of the groups comes before the answer). A release is a flush.
        if op == PREPARE:
            duty, rate = float(props.get(DUTY, 1)), float(props.get(RATE) or 0) or None
            self._in_background(op, groups, nonce, lambda: self._stores.prepare(self._id, groups, duty, rate))
        elif op == OPEN:
            done = threading.Event()
            self._opening.update(dict.fromkeys(groups, done))
            self._scheduler.opening(groups)
            self._in_background(op, groups, nonce, lambda: self._stores.open(self._id, groups), done)
        elif op != ANNOUNCE:
            held = groups & self.store.owned()
            if op == RELEASE and held:  # only what it holds: releasing a group again would snapshot it empty
                self._stores.release(self._id, held)
            self._reply({"nonce": nonce, "op": op, "instance": self._id})

    def _next(self, deadline: float) -> pulsar.Message:
        """The next record or marker to take, in the scheduler's order."""
        while True:
            msg = self._scheduler.due(time.monotonic())
            if msg is not None:
                return msg
            wait_ms = 0 if self._scheduler.waiting() else max(int((deadline - time.monotonic()) * 1000), 1)
            try:
                msg = self._consumer.receive(timeout_millis=wait_ms)
            except pulsar.Timeout:
                msg = self._scheduler.take()  # nothing else is here: the moved groups' turn
                if msg is None:
                    raise
                return msg
            group = None if OP in msg.properties() else message_group(msg, self.store.num_key_groups)
            msg = self._scheduler.arrive(msg, group, time.monotonic())
            if msg is not None:
                return msg

    def _in_background(
        self, op: str, groups: set[int], nonce: str | None, work: Callable[[], None], done: threading.Event | None = None
    ) -> None:
        """Do `work` in a thread, then answer the front (with the error if it failed: the front retries)."""

        def run() -> None:
            reply = {"nonce": nonce, "op": op, "instance": self._id}
            try:
                work()
            except Exception as exc:
                log.warning(
                    "%s instance %d: the %s of key groups %s failed: %s", self._topics.name, self._id, op, sorted(groups), exc
                )
                reply["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                if done is not None:
                    self._scheduler.opened(groups, time.monotonic())  # the front now sends the records it held
                    for g in groups:
                        if self._opening.get(g) is done:
                            del self._opening[g]
                    done.set()
            try:
                self._reply(reply)
            except pulsar.PulsarException as exc:
                log.warning("%s instance %d: no answer to the %s: %s", self._topics.name, self._id, op, exc)

        threading.Thread(target=run, daemon=True, name=f"{op}-{self._topics.name}-{self._id}").start()

    def _own(self, group: int) -> None:
        """The front sends a group's records only to its owner: a record of a group this store does not hold
        (its assignment was read before the front saved the latest) opens the group from the changelog. A surplus
        instance restores its groups here, at its first record (ClusterKeyed.open_input)."""
        if not self._restored:
            self._stores.restore(self._id)
            self._restored = True
        if group not in self.store.owned():
            log.warning(
                "%s instance %d: a record of key group %d, not open here: restoring it", self._topics.name, self._id, group
            )
            self._stores.open(self._id, {group})

    def acknowledge(self, msg) -> None:
        self._consumer.acknowledge(msg.route_msg)

    def negative_acknowledge(self, msg) -> None:
        self._consumer.negative_acknowledge(msg.route_msg)

    def is_connected(self) -> bool:
        return self._consumer.is_connected()

    def close(self) -> None:
        self._consumer.close()
