"""A keyedState function spread over the workers of a cluster (issue 13): route topics and remote hand-over.

One **front** per function, on the worker that hosts instance 0, holds the function's input (one
consumer, routing.KeyedRouter) and the key-group assignment. It forwards each record to the route
topic of the instance that owns the record's group (one persistent topic per instance, `route_topic`),
keeping its keys, event time and properties, with the original message id and topic as properties,
and acks the input record once the forward is persisted. Each instance, wherever it runs, consumes
its route topic with one consumer (`RouteInput`), so a key's records stay in order end to end, and
EFFECTIVELY_ONCE dedupes on the original message id (a record forwarded twice applies once).

A live migration keeps migration.migrate's protocol with `RoutedStores`: release(src, groups) is a
RELEASE marker in src's route topic after the last forwarded record of those groups (src puts them
down when it reaches it: flush, snapshot, forget, then answers on the control topic); open(dst,
groups) an OPEN marker in dst's route topic (dst restores them from the changelog and answers).
Every wait is bounded. The assignment is saved to a per-function topic after each subscale (the
latest wins), so a new front (instance 0 moved) resumes from it and redoes an interrupted subscale:
a release of groups not owned is a no-op, an open restores from the changelog, the truth.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pulsar

from pulsar_autoscale.broker import lite_quirks
from pulsar_autoscale.functions.instance.instance import NACK_REDELIVERY_DELAY_MS
from pulsar_autoscale.functions.keyed.migration import InstanceStateStores, KeyedScaler, MigrationError
from pulsar_autoscale.functions.keyed.record_scheduling import RecordScheduler
from pulsar_autoscale.functions.keyed.routing import KeyedRouter
from pulsar_autoscale.functions.model.config import FunctionConfig, keyed_migration
from pulsar_autoscale.functions.model.keygroups import KeyGroupAssignment, key_group, moves
from pulsar_autoscale.functions.state.changelog import changelog_of, state_topic
from pulsar_autoscale.functions.state.store import StateStore, message_group

log = logging.getLogger(__name__)
ROUTE_SUBSCRIPTION = "keyed-route"
MARKER_TIMEOUT_S = 60.0     # an instance may have to start on another worker and restore first
PREPARE_TIMEOUT_S = 300.0   # a pre-copy replays the whole changelog (500 MB: about 10 s here); best effort
RETRY_S = 2.0               # a failed migration (an instance died meanwhile) is retried after this
READ_TIMEOUT_MS = 5_000
# properties of a forwarded record and of a marker
ORIGINAL_ID, ORIGINAL_TOPIC, ORIGINAL_PUBLISH = "kg-mid", "kg-topic", "kg-pub"
OP, GROUPS, NONCE, INSTANCE, DUTY, RATE = "kg-op", "kg-groups", "kg-nonce", "kg-instance", "kg-duty", "kg-mbps"
RELEASE, OPEN, PREPARE = "release", "open", "prepare"


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


def save_assignment(producer: pulsar.Producer, a: KeyGroupAssignment) -> None:
    producer.send(json.dumps({"seq": time.time_ns(), "num_key_groups": a.num_key_groups,
                              "owners": list(a.owners)}).encode())


def read_assignment(client: pulsar.Client, topic: str) -> KeyGroupAssignment | None:
    """The latest saved assignment (highest seq), None when none was saved. The end is a marker this call
    publishes first (no has_message_available: unreliable on pulsar-lite, see functions/state/changelog.py)."""
    nonce = uuid.uuid4().hex.encode()
    producer = client.create_producer(topic)
    try:
        producer.send(nonce)
    finally:
        producer.close()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    best: tuple[int, KeyGroupAssignment] | None = None
    try:
        while True:
            try:
                msg = reader.read_next(READ_TIMEOUT_MS)
            except pulsar.Timeout:
                raise TimeoutError(f"{topic}: no message for {READ_TIMEOUT_MS} ms before the end marker while "
                                   "reading the saved key-group assignment; the broker may be down") from None
            if msg.data() == nonce:
                return None if best is None else best[1]
            try:
                saved = json.loads(msg.data())
                a = KeyGroupAssignment(saved["num_key_groups"], tuple(saved["owners"]))
            except (ValueError, KeyError, TypeError):
                continue   # another reader's end marker
            if best is None or saved["seq"] > best[0]:
                best = (saved["seq"], a)
    finally:
        reader.close()


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

    def __getattr__(self, name):   # data, partition_key, ordering_key, event_timestamp, redelivery_count ...
        return getattr(self.route_msg, name)


class RouteInput:
    """What an instance of a spread keyedState function holds instead of a consumer: its route topic.

    Markers are taken in the instance's own thread between two records, so a RELEASE finds the groups put
    down (every record before it processed); an OPEN or a PREPARE reads the changelog in a thread of its own
    while the instance's other groups go on (the front sends no record of the groups before the answer).

    The records of groups just opened here (the burst the front held during their move) wait behind those
    of the instance's other groups already here: functions/keyed/record_scheduling.py."""

    def __init__(self, client: pulsar.Client, topics: KeyedTopics, instance_id: int, stores: InstanceStateStores,
                 reply: Callable[[dict], None], subscription_type: str, cfg,
                 stall_fence: lite_quirks.StallFence | None = None):
        self._topics, self._id = topics, instance_id
        self._stores, self._reply = stores, reply
        kwargs: dict = {}
        if cfg.maxMessageRetries is not None:   # the function's retries and dead-letter topic (its first input's),
            kwargs["dead_letter_policy"] = pulsar.ConsumerDeadLetterPolicy(   # not the route topic's
                max_redeliver_count=cfg.maxMessageRetries, dead_letter_topic=(cfg.dead_letter_topics() or [None])[0])
        self._consumer = lite_quirks.fence_stalls(lambda: client.subscribe(
            topics.route(instance_id), ROUTE_SUBSCRIPTION, consumer_type=getattr(pulsar.ConsumerType, subscription_type),
            consumer_name=f"{topics.name}:{instance_id}", initial_position=pulsar.InitialPosition.Earliest,
            receiver_queue_size=100, negative_ack_redelivery_delay_ms=NACK_REDELIVERY_DELAY_MS, **kwargs),
            (topics.route(instance_id),), ROUTE_SUBSCRIPTION, stall_fence)
        self._opening: dict[int, threading.Event] = {}   # groups an OPEN is restoring in the background
        self._restored = False   # its groups, at the first record (ClusterKeyed.open_input): then no more locks per record
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
                if opening is not None:   # the front holds a group's records until its open is answered: not here
                    opening.wait()
                self._own(group)
                return RoutedMessage(msg)
            groups = {int(g) for g in props.get(GROUPS, "").split(",") if g}
            nonce = props.get(NONCE)
            # A pre-copy or an open reads the changelog: in a thread of its own, so that this instance's other
            # groups go on meanwhile (no record of the groups comes before the answer). A release is a flush.
            if op == PREPARE:
                duty, rate = float(props.get(DUTY, 1)), float(props.get(RATE) or 0) or None
                self._in_background(op, groups, nonce,
                                    lambda g=groups, d=duty, r=rate: self._stores.prepare(self._id, g, d, r))
            elif op == OPEN:
                done = threading.Event()
                self._opening.update(dict.fromkeys(groups, done))
                self._scheduler.opening(groups)
                self._in_background(op, groups, nonce, lambda g=groups: self._stores.open(self._id, g), done)
            else:
                held = groups & self.store.owned()
                if op == RELEASE and held:   # only what it holds: releasing a group again would snapshot it empty
                    self._stores.release(self._id, held)
                self._reply({"nonce": nonce, "op": op, "instance": self._id})
            self._consumer.acknowledge(msg)
            if time.monotonic() >= deadline:
                raise pulsar.Timeout()

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
                msg = self._scheduler.take()   # nothing else is here: the moved groups' turn
                if msg is None:
                    raise
                return msg
            group = None if OP in msg.properties() else message_group(msg, self.store.num_key_groups)
            msg = self._scheduler.arrive(msg, group, time.monotonic())
            if msg is not None:
                return msg

    def _in_background(self, op: str, groups: set[int], nonce: str | None, work: Callable[[], None],
                       done: threading.Event | None = None) -> None:
        """Do `work` in a thread, then answer the front (with the error if it failed: the front retries)."""
        def run() -> None:
            reply = {"nonce": nonce, "op": op, "instance": self._id}
            try:
                work()
            except Exception as exc:
                log.warning("%s instance %d: the %s of key groups %s failed: %s", self._topics.name, self._id, op,
                            sorted(groups), exc)
                reply["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                if done is not None:
                    self._scheduler.opened(groups, time.monotonic())   # the front now sends the records it held
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
            log.warning("%s instance %d: a record of key group %d, not open here: restoring it", self._topics.name,
                        self._id, group)
            self._stores.open(self._id, {group})

    def acknowledge(self, msg) -> None:
        self._consumer.acknowledge(msg.route_msg)

    def negative_acknowledge(self, msg) -> None:
        self._consumer.negative_acknowledge(msg.route_msg)

    def is_connected(self) -> bool:
        return self._consumer.is_connected()

    def close(self) -> None:
        self._consumer.close()


class RoutedStores:
    """migration.InstanceStores for instances anywhere in the cluster: markers in their route topics, answers
    on the control topic. The local stores (this worker's instances) answer everything else."""

    def __init__(self, client: Callable[[], pulsar.Client], topics: KeyedTopics, local: InstanceStateStores,
                 route_subscription_type: str):
        self._client, self._topics, self.local = client, topics, local
        self._subscription_type = route_subscription_type
        self._producers: dict[int, pulsar.Producer] = {}
        self._replies: dict[str, dict] = {}
        self._cond = threading.Condition()
        self._listener: pulsar.Consumer | None = None
        self._lock = threading.Lock()
        self._called_off = False

    # ---- the front's side --------------------------------------------------------------------------
    def producer(self, instance_id: int) -> pulsar.Producer:
        """The one producer of an instance's route topic (records and markers, in order). Its subscription
        is made first, from the earliest message, so nothing forwarded before the instance runs is lost."""
        with self._lock:
            p = self._producers.get(instance_id)
            if p is None:
                topic = self._topics.route(instance_id)
                self._client().subscribe(topic, ROUTE_SUBSCRIPTION,
                                         consumer_type=getattr(pulsar.ConsumerType, self._subscription_type),
                                         initial_position=pulsar.InitialPosition.Earliest).close()
                p = self._producers[instance_id] = self._client().create_producer(
                    topic, batching_enabled=False, block_if_queue_full=True, send_timeout_millis=0)
            return p

    def listen(self) -> None:
        """Start taking answers (before the first marker is sent)."""
        with self._lock:
            if self._listener is None:
                self._listener = self._client().subscribe(
                    self._topics.control, f"front-{uuid.uuid4().hex[:12]}", consumer_type=pulsar.ConsumerType.Exclusive,
                    initial_position=pulsar.InitialPosition.Latest, message_listener=self._on_reply)

    def _on_reply(self, consumer, msg) -> None:
        consumer.acknowledge(msg)
        try:
            reply = json.loads(msg.data())
        except ValueError:
            return
        with self._cond:
            self._replies[reply.get("nonce")] = reply
            self._cond.notify_all()

    def _ask_all(self, op: str, groups: dict[int, set[int]], timeout_s: float = MARKER_TIMEOUT_S,
                 **extra: str) -> None:
        """A marker to each instance, then wait for every answer: the instances work in parallel."""
        asked: dict[str, tuple[int, set[int]]] = {}
        for instance_id, gs in groups.items():
            nonce = uuid.uuid4().hex
            self.producer(instance_id).send(b"", properties={OP: op, GROUPS: ",".join(map(str, sorted(gs))),
                                                              NONCE: nonce, INSTANCE: str(instance_id), **extra})
            asked[nonce] = (instance_id, gs)
        with self._cond:
            self._cond.wait_for(lambda: self._called_off or all(n in self._replies for n in asked), timeout_s)
            if self._called_off:
                raise MigrationError(f"{self._topics.name}: the {op} was called off (the function is deleted)")
            replies = {n: self._replies.pop(n, None) for n in asked}
        missing = [asked[n] for n, r in replies.items() if r is None]
        if missing:
            raise MigrationError(f"{self._topics.name}: no confirmation of the {op} within {timeout_s:.0f} s from "
                                 + ", ".join(f"instance {i} (key groups {sorted(gs)})" for i, gs in missing))
        failed = [f"instance {asked[n][0]}: {r['error']}" for n, r in replies.items() if r.get("error")]
        if failed:
            raise MigrationError(f"{self._topics.name}: the {op} failed on " + "; ".join(failed))

    def prepare_all(self, groups: dict[int, set[int]], duty: float, mb_per_s: float | None) -> None:
        self._ask_all(PREPARE, groups, PREPARE_TIMEOUT_S, **{DUTY: str(duty), RATE: str(mb_per_s or "")})

    def release_all(self, groups: dict[int, set[int]]) -> None:
        self._ask_all(RELEASE, groups)

    def open_all(self, groups: dict[int, set[int]]) -> None:
        self._ask_all(OPEN, groups)

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


class ClusterKeyed:
    """A keyedState function's part on one cluster worker: its local instances' stores and route inputs, and
    the front (router + scaler) while instance 0 runs here."""

    def __init__(self, cfg, directory: Path, client: Callable[[], pulsar.Client],
                 open_input_consumer: Callable[[], pulsar.Consumer], broker_kind: str, config: Callable[[], object],
                 stall_fence: Callable[[], lite_quirks.StallFence | None] = lambda: None):
        """`config`: the function's current config (an update restarts the instances with it); `stall_fence`:
        the worker's (B12), which watches the route consumers as it watches every input."""
        self.topics = KeyedTopics.of(cfg)
        self._config = config
        self._stall_fence = stall_fence
        self._client = client
        self._subscription_type = lite_quirks.route_subscription_type(broker_kind)
        # a cluster worker restores every group it opens: the function may have run elsewhere since
        local = InstanceStateStores(directory, cfg.numKeyGroups, self.owners, client, changelog_of(cfg),
                                    restore_always=True)
        self.stores = RoutedStores(client, self.topics, local, self._subscription_type)
        self._open_input_consumer = open_input_consumer
        self.router = self._new_router(KeyGroupAssignment.uniform(cfg.numKeyGroups, max(cfg.parallelism, 1)))
        self.scaler: KeyedScaler | None = None
        self._saver: pulsar.Producer | None = None
        self._reply_producer: pulsar.Producer | None = None
        self._lock = threading.Lock()
        self._front_lock = threading.Lock()   # a front starting here, and the last one closing in the background

    # ---- instances here -------------------------------------------------------------------------------
    def open_input(self, instance_id: int) -> RouteInput:
        """An instance's input: its groups restored (the saved assignment says which), then its route topic. A
        surplus instance (a scale-in under way: it runs to hand its groups over, maybe on another worker than the
        one it ran on) restores at its first record instead, if one comes: a release needs no restore."""
        if instance_id < self._config().parallelism:
            self.stores.restore(instance_id)
        return RouteInput(self._client(), self.topics, instance_id, self.stores.local, self._send_reply,
                          self._subscription_type, self._config(), self._stall_fence())

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
        router = KeyedRouter(assignment, self._open_input_consumer,
                             forward=lambda instance_id, msg: self._forward(router, instance_id, msg))
        return router

    def start_front(self, parallelism: int) -> None:
        """Instance 0 runs here: take the input over from the saved assignment. The groups an interrupted
        (or a pending) migration still has to move wait from the start; every other group is served."""
        with self._front_lock:
            if self.scaler is None:
                saved = read_assignment(self._client(), self.topics.assignment)
                if saved is not None:
                    self.router.assignment = saved
                target = self.router.assignment.rescale(max(parallelism, 1))
                self.router.stop_serving({m.group for m in moves(self.router.assignment, target)})
                self._saver = self._client().create_producer(self.topics.assignment)
                save_assignment(self._saver, self.router.assignment)
                self.stores.listen()
                self.scaler = KeyedScaler(self.router, self.stores, start=lambda _i: None, drain=lambda _ids: None,
                                          settings=lambda: keyed_migration(self._config()),
                                          save=lambda a: save_assignment(self._saver, a), retry_s=RETRY_S)
                self.router.start()
                log.info("%s: front started here with %s groups per instance", self.topics.name,
                         self.scaler.view()["groupsPerInstance"])
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
            saver, self._saver = self._saver, None
            router, self.router = self.router, self._new_router(self.router.assignment)

        def stop():
            scaler.idle(MARKER_TIMEOUT_S)
            try:
                router.close(before_close=self.stores.flush_front)
                with self._front_lock:   # not closed under it: a front starting here must not wait for the broker
                    close_front = self.stores.take_front() if self.scaler is None else None
                if close_front is not None:
                    close_front()
                if saver is not None:
                    saver.close()
            except pulsar.PulsarException as exc:   # the broker is gone: it redelivers what was not acked
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
        props = {**msg.properties(), ORIGINAL_ID: str(msg.message_id()), ORIGINAL_TOPIC: msg.topic_name(),
                 ORIGINAL_PUBLISH: str(msg.publish_timestamp())}
        kwargs: dict = {"properties": props}
        if msg.partition_key():
            kwargs["partition_key"] = msg.partition_key()
        ordering = getattr(msg, "ordering_key", None)
        if ordering is not None and ordering():
            kwargs["ordering_key"] = ordering()
        if msg.event_timestamp():
            kwargs["event_timestamp"] = msg.event_timestamp()

        consumer = router.input   # the one the record came from, open until the forwards are flushed
        if consumer is None:           # the input closed: the broker redelivers the record to the next front
            return

        def done(result, _msg_id):
            try:
                if result == pulsar.Result.Ok:
                    consumer.acknowledge(msg)
                else:
                    consumer.negative_acknowledge(msg)
            except pulsar.PulsarException as exc:   # closed meanwhile: the broker redelivers the record
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
        for i in instances:   # a surplus instance that has not restored yet (open_input): its files are not its state
            self.stores.restore(i)
        here = [self.stores.store(i) for i in instances]
        return (next((s for s in here if s.holds(key)), None)
                or next((s for s in here if group in s.owned()), None))

    def surplus_owners(self, parallelism: int) -> set[int]:
        """The front's instances beyond `parallelism` that still own key groups (a scale-in under way): they
        must run somewhere until the front has moved their groups off, also when their worker died."""
        if self.scaler is None:
            return set()
        return {i for i in self.router.assignment.owners if i >= parallelism}

    def holds_groups(self, instance_id: int) -> bool:
        """Whether this worker's instance still holds key groups (a surplus instance runs until they left)."""
        return bool(self.stores.local.held(instance_id))
