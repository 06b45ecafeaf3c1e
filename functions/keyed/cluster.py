"""A keyedState function spread over the workers of a cluster: route topics and remote hand-over.

One **front** per function, on the worker that hosts instance 0, holds the function's input (one
consumer, routing.KeyedRouter) and the key-group assignment. It forwards each record to the route
topic of the instance that owns the record's group (one persistent topic per instance, `route_topic`),
keeping its keys, event time and properties, with the original message id and topic as properties,
and acks the input record once the forward is persisted. Each instance, wherever it runs, consumes
its route topic with one consumer (functions/keyed/route_input.py).

A live migration keeps migration.migrate's protocol through markers in the route topics
(functions/keyed/protocol.py, answered by functions/keyed/route_input.py). The assignment is saved
to a per-function topic after each subscale (the latest wins), so a new front (instance 0 moved) resumes from it and redoes an interrupted subscale:
a release of groups not owned is a no-op, an open restores from the changelog, the truth.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pulsar

from pulsar_autoscale.broker.lite.stalls import StallFence
from pulsar_autoscale.broker.profile import BrokerProfile
from pulsar_autoscale.functions.keyed.migration import InstanceStateStores
from pulsar_autoscale.functions.keyed.protocol import (
    MARKER_TIMEOUT_S,
    ORIGINAL_ID,
    ORIGINAL_PUBLISH,
    ORIGINAL_TOPIC,
    FrontMarkers,
    KeyedTopics,
    RoutedStores,
)
from pulsar_autoscale.functions.keyed.route_input import RouteInput
from pulsar_autoscale.functions.keyed.routing import KeyedRouter
from pulsar_autoscale.functions.keyed.scaler import KeyedScaler
from pulsar_autoscale.functions.model.keygroups import KeyGroupAssignment, key_group, moves
from pulsar_autoscale.functions.model.migration_settings import keyed_migration
from pulsar_autoscale.functions.state.changelog import changelog_of
from pulsar_autoscale.functions.state.store import StateStore

if TYPE_CHECKING:
    from pulsar_autoscale.functions.model.config import FunctionConfig

log = logging.getLogger(__name__)
RETRY_S = 2.0  # a failed migration (an instance died meanwhile) is retried after this
READ_TIMEOUT_MS = 5_000


@dataclass(frozen=True)
class SavedAssignment:
    """An assignment as a front saved it, with that front's epoch (functions/keyed/protocol.py)."""

    assignment: KeyGroupAssignment
    epoch: int


def save_assignment(producer: pulsar.Producer, a: KeyGroupAssignment, epoch: int) -> None:
    producer.send(
        json.dumps({"epoch": epoch, "seq": time.time_ns(), "num_key_groups": a.num_key_groups, "owners": list(a.owners)}).encode()
    )


def read_saved(client: pulsar.Client, topic: str) -> SavedAssignment | None:
    """The latest saved assignment: of the highest front epoch, then the highest seq (a stale front's saves,
    made after a newer front started, lose); None when none was saved. The end is a marker this call
    publishes first (no has_message_available: unreliable on pulsar-lite, see functions/state/changelog.py)."""
    nonce = uuid.uuid4().hex.encode()
    producer = client.create_producer(topic)
    try:
        producer.send(nonce)
    finally:
        producer.close()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    best: tuple[tuple[int, int], SavedAssignment] | None = None
    try:
        while True:
            try:
                msg = reader.read_next(READ_TIMEOUT_MS)
            except pulsar.Timeout:
                raise TimeoutError(
                    f"{topic}: no message for {READ_TIMEOUT_MS} ms before the end marker while "
                    "reading the saved key-group assignment; the broker may be down"
                ) from None
            if msg.data() == nonce:
                return None if best is None else best[1]
            try:
                saved = json.loads(msg.data())
                order = (int(saved.get("epoch", 0)), int(saved["seq"]))
                a = KeyGroupAssignment(saved["num_key_groups"], tuple(saved["owners"]))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # another reader's end marker
            if best is None or order > best[0]:
                best = (order, SavedAssignment(a, order[0]))
    finally:
        reader.close()


def read_assignment(client: pulsar.Client, topic: str) -> KeyGroupAssignment | None:
    saved = read_saved(client, topic)
    return None if saved is None else saved.assignment


class ClusterKeyed:
    """A keyedState function's part on one cluster worker: its local instances' stores and route inputs, and
    the front (router + scaler) while instance 0 runs here."""

    def __init__(
        self,
        cfg,
        directory: Path,
        client: Callable[[], pulsar.Client],
        open_input_consumer: Callable[[], pulsar.Consumer],
        broker: BrokerProfile,
        config: Callable[[], FunctionConfig],
        stall_fence: Callable[[], StallFence | None] = lambda: None,
    ):
        """`config`: the function's current config (an update restarts the instances with it); `stall_fence`:
        the worker's (B12), which watches the route consumers as it watches every input."""
        self.topics = KeyedTopics.of(cfg)
        self._config = config
        self._stall_fence = stall_fence
        self._client = client
        self._broker = broker
        # a cluster worker restores every group it opens: the function may have run elsewhere since
        local = InstanceStateStores(directory, cfg.numKeyGroups, self.owners, client, changelog_of(cfg), restore_always=True)
        self.stores = RoutedStores(client, self.topics, local, broker.route_subscription)
        self.stores.wanted = lambda i: i < self._config().parallelism  # read at each wait: a scale-in meanwhile
        self._open_input_consumer = open_input_consumer
        self.router = self._new_router(KeyGroupAssignment.uniform(cfg.numKeyGroups, max(cfg.parallelism, 1)))
        self.scaler: KeyedScaler[FrontMarkers] | None = None
        self._saver: pulsar.Producer | None = None
        self._epoch: int | None = None  # the front's, while it runs here
        self._inputs: weakref.WeakSet[RouteInput] = weakref.WeakSet()  # this worker's instances' route inputs
        self._reply_producer: pulsar.Producer | None = None
        self._lock = threading.Lock()
        self._front_lock = threading.Lock()  # a front starting here, and the last one closing in the background

    # ---- instances here -------------------------------------------------------------------------------
    def open_input(self, instance_id: int) -> RouteInput:
        """An instance's input: its groups restored (the saved assignment says which), then its route topic. A
        surplus instance (a scale-in under way: it runs to hand its groups over, maybe on another worker than the
        one it ran on) restores at its first record instead, if one comes: a release needs no restore. It starts
        at the current front's epoch: the announcement may have been read by the instance it replaces."""
        if instance_id < self._config().parallelism:
            self.stores.restore(instance_id)
        epoch = self._epoch
        if epoch is None:
            epoch = self._saved_epoch()
        opened = RouteInput(
            self._client(),
            self.topics,
            instance_id,
            self.stores.local,
            self._send_reply,
            self._broker,
            self._config(),
            self._stall_fence(),
            epoch,
            self._saved_epoch,
        )
        with self._lock:  # a front starting here meanwhile: its epoch
            self._inputs.add(opened)
            if self._epoch is not None:
                opened.raise_epoch(self._epoch)
        return opened

    def _saved_epoch(self) -> int:
        saved = read_saved(self._client(), self.topics.assignment)
        return 0 if saved is None else saved.epoch

    def owners(self) -> KeyGroupAssignment:
        """The saved assignment (what the front last served), or the uniform one before any was saved."""
        if self.scaler is not None:
            return self.router.assignment
        return read_assignment(self._client(), self.topics.assignment) or self.router.assignment

    def _send_reply(self, reply: dict) -> None:
        """Not waited for: the instance goes back to its records (a lost answer times the front's wait out, and
        the front retries the step)."""
        with self._lock:
            if self._reply_producer is None:
                self._reply_producer = self._client().create_producer(self.topics.control)
            producer = self._reply_producer

        def sent(result, _msg_id) -> None:
            if result != pulsar.Result.Ok:
                log.warning("%s: an answer to the front was not sent: %s", self.topics.name, result)

        producer.send_async(json.dumps(reply).encode(), sent)

    # ---- the front ------------------------------------------------------------------------------------
    def _new_router(self, assignment: KeyGroupAssignment) -> KeyedRouter:
        """A front's router, one per front: a front still closing in the background (stop_front) closes its own
        input and acks its own forwards there, never those of a front started here after it."""
        router = KeyedRouter(
            assignment, self._open_input_consumer, forward=lambda instance_id, msg: self._forward(router, instance_id, msg)
        )
        return router

    def start_front(self, parallelism: int) -> None:
        """Instance 0 runs here: take the input over from the saved assignment. The groups an interrupted
        (or a pending) migration still has to move wait from the start; every other group is served."""
        with self._front_lock:
            if self.scaler is None:
                saved = read_saved(self._client(), self.topics.assignment)
                if saved is not None:
                    self.router.assignment = saved.assignment
                epoch = (0 if saved is None else saved.epoch) + 1
                with self._lock:
                    self._epoch = epoch
                    for opened in self._inputs:  # an announcement may go to a frozen instance's consumer instead
                        opened.raise_epoch(epoch)
                target = self.router.assignment.rescale(max(parallelism, 1))
                self.router.stop_serving({m.group for m in moves(self.router.assignment, target)})
                # this front's own producer: a migration under way when the front stops ends through it (its
                # saves lose to a newer front's, its markers are refused: the epoch); stop_front closes it
                saver = self._saver = self._client().create_producer(self.topics.assignment)
                save_assignment(saver, self.router.assignment, epoch)
                self.stores.announce(epoch, set(self.router.assignment.owners) | set(range(max(parallelism, 1))))
                self.stores.listen()
                self.scaler = KeyedScaler(
                    self.router,
                    FrontMarkers(self.stores, epoch),
                    start=lambda _i: None,
                    drain=lambda _ids: None,
                    settings=lambda: keyed_migration(self._config()),
                    save=lambda a: save_assignment(saver, a, epoch),
                    retry_s=RETRY_S,
                )
                self.router.start()
                log.info(
                    "%s: front started here with %s groups per instance",
                    self.topics.name,
                    self.scaler.view()["groupsPerInstance"],
                )
            scaler = self.scaler
        scaler.scale(max(parallelism, 1))

    def stop_front(self) -> threading.Thread | None:
        """Instance 0 left this worker: a migration under way ends (bounded), then the input closes (its
        unacked records go to the next front). In a thread (returned): the caller holds the worker's lock.

        A front may start here again before this one has closed (`functions stop`, then an instance added or
        `functions start`, within a second): the next front gets a router of its own, and the route producers
        and the answer listener stay open for it. Before, the closing front closed the new one's input and
        listener: its records stopped and its migration waited for answers it never heard."""
        with self._front_lock:
            scaler, self.scaler = self.scaler, None
            if scaler is None:
                return None
            scaler.stop()
            saver, self._saver, self._epoch = self._saver, None, None
            router, self.router = self.router, self._new_router(self.router.assignment)

        def stop():
            scaler.idle(MARKER_TIMEOUT_S)
            try:
                router.close(before_close=self.stores.flush_front)
                with self._front_lock:  # not closed under it: a front starting here must not wait for the broker
                    close_front = self.stores.take_front() if self.scaler is None else None
                if close_front is not None:
                    close_front()
                if saver is not None:
                    saver.close()
            except pulsar.PulsarException as exc:  # the broker is gone: it redelivers what was not acked
                log.warning("%s: closing the front: %s", self.topics.name, exc)
            log.info("%s: the front that ran here closed", self.topics.name)

        thread = threading.Thread(target=stop, name=f"front-stop-{self.topics.name}", daemon=True)
        thread.start()
        return thread

    def halt(self, timeout_s: float) -> bool:
        """The function is deleted: the front, if here, stops and closes its input; a migration under way is
        called off, answers it waits for included (False: still closing after timeout_s)."""
        self.stores.call_off()
        if self.scaler is not None:
            self.scaler.call_off()
        stopping = self.stop_front()
        if stopping is not None:
            stopping.join(timeout_s)
        return stopping is None or not stopping.is_alive()

    def _forward(self, router: KeyedRouter, instance_id: int, msg) -> None:
        """Under the router's lock (so records keep their order per route topic): forward, ack once persisted."""
        props = {
            **msg.properties(),
            ORIGINAL_ID: str(msg.message_id()),
            ORIGINAL_TOPIC: msg.topic_name(),
            ORIGINAL_PUBLISH: str(msg.publish_timestamp()),
        }
        kwargs: dict = {"properties": props}
        if msg.partition_key():
            kwargs["partition_key"] = msg.partition_key()
        ordering = getattr(msg, "ordering_key", None)
        if ordering is not None and ordering():
            kwargs["ordering_key"] = ordering()
        if msg.event_timestamp():
            kwargs["event_timestamp"] = msg.event_timestamp()

        consumer = router.input  # the one the record came from, open until the forwards are flushed
        if consumer is None:  # the input closed: the broker redelivers the record to the next front
            return

        def done(result, _msg_id):
            try:
                if result == pulsar.Result.Ok:
                    consumer.acknowledge(msg)
                else:
                    consumer.negative_acknowledge(msg)
            except pulsar.PulsarException as exc:  # closed meanwhile: the broker redelivers the record
                log.debug("%s: no ack for a forwarded record: %s", self.topics.name, exc)

        self.stores.producer(instance_id).send_async(msg.data(), done, **kwargs)

    # ---- what worker.py asks of fn.keyed ----------------------------------------------------------------
    def scale(self, parallelism: int) -> None:
        if self.scaler is not None:
            self.scaler.scale(max(parallelism, 1))

    def idle(self, timeout_s: float) -> bool:
        return self.scaler is None or self.scaler.idle(timeout_s)

    def view(self) -> dict | None:
        """The front's routing and migration state (status, autoscale.keyedState); None on other workers."""
        return None if self.scaler is None else self.scaler.view()

    def local_store_for(self, key: str) -> StateStore | None:
        """REST querystate/putstate: the store of this worker's instance whose groups hold the key, else of the
        one that holds the key's own group, else None (another worker answers: functions/cluster/member.py)."""
        group = key_group(key, self.router.num_key_groups)
        instances = self.stores.local.instances()
        for i in instances:  # a surplus instance that has not restored yet (open_input): its files are not its state
            self.stores.restore(i)
        here = [self.stores.store(i) for i in instances]
        return next((s for s in here if s.holds(key)), None) or next((s for s in here if group in s.owned()), None)

    def surplus_owners(self, parallelism: int) -> set[int]:
        """The front's instances beyond `parallelism` that still own key groups (a scale-in under way): they
        must run somewhere until the front has moved their groups off, also when their worker died."""
        if self.scaler is None:
            return set()
        return {i for i in self.router.assignment.owners if i >= parallelism}

    def holds_groups(self, instance_id: int) -> bool:
        """Whether this worker's instance still holds key groups (a surplus instance runs until they left)."""
        return bool(self.stores.local.held(instance_id))
