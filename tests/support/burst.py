"""The burst drain's scenarios, shared by its tests and bench/: the sleepy function, batched input, a drain
that joins the function's Shared subscription from a client of its own."""

from __future__ import annotations

import threading
import time
from typing import Callable

import pulsar

from functions.model.config import FunctionConfig
from functions.spark.burst_drain import _ends_entry, _subscribe
from pulsar_autoscale.broker.lite.incarnation import incarnation_client, join_shared_subscription
from pulsar_autoscale.broker.profile import LITE


def sleepy_config(name: str, **extra) -> dict:
    """The sleepy example in public/default, from `{name}-in` to `{name}-out`; `extra` adds or overrides."""
    return {
        "tenant": "public",
        "namespace": "default",
        "name": name,
        "className": "sleepy.Sleepy",
        "inputs": [f"persistent://public/default/{name}-in"],
        "output": f"persistent://public/default/{name}-out",
        "parallelism": 1,
        **extra,
    }


def produce_batched(client: pulsar.Client, topic: str, n: int, each: Callable[[int], dict] | None = None) -> None:
    """Payloads b'0'..b'n-1' in batches no larger than a consumer's receiver queue: on pulsar-lite a Shared
    subscription with two consumers stalls once an entry holds more messages than that (docs/spark-burst.md).
    `each(i)`: the keywords of message i's send (a key, properties, an event time)."""
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_publish_delay_ms=5, batching_max_messages=100, block_if_queue_full=True
    )
    for i in range(n):
        producer.send_async(str(i).encode(), None, **(each(i) if each else {}))
    producer.flush()
    producer.close()


def join_and_take(service_url: str, cfg: FunctionConfig, drain: str, at_least: int) -> list[pulsar.Message]:
    """A drain joins the function's Shared subscription on a client of its own (lite.incarnation, B2), receives
    at least `at_least` messages up to the end of an entry (or until 1 s passes with nothing), acks them and
    leaves: what the burst drain does to the subscription, without Spark."""
    client, consumer = join_shared_subscription(service_url, lambda c: _subscribe(c, cfg, drain, 100), drain)
    got: list[pulsar.Message] = []
    try:
        while len(got) < at_least or not _ends_entry(got[-1]):
            try:
                got.append(consumer.receive(1000))
            except pulsar.Timeout:
                break
        for msg in got:
            consumer.acknowledge(msg)
    finally:
        consumer.close()
        client.close()
    return got


class SlowInstance:
    """An instance of the function on a client of its own (a floor of its own, as a worker's: B2) that takes 4 ms a
    message while drains join (so every drain finds a backlog: at 1 ms a fast broker's instance took all that was
    left before the fifth drain of a loaded machine joined) and 1 ms once `drained` is set. `counts` holds what
    it and the drains received (a payload twice is a duplicate)."""

    def __init__(self, service_url: str, cfg: FunctionConfig):
        self.client = incarnation_client(service_url, LITE)
        self.cfg = cfg
        self.consumer = self._open()
        self.counts: dict[bytes, int] = {}
        self.last = time.monotonic()  # when the last message was counted
        self.lock, self.stop, self.drained = threading.Lock(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._consume, daemon=True)
        self.thread.start()

    def _open(self) -> pulsar.Consumer:
        return self.client.subscribe(
            list(self.cfg.inputs), self.cfg.subscription_name, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=100
        )

    def count(self, msg) -> None:
        with self.lock:
            self.counts[msg.data()] = self.counts.get(msg.data(), 0) + 1
            self.last = time.monotonic()

    def _consume(self) -> None:
        while not self.stop.is_set():
            consumer = self.consumer
            try:
                msg = consumer.receive(100)
            except pulsar.PulsarException:  # a timeout, or the consumer a reopen just closed
                continue
            time.sleep(0.001 if self.drained.is_set() else 0.004)
            self.count(msg)
            try:
                consumer.acknowledge(msg)
            except pulsar.PulsarException:
                pass  # closed by a reopen meanwhile: the subscription redelivers it (a duplicate, not a loss)

    def reopen(self, close_first: bool) -> None:
        """Replace the consumer, closing the old one before or after the new one opens; `idle_s` counts anew."""
        old = self.consumer
        if close_first:
            old.close()
            self.consumer = self._open()
        else:
            self.consumer = self._open()
            old.close()
        with self.lock:
            self.last = time.monotonic()

    def idle_s(self) -> float:
        with self.lock:
            return time.monotonic() - self.last

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.consumer.close()
        self.client.close()


def lite_joins(
    service_url: str, cfg: FunctionConfig, instance: SlowInstance, drains: int = 5, per_drain: int = 1000
) -> list[int]:
    """`drains` drains join and leave the instance's subscription one after another, each taking at least
    `per_drain` messages (counted with the instance's); then the instance goes faster. Returns what each took."""
    taken = []
    for i in range(drains):
        got = join_and_take(service_url, cfg, f"drain-{i}", per_drain)
        for msg in got:
            instance.count(msg)
        taken.append(len(got))
    instance.drained.set()
    return taken
