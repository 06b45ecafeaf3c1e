"""The one place that knows about pulsar-lite's defects (docs/broker.md, tests/broker_conformance/).

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

The burst drain's driver (spark_bridge/burst.py) has to be a second client on the function's
subscription: `join_shared_subscription` pads its consumer ids past the worker's.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass
from typing import Callable

import pulsar
import requests

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError

log = logging.getLogger(__name__)

LITE_MARKER = 'cluster="pulsar-lite"'


def detect_broker_kind(metrics_url: str | None, timeout_s: float = 2.0) -> str:
    """'pulsar-lite' when the broker's /metrics says so, else 'apache' (no metrics: assume a real cluster)."""
    if not metrics_url:
        return "apache"
    try:
        text = requests.get(metrics_url, timeout=timeout_s).text
    except requests.RequestException as exc:
        log.warning("cannot read broker metrics at %s (%s); assuming Apache Pulsar", metrics_url, exc)
        return "apache"
    return "pulsar-lite" if LITE_MARKER in text else "apache"


class SharedInput:
    """One consumer for all instances of a function on this worker, opened on first use, closed after the last."""

    def __init__(self, open_consumer: Callable[[], pulsar.Consumer]):
        self._open = open_consumer
        self._consumer: pulsar.Consumer | None = None
        self._users = 0
        self._lock = threading.Lock()

    def lease(self) -> "InputLease":
        with self._lock:
            if self._consumer is None:
                self._consumer = self._open()
            self._users += 1
            return InputLease(self, self._consumer)

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._consumer is not None:
                self._consumer.close()
                self._consumer = None


class InputLease:
    """What an instance holds instead of its own consumer: same methods, close() only releases."""

    def __init__(self, shared: SharedInput, consumer: pulsar.Consumer):
        self._shared = shared
        self._consumer = consumer
        self._closed = False

    def receive(self, timeout_millis: int):
        return self._consumer.receive(timeout_millis=timeout_millis)

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

    B9: it cannot list a namespace's topics (GetTopicsOfNamespace times out), so a regex subscription
    (topicsPattern) never opens. B5: seek is ignored, so skipToLatest would silently not skip."""
    if cfg.topicsPattern:
        raise ConfigError("topicsPattern is not supported on pulsar-lite (it cannot list a namespace's topics, "
                          "defect B9 in docs/broker.md): list the topics in inputs, or run on Apache Pulsar")
    if cfg.skipToLatest:
        raise ConfigError("skipToLatest is not supported on pulsar-lite (it ignores seek, defect B5 in "
                          "docs/broker.md): run on Apache Pulsar")


# ---- process instances: messages cross a pipe, acks come back ----------------------------------

@dataclass(frozen=True)
class PipedMessage:
    """The parts of a pulsar.Message that an instance and its Context read, picklable."""

    key: int
    _data: bytes
    _properties: dict
    _publish_ms: int
    _event_ms: int
    _partition_key: str
    _topic: str
    _message_id: str

    def data(self) -> bytes:
        return self._data

    def properties(self) -> dict:
        return self._properties

    def publish_timestamp(self) -> int:
        return self._publish_ms

    def event_timestamp(self) -> int:
        return self._event_ms

    def partition_key(self) -> str:
        return self._partition_key

    def topic_name(self) -> str:
        return self._topic

    def message_id(self) -> str:
        return self._message_id


def serve_pipe(conn, lease: InputLease) -> None:
    """Worker side, one thread per process instance: receive on its behalf, ack what it acks.

    Whatever the process took but never acked when it exits is negative-acked, so it is
    redelivered to the surviving instances.
    """
    outstanding: dict[int, pulsar.Message] = {}
    next_key = 0
    try:
        while True:
            try:
                op, arg = conn.recv()
            except (EOFError, OSError):
                return
            if op == "recv":
                try:
                    msg = lease.receive(arg)
                except pulsar.Timeout:
                    conn.send(None)
                    continue
                next_key += 1
                outstanding[next_key] = msg
                conn.send(PipedMessage(next_key, msg.data(), msg.properties(), msg.publish_timestamp(),
                                       msg.event_timestamp(), msg.partition_key(), msg.topic_name(),
                                       str(msg.message_id())))
            elif op == "ack":
                lease.acknowledge(outstanding.pop(arg))
            elif op == "nack":
                lease.negative_acknowledge(outstanding.pop(arg))
            elif op == "close":
                return
    finally:
        for msg in outstanding.values():
            lease.negative_acknowledge(msg)
        lease.close()


class PipeConsumer:
    """Process side: the consumer interface the instance loop uses, served by serve_pipe."""

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.Lock()  # acks come from producer callbacks on other threads

    def receive(self, timeout_millis: int):
        with self._lock:
            self._conn.send(("recv", timeout_millis))
            msg = self._conn.recv()
        if msg is None:
            raise pulsar.Timeout()
        return msg

    def acknowledge(self, msg: PipedMessage) -> None:
        with self._lock:
            self._conn.send(("ack", msg.key))

    def negative_acknowledge(self, msg: PipedMessage) -> None:
        with self._lock:
            self._conn.send(("nack", msg.key))

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.send(("close", None))
            except OSError:
                pass


# ---- a second client on a Shared subscription (the burst drain's driver) ----------------------

# Consumer ids a joining client skips: above every id the worker's client has used unless it
# ever opened more consumers than that.
DEFAULT_ID_FLOOR = 1024


class LiteJoinError(PulsarAutoscaleError):
    """Consumer id collisions kept the join from succeeding."""


def join_shared_subscription(service_url: str, subscribe: Callable[[pulsar.Client], pulsar.Consumer],
                             subscription: str, id_floor: int = DEFAULT_ID_FLOOR, operation_timeout_s: int = 5,
                             attempts: int = 3) -> tuple[pulsar.Client, pulsar.Consumer]:
    """B2 workaround: join a Shared subscription from a second connection; `subscribe(client)` opens
    the consumer. Returns (client, consumer).

    pulsar-lite tracks consumer ids per subscription, not per connection, and every client
    numbers its consumers from 0, so a second client's subscribe collides with the worker's
    consumers ("Consumer 0 already exists") and, through B3, times out. The client's ids are
    a counter, so opening `id_floor` throwaway consumers first makes ours `id_floor`.
    They are opened by multi-topic subscribes over up to 256 scratch topics (one round trip
    each, in parallel; the same topic names every time), on a subscription of their own that
    is removed at once, so concurrent joins do not collide on the scratch topics.
    A collision still possible (a worker with more consumers) shows as a timeout after
    `operation_timeout_s`: the floor doubles and we retry on a fresh client.

    The process runtime's version of this (instance i pads to id i) lost 4.7-7% of messages
    in scaling runs (docs/broker.md); for the burst drain, tests/spark/test_burst.py counts
    every message (loss 0 in every run so far) and bench/spark_burst.py reports loss on each run.
    """
    floor = id_floor
    last_exc: Exception | None = None
    for _ in range(attempts):
        client = pulsar.Client(service_url, operation_timeout_seconds=operation_timeout_s,
                               logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            _pad_consumer_ids(client, floor)
            return client, subscribe(client)
        except pulsar.Timeout as exc:  # B2 collision (B3 turns it into a timeout)
            last_exc = exc
            client.close()
            log.warning("joining %s on pulsar-lite with consumer ids >= %d timed out; retrying higher",
                        subscription, floor)
            floor *= 2
        except Exception:
            client.close()
            raise
    raise LiteJoinError(f"could not join subscription {subscription!r} on pulsar-lite "
                        f"(consumer id collisions up to id {floor // 2}): {last_exc}")


def _pad_consumer_ids(client: pulsar.Client, count: int, chunk: int = 256) -> None:
    """Use up `count` consumer ids of `client`: subscribe to scratch topics, then unsubscribe."""
    done = 0
    sub = f"__idpad-{uuid.uuid4().hex[:12]}"
    while done < count:
        n = min(chunk, count - done)
        topics = [f"persistent://public/default/__burst-idpad-{i}" for i in range(n)]
        pad = client.subscribe(topics, sub, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1)
        try:
            pad.unsubscribe()
        except pulsar.PulsarException:
            pad.close()
        done += n
