"""Cluster scenarios shared by tests/system/cluster (which assert) and the issue's "Show" numbers (which print)."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

import pulsar

from pulsar_autoscale.admin.client import FunctionsAdmin
from tests.support.scenario import EXAMPLES, OutputCollector, wait_until


class TimedCollector(OutputCollector):
    """The longest gap in processing, from the arrival times OutputCollector notes."""

    def longest_gap_s(self, start: float, end: float) -> float:
        ts = [t for t in self.times if start <= t <= end]
        return max((b - a for a, b in zip(ts, ts[1:])), default=end - start)


RECEIVER_QUEUE = 50


@dataclass
class Flow:
    """A sleepy function fed at `rate` msg/s, its outputs counted; one admin client per worker URL."""

    service_url: str
    admin_urls: list[str]
    rate: float = 500.0
    service_ms: float = 5.0
    parallelism: int = 1
    batching: bool = True
    name: str = field(default_factory=lambda: f"cl-{uuid.uuid4().hex[:6]}")

    def __post_init__(self):
        self.admins = [FunctionsAdmin(u, timeout_s=20) for u in self.admin_urls]
        self.src = f"persistent://public/default/{self.name}-in"
        self.dst = f"persistent://public/default/{self.name}-out"
        self.client = pulsar.Client(self.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        self.collector = TimedCollector(self.client, self.dst)
        self.sent = 0
        self._producer = None
        self._sender: threading.Thread | None = None

    def admin(self, i: int = 0) -> FunctionsAdmin:
        return self.admins[i % len(self.admins)]

    def create(self, via: int = 0) -> None:
        self.admin(via).create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": self.name,
                "className": "sleepy.Sleepy",
                "inputs": [self.src],
                "output": self.dst,
                "parallelism": self.parallelism,
                "receiverQueueSize": RECEIVER_QUEUE,
                "userConfig": {"service_ms": self.service_ms, "dist": "deterministic"},
            },
            str(EXAMPLES / "sleepy.py"),
        )

    def status(self, via: int = 0) -> dict:
        return self.admin(via).status("public", "default", self.name)

    def scale(self, parallelism: int, via: int = 0) -> None:
        self.admin(via).set_parallelism("public", "default", self.name, parallelism)

    def wait_running(self, n: int, timeout_s: float = 60.0, via: int = 0) -> dict:
        def ok():
            st = self.status(via)
            return st if st["numInstances"] == n and st["numRunning"] == n else None

        return wait_until(ok, timeout_s, f"{n} running instances of {self.name}", interval_s=0.1)

    def start_producing(self, messages: int) -> None:
        # Batches no larger than the receiver queue: pulsar-lite stalls a Shared subscription on larger ones once a
        # second consumer (a burst drain) stops receiving (docs/spark-burst.md; CI: the drain took 0, 676 lost).
        self._producer = self.client.create_producer(
            self.src,
            batching_enabled=self.batching,
            batching_max_publish_delay_ms=5,
            batching_max_messages=RECEIVER_QUEUE,
            block_if_queue_full=True,
        )

        def produce():
            t0 = time.monotonic()
            for i in range(messages):
                delay = t0 + i / self.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                self._producer.send_async(str(i).encode(), None)
                self.sent = i + 1
            self._producer.flush()

        self._sender = threading.Thread(target=produce, daemon=True)
        self._sender.start()

    def finish(self, messages: int, timeout_s: float = 120.0) -> tuple[int, int]:
        """(lost, duplicates) once every input produced an output or the timeout passed."""
        self._sender.join(timeout_s)
        try:
            wait_until(
                lambda: self.collector.distinct() >= messages,
                timeout_s,
                lambda: f"all {messages} outputs of {self.name} (got {self.collector.distinct()})",
                interval_s=0.1,
            )
        except AssertionError:
            pass
        return messages - self.collector.distinct(), self.collector.duplicates()

    def missing(self, messages: int) -> list[int]:
        seen = {int(k) for k in self.collector.counts}
        return sorted(set(range(messages)) - seen)

    def close(self) -> None:
        try:
            self.admin().delete("public", "default", self.name)
        except Exception:
            pass
        self.collector.close()
        if self._producer is not None:
            self._producer.close()
        self.client.close()


def per_worker(status: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for inst in status["instances"]:
        wid = inst["status"].get("workerId", "")
        out[wid] = out.get(wid, 0) + 1
    return out
