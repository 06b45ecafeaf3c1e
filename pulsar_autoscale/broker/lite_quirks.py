"""The one place that knows about pulsar-lite's defects (docs/broker.md, tests/integration/broker_conformance/).

Everything else in the project is written for Apache Pulsar's documented behaviour. The
workaround here is switched on only when the broker is pulsar-lite; it is correct, if less
parallel, on a real cluster too.

B2: a second client (process) joining a Shared subscription times out (consumer ids are
    tracked per subscription, not per connection). The published workaround (the process of
    instance i first opens throwaway consumers so its consumer id is i) joins, but in our
    5,000-message scaling runs with 4-8 process instances 4.7-7% of the messages never
    reached any instance (cause not isolated; docs/broker.md).

So process instances on pulsar-lite open no consumer at all: the worker holds one consumer
per function (SharedInput) and serves each process over a pipe; acks travel back the same
way, and whatever a process held when it exits is negative-acked, so survivors get it.

Every client that consumes next to other clients (a worker incarnation, a second worker, the
burst drain's driver) is an `incarnation_client`: its consumer ids start at a floor of its own.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Callable

import pulsar
import requests

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.pulsar_client import ClientSettings, open_client

log = logging.getLogger(__name__)

LITE_MARKER = 'cluster="pulsar-lite"'


def detect_broker_kind(metrics_url: str | None, timeout_s: float = 2.0, stop: threading.Event | None = None) -> str:
    """'pulsar-lite' when the broker's /metrics says so, else 'apache' (no metrics URL: a real cluster).

    Metrics that do not answer say nothing: with `stop` (a worker) it retries every second until
    they answer or stop is set, and never guesses; without it, it assumes Apache Pulsar and warns.
    """
    if not metrics_url:
        return "apache"
    attempt = 0
    while True:
        try:
            text = requests.get(metrics_url, timeout=timeout_s).text
            return "pulsar-lite" if LITE_MARKER in text else "apache"
        except requests.RequestException as exc:
            if stop is None:
                log.warning("cannot read broker metrics at %s (%s); assuming Apache Pulsar", metrics_url, exc)
                return "apache"
            if attempt % 30 == 0:
                log.warning("cannot read broker metrics at %s (%s); retrying until it answers "
                            "(or give --broker-kind)", metrics_url, exc)
            attempt += 1
            if stop.wait(1.0):
                return "apache"


class SharedInput:
    """One consumer for all instances of a function on this worker, opened on first use, closed after the last.

    One pump thread receives for all of them and hands each message to the longest-waiting receive,
    except that an instance that has had no message yet goes first: a just-started instance serves at
    once instead of queueing behind the idle ones (with every instance's thread blocked in the client's
    receive, 8 waiters on 200 msg/s, a new instance's first message came 100-180 ms after it was ready).
    """

    def __init__(self, open_consumer: Callable[[], pulsar.Consumer]):
        self._open = open_consumer
        self._consumer: pulsar.Consumer | None = None
        self._users = 0
        self._lock = threading.Lock()
        self._wanted = threading.Condition(self._lock)   # the pump waits here until someone receives
        self._receivers: list[_Receiver] = []             # waiting receives, oldest first
        self._held: deque = deque()                       # received after its receiver had timed out
        self._pump_stop = threading.Event()

    def lease(self) -> "InputLease":
        with self._lock:
            if self._consumer is None:
                self._consumer = self._open()
                self._pump_stop = threading.Event()
                threading.Thread(target=self._pump, args=(self._consumer, self._pump_stop), daemon=True,
                                 name="shared-input").start()
            self._users += 1
            return InputLease(self, self._consumer)

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._consumer is not None:
                self._pump_stop.set()
                self._wanted.notify_all()
                self._held.clear()    # unacknowledged: the broker redelivers them once the consumer closes
                self._consumer.close()
                self._consumer = None

    def receive(self, timeout_millis: int, first: bool = False):
        """`first`: the lease has had no message yet (it is served before the others)."""
        receiver = _Receiver(first)
        with self._lock:
            if self._held:
                return self._held.popleft()
            self._receivers.append(receiver)
            self._wanted.notify()
        if not receiver.served.wait(timeout_millis / 1000.0):
            with self._lock:
                if receiver.msg is None:
                    self._receivers.remove(receiver)
                    raise pulsar.Timeout()
        return receiver.msg

    def _pump(self, consumer: pulsar.Consumer, stop: threading.Event) -> None:
        while True:
            with self._lock:
                while not self._receivers and not stop.is_set():
                    self._wanted.wait()
            if stop.is_set():
                return
            try:
                msg = consumer.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            except Exception as exc:  # closed under the pump (the last lease released)
                if stop.is_set():
                    return
                log.warning("shared input: receive failed (%s); retrying", exc)
                stop.wait(0.1)
                continue
            with self._lock:
                if self._receivers:
                    receiver = next((r for r in self._receivers if r.first), self._receivers[0])
                    self._receivers.remove(receiver)
                    receiver.msg = msg
                    receiver.served.set()
                elif not stop.is_set():
                    self._held.append(msg)


class _Receiver:
    __slots__ = ("served", "msg", "first")

    def __init__(self, first: bool):
        self.served, self.msg, self.first = threading.Event(), None, first


class InputLease:
    """What an instance holds instead of its own consumer: same methods, close() only releases."""

    def __init__(self, shared: SharedInput, consumer: pulsar.Consumer):
        self._shared = shared
        self._consumer = consumer
        self._closed = False
        self._received = False

    def receive(self, timeout_millis: int):
        msg = self._shared.receive(timeout_millis, first=not self._received)
        self._received = True
        return msg

    def acknowledge(self, msg) -> None:
        self._consumer.acknowledge(msg)

    def negative_acknowledge(self, msg) -> None:
        self._consumer.negative_acknowledge(msg)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._shared._release()


def check_function(cfg) -> None:
    """Config fields pulsar-lite cannot honour, refused here and accepted on Apache Pulsar.

    B10: it cannot list a namespace's topics (GetTopicsOfNamespace times out), so a regex subscription
    (topicsPattern) never opens. B5: seek is ignored, so skipToLatest would silently not skip."""
    if cfg.topicsPattern:
        raise ConfigError("topicsPattern is not supported on pulsar-lite (it cannot list a namespace's topics, "
                          "defect B10 in docs/broker.md): list the topics in inputs, or run on Apache Pulsar")
    if cfg.skipToLatest:
        raise ConfigError("skipToLatest is not supported on pulsar-lite (it ignores seek, defect B5 in "
                          "docs/broker.md): run on Apache Pulsar")


# ---- B1 and B13: a function's Failover subscription ------------------------------------------------

def failover_receiver_queue(cfg, broker_kind: str) -> int | None:
    """B1: pulsar-lite delivers messages of a single-active-consumer subscription twice with a receiver
    queue of 10 or more (0-11 of 2,000 at 10, 40-140% at 1,000); at 1 we saw none. So a FAILOVER input
    (retainOrdering, EFFECTIVELY_ONCE) on lite fetches one message at a time, whatever receiverQueueSize
    says; None: the function's own setting."""
    if broker_kind == "pulsar-lite" and cfg.subscription_type == "FAILOVER":
        return 1
    return None


# What the Pulsar client adds to a message it dead-letters (DeadLetterPolicy).
DLQ_REAL_TOPIC, DLQ_ORIGIN_MESSAGE_ID = "REAL_TOPIC", "ORIGIN_MESSAGE_ID"


def fence_nacks(consumer, cfg, client: pulsar.Client, broker_kind: str, redelivery_delay_s: float):
    """The function's input as Pulsar would behave: on pulsar-lite a FAILOVER input redelivers its nacked
    messages itself (B13: the broker never does), elsewhere the consumer as it is."""
    if broker_kind != "pulsar-lite" or cfg.subscription_type != "FAILOVER":
        return consumer
    return NackRedelivery(consumer, cfg, client, redelivery_delay_s)


class NackRedelivery:
    """B13 fence: a nacked message comes back from receive() after the nack delay, and after
    maxMessageRetries redeliveries goes to the dead-letter topic and is acked, as the Pulsar client's
    DeadLetterPolicy does with the broker's redelivery count (docs/broker.md B13). The message never
    leaves this consumer's unacked set meanwhile, so a consumer that closes leaves it to the broker."""

    def __init__(self, consumer, cfg, client: pulsar.Client, redelivery_delay_s: float):
        self._consumer = consumer
        self._client = client
        self._delay_s = redelivery_delay_s
        self._max = cfg.maxMessageRetries
        self._dead_letter_topic = cfg.deadLetterTopic
        self._subscription = cfg.subscription_name
        self._due: deque = deque()              # (due time, message), in nack order: one delay for all
        self._nacks: dict[str, int] = {}        # message id -> redeliveries so far
        self._producers: dict[str, pulsar.Producer] = {}
        self.redelivered = 0
        self.dead_lettered = 0

    def receive(self, timeout_millis: int):
        now = time.monotonic()
        if self._due and self._due[0][0] <= now:
            self.redelivered += 1
            return self._due.popleft()[1]
        if self._due:
            timeout_millis = max(1, min(timeout_millis, int((self._due[0][0] - now) * 1000) + 1))
        return self._consumer.receive(timeout_millis=timeout_millis)

    def acknowledge(self, msg) -> None:
        self._nacks.pop(str(msg.message_id()), None)
        self._consumer.acknowledge(msg)

    def negative_acknowledge(self, msg) -> None:
        mid = str(msg.message_id())
        count = self._nacks.get(mid, 0)
        if self._max is not None and count >= self._max:
            self._dead_letter(msg)
            self.acknowledge(msg)
            return
        self._nacks[mid] = count + 1
        self._due.append((time.monotonic() + self._delay_s, msg))

    def _dead_letter(self, msg) -> None:
        topic = msg.topic_name()
        base = topic.rsplit("-partition-", 1)[0] if "-partition-" in topic else topic
        dlq = self._dead_letter_topic or f"{base}-{self._subscription}-DLQ"
        producer = self._producers.get(dlq) or self._producers.setdefault(dlq, self._client.create_producer(dlq))
        properties = {**msg.properties(), DLQ_REAL_TOPIC: topic, DLQ_ORIGIN_MESSAGE_ID: str(msg.message_id())}
        kwargs = {"partition_key": msg.partition_key()} if msg.partition_key() else {}
        producer.send(msg.data(), properties=properties, **kwargs)
        self.dead_lettered += 1

    def close(self) -> None:
        for producer in self._producers.values():
            producer.close()
        self._consumer.close()

    def __getattr__(self, name):   # is_connected, unsubscribe, ...: the consumer's own
        return getattr(self._consumer, name)


# ---- B12: an input the broker stopped dispatching to ----------------------------------------------

STALL_IDLE_S = 10.0        # waited in receive() with nothing this long before the broker is asked
STALL_MAX_CHECK_S = 300.0  # an idle input asks again after 1, 2, 4, ... times STALL_IDLE_S, at most this
STALL_METRICS_TTL_S = 2.0  # one /metrics read answers every fenced input of those topics this long


class StallFence:
    """B12 fence, one per worker on pulsar-lite (`for_broker`): an input that has waited `idle_s` in receive()
    with nothing while the broker reports a backlog on its subscription and no unacknowledged message there
    (no consumer holds anything, so the broker is not dispatching what it has) is closed and reopened: a
    fresh consumer gets the backlog (docs/broker.md B12). `reopens` counts them per (topic, subscription)."""

    def __init__(self, metrics_url: str, idle_s: float = STALL_IDLE_S):
        self.metrics_url = metrics_url
        self.idle_s = idle_s
        self.reopens: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._readings: dict[tuple[str, ...], tuple[float, object]] = {}   # topics -> (read at, BrokerMetrics)

    @classmethod
    def for_broker(cls, broker_kind: str, metrics_url: str | None) -> "StallFence | None":
        """Only on pulsar-lite, and only with its /metrics to ask; None (no fence) otherwise."""
        if broker_kind != "pulsar-lite" or not metrics_url:
            return None
        return cls(metrics_url)

    def watch(self, open_consumer: Callable[[], object], topics, subscription: str) -> "StalledInputWatch":
        return StalledInputWatch(self, open_consumer, tuple(topics), subscription)

    def stalled_topic(self, topics: tuple[str, ...], subscription: str) -> tuple[str, float] | None:
        """(topic, backlog entries) of a topic whose subscription has a backlog and nothing unacked, or None."""
        from pulsar_autoscale.broker.metrics import fetch

        with self._lock:
            read_at, reading = self._readings.get(topics, (float("-inf"), None))
            if time.monotonic() - read_at > STALL_METRICS_TTL_S:
                reading = fetch(self.metrics_url, time.time(), topics=topics)
                self._readings[topics] = (time.monotonic(), reading)
        for topic in topics:
            backlog = reading.backlog.get((topic, subscription), 0.0)
            if backlog > 0 and reading.unacked.get((topic, subscription)) == 0:
                return topic, backlog
        return None

    def count(self, topic: str, subscription: str) -> int:
        with self._lock:
            n = self.reopens[(topic, subscription)] = self.reopens.get((topic, subscription), 0) + 1
            return n


def fence_stalls(open_consumer: Callable[[], object], topics, subscription: str, fence: StallFence | None):
    """The function's input, watched by the worker's StallFence (B12) on pulsar-lite; elsewhere as it opens."""
    return open_consumer() if fence is None else fence.watch(open_consumer, topics, subscription)


class StalledInputWatch:
    """An input consumer under a StallFence: the consumer's methods (others pass through); receive() counts
    the time it waited with nothing, and past the fence's idle_s asks the broker and reopens when stalled.
    It reopens only when the broker holds no unacked message on the subscription, so no message this
    consumer handed out is left to ack on the consumer it replaces."""

    def __init__(self, fence: StallFence, open_consumer: Callable[[], object], topics: tuple[str, ...],
                 subscription: str):
        self._fence = fence
        self._open = open_consumer
        self.topics = topics
        self.subscription = subscription
        self._consumer = open_consumer()
        self._waited = 0.0                  # seconds spent in receive() with nothing since the last message
        self._check_after = fence.idle_s    # the next broker check, in seconds waited

    def receive(self, timeout_millis: int):
        t0 = time.monotonic()
        try:
            msg = self._consumer.receive(timeout_millis)
        except pulsar.Timeout:
            self._waited += time.monotonic() - t0
            if self._waited >= self._check_after:
                self._check()
            raise
        self._waited, self._check_after = 0.0, self._fence.idle_s
        return msg

    def _check(self) -> None:
        self._check_after = min(self._check_after * 2, self._waited + STALL_MAX_CHECK_S)
        try:
            stalled = self._fence.stalled_topic(self.topics, self.subscription)
        except PulsarAutoscaleError as exc:   # metrics unreadable: the input goes on as it is
            log.debug("stall fence: %s", exc)
            return
        if stalled is None:
            return
        topic, backlog = stalled
        fresh = self._open()
        old, self._consumer = self._consumer, fresh
        try:
            old.close()
        except pulsar.PulsarException as exc:
            log.debug("stall fence: closing the stalled consumer: %s", exc)
        n = self._fence.count(topic, self.subscription)
        log.warning("pulsar-lite B12: the input on subscription %r of %s received nothing for %.0f s while the broker "
                    "reports a backlog of %d entries and nothing unacknowledged; reopened its consumer (reopen %d of "
                    "this subscription on this worker)", self.subscription, topic, self._waited, backlog, n)
        self._waited, self._check_after = 0.0, self._fence.idle_s

    def acknowledge(self, msg) -> None:
        self._consumer.acknowledge(msg)

    def negative_acknowledge(self, msg) -> None:
        self._consumer.negative_acknowledge(msg)

    def close(self) -> None:
        self._consumer.close()

    def __getattr__(self, name):   # is_connected, unsubscribe, seek, ...: the current consumer's own
        return getattr(self._consumer, name)


# ---- consumer-id floors: every client incarnation gets ids no other live client uses ------------

# A floor is a block of consumer ids: slot k's client numbers its consumers from k * ID_BLOCK.
ID_BLOCK = 1024
MAX_SLOTS = 16
PROBE_BATCH = 4
SETTLE_S = 0.05
SLOT_TOPIC = "persistent://public/default/__pulsar_autoscale_idslot-{}"
SLOT_SUBSCRIPTION = "holder"
# A join's client: the worker's timeout (functions/worker/worker.py). A 5 s one, left from a design that retried
# id collisions, was passed by padding under load (docs/spark-burst.md).
JOIN_OPERATION_TIMEOUT_S = 30
JOIN_ATTEMPTS = 3


class LiteJoinError(PulsarAutoscaleError):
    """A client could not get consumer ids of its own, or could not join with them: says which step failed."""


class _SlotLock:
    """Slot k is held by an Exclusive subscription on its own client, as the controller's leader lock.

    The broker frees it the moment the holder's connection ends (close, exit or kill -9; through
    the embedded broker's relay a kill -9 is a clean close too, B10), and with it the holder's
    consumers: a freed slot's ids are free. A refused subscribe drops that client's connection
    (B3), so each probe has a client of its own with a 1 s operation timeout.
    """

    def __init__(self, settings: ClientSettings | str, slot: int):
        self.slot = slot
        self._client = open_client(settings, operation_timeout_seconds=1)
        try:
            self._client.subscribe(SLOT_TOPIC.format(slot), SLOT_SUBSCRIPTION,
                                   consumer_type=pulsar.ConsumerType.Exclusive, receiver_queue_size=1)
        except pulsar.PulsarException:
            self._client.close()
            raise

    def release(self) -> None:
        try:
            self._client.close()
        except pulsar.PulsarException:
            pass


def _take_slot(settings: ClientSettings | str) -> _SlotLock:
    """A free slot, probing PROBE_BATCH slots at a time in parallel: a held one only answers after
    its 1 s timeout, so we take the lowest slot acquired within SETTLE_S of the first success
    (and release the others, late ones included)."""
    for first in range(0, MAX_SLOTS, PROBE_BATCH):
        results: queue.Queue = queue.Queue()

        def probe(k: int) -> None:
            try:
                results.put(_SlotLock(settings, k))
            except pulsar.PulsarException:
                results.put(None)

        for k in range(first, first + PROBE_BATCH):
            threading.Thread(target=probe, args=(k,), daemon=True).start()
        got: list[_SlotLock] = []
        answered = 0
        while answered < PROBE_BATCH:
            try:
                lock = results.get(timeout=SETTLE_S if got else None)
            except queue.Empty:
                break
            answered += 1
            if lock is not None:
                got.append(lock)
        if got:
            got.sort(key=lambda lock: lock.slot)
            for extra in got[1:]:
                extra.release()
            threading.Thread(target=_release_late, args=(results, PROBE_BATCH - answered), daemon=True).start()
            return got[0]
    raise LiteJoinError(f"no consumer-id floor could be taken: all {MAX_SLOTS} slot locks "
                        f"({SLOT_TOPIC.format('*')}) refused or did not answer within 1 s (held by live clients, "
                        "or the broker is that slow)")


def _release_late(results: queue.Queue, pending: int) -> None:
    for _ in range(pending):
        lock = results.get()
        if lock is not None:
            lock.release()


class IncarnationClient(pulsar.Client):
    """A pulsar.Client whose consumer ids start at its incarnation's floor; close() frees the floor."""

    floor: int = 0
    _slot: _SlotLock | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._slot is not None:
                self._slot.release()
                self._slot = None


def incarnation_client(settings: ClientSettings | str, broker_kind: str, **client_kwargs) -> IncarnationClient:
    """A client for one incarnation of a worker, a drain or any other process that consumes a Shared
    subscription next to others (B2): on pulsar-lite its consumer ids start at a floor that no live
    client on the broker uses; on Apache Pulsar it is a plain client (floor 0).

    pulsar-lite tracks consumer ids per subscription, not per connection, and every client numbers its
    consumers from 0. The floor comes from the lowest free slot lock (_SlotLock), held until close();
    the client's id counter is moved to it by padding (_pad_consumer_ids: about 0.4 s per 1024 ids,
    so slot 0, the first client, costs nothing). A client that opens more than ID_BLOCK consumers in
    its life walks into the next slot's ids (docs/broker.md).
    """
    slot = _take_slot(settings) if broker_kind == "pulsar-lite" else None
    try:
        client = open_client(settings, client_class=IncarnationClient, **client_kwargs)
    except Exception:
        if slot is not None:
            slot.release()
        raise
    client._slot = slot
    if slot is not None:
        client.floor = slot.slot * ID_BLOCK
        subscription = PAD_SUBSCRIPTION.format(slot.slot)
        try:
            _pad_consumer_ids(client, client.floor, subscription)
        except pulsar.PulsarException as exc:
            client.close()
            raise LiteJoinError(f"moving this client's consumer ids to its floor {client.floor} (slot {slot.slot}: "
                                f"subscribes as {subscription} on {PAD_TOPIC.format('*')}) failed: "
                                f"{type(exc).__name__} {exc}") from exc
        except Exception:
            client.close()
            raise
        log.info("pulsar-lite: consumer ids of this client start at %d (slot %d)", client.floor, slot.slot)
    return client


def join_shared_subscription(settings: ClientSettings | str, subscribe: Callable[[pulsar.Client], pulsar.Consumer],
                             what: str, operation_timeout_s: int = JOIN_OPERATION_TIMEOUT_S,
                             attempts: int = JOIN_ATTEMPTS) -> tuple[pulsar.Client, pulsar.Consumer]:
    """A second client on a Shared subscription (the burst drain's driver) on pulsar-lite: an
    incarnation client, so its consumer ids differ from every other live client's. Returns
    (client, consumer); closing the client frees its floor. `what` names the subscription in errors.

    A join that times out (a slot probe, the padding or the subscribe, under CPU load) is retried on a
    fresh client, `attempts` in all; then LiteJoinError says which step of `what` timed out.

    tests/system/spark/test_burst.py counts every message of repeated joins next to a consuming instance, and
    tests/integration/broker_conformance/test_incarnations.py N processes joining and leaving.
    """
    for attempt in range(1, attempts + 1):
        try:
            client = incarnation_client(settings, "pulsar-lite", operation_timeout_seconds=operation_timeout_s)
        except LiteJoinError as exc:
            error = exc
        else:
            try:
                return client, subscribe(client)
            except pulsar.Timeout as exc:
                error = LiteJoinError(f"subscribing (consumer ids from {client.floor}) timed out after "
                                      f"{operation_timeout_s} s ({exc})")
                client.close()
            except Exception:
                client.close()
                raise
        if attempt < attempts:
            log.warning("pulsar-lite: %s, attempt %d of %d: %s; retrying on a fresh client", what, attempt,
                        attempts, error)
    raise LiteJoinError(f"pulsar-lite: {what}: {attempts} attempts failed, the last: {error}")


# The scratch topics that padding subscribes to, and the subscription of slot k on them.
PAD_TOPIC = "persistent://public/default/__burst-idpad-{}"
PAD_SUBSCRIPTION = "__idpad-slot{}"


def _pad_consumer_ids(client: pulsar.Client, count: int, subscription: str, chunk: int = 256) -> None:
    """Use up `count` consumer ids of `client`: subscribe to scratch topics, then unsubscribe.

    `subscription` is the slot's own (PAD_SUBSCRIPTION): pulsar-lite never forgets a subscription name
    (B14: its series stay, and creating a new one slows as they pile up), so a fresh name per client
    added 256 at every join, and padding slowed with them (1.7 s to 5.3 s over 12 joins under load)
    until a subscribe passed the drain's 5 s operation timeout. One name per slot bounds them to 256
    per slot; only the slot's holder pads on it, so two paddings never share consumer ids on it (B2).
    """
    done = 0
    while done < count:
        n = min(chunk, count - done)
        pad = client.subscribe([PAD_TOPIC.format(i) for i in range(n)], subscription,
                               consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1)
        try:
            pad.unsubscribe()
        except pulsar.PulsarException:
            pad.close()
        done += n


# ---- keyedState functions (functions/keyed/routing.py) -------------------------------------------------

def keyed_subscription_type(subscription_type: str, broker_kind: str) -> str:
    """The subscription type of a keyedState function's worker consumer (routing.keyed_subscription_type).

    On pulsar-lite it is SHARED, never KEY_SHARED: Key_Shared leaves a closed consumer's unacked
    messages stuck (B4: a worker that leaves would strand them), and sticky hash ranges aligned to
    key groups lose messages of pipelined producers (B11: 183-253 of 400). Shared redelivers a
    closed consumer's messages (tests/integration/broker_conformance/test_shared.py), and the worker's router
    keeps each key's records in receive order on the worker. On Apache Pulsar it is unchanged.
    """
    return "SHARED" if broker_kind == "pulsar-lite" else subscription_type


def route_subscription_type(broker_kind: str) -> str:
    """The subscription of a keyedState instance's route topic on a cluster (functions/keyed/cluster.py):
    one consumer at a time, in order. On Apache Pulsar FAILOVER (a dead consumer's unacked messages go
    to the next one, in order). On pulsar-lite SHARED with its one consumer: a Failover subscription
    there delivers messages twice with a receiver queue of 10 or more (B1) and never redelivers a nacked
    message (B13), while Shared redelivers both a nacked message and a closed consumer's unacked ones
    (tests/integration/broker_conformance/test_shared.py). Break before make keeps one consumer per route topic."""
    return "Shared" if broker_kind == "pulsar-lite" else "Failover"


# ---- B15: the metrics server (broker/embedded.py) -----------------------------------------------------

def metrics_server_lost(broker_log: str) -> bool:
    """B15: pulsar-lite whose metrics port is taken logs this and runs on without /metrics (Apache Pulsar's
    broker does not start without its web port): the embedded broker's start fails instead, naming the port,
    or picks another port when it picked that one."""
    return "Metrics server terminated" in broker_log


# ---- B16: readers (functions/state/changelog.py) ------------------------------------------------------------

MIN_READER_QUEUE = 2


def reader_queue(size: int) -> int:
    """B16: a pulsar-lite reader with a receiver queue of 1 that starts from a message id gets nothing (from the
    earliest it reads). From 2 up it reads everything, with more duplicates, which our readers skip. A queue of
    2 instead of 1 changes nothing on Apache Pulsar."""
    return max(MIN_READER_QUEUE, size)
