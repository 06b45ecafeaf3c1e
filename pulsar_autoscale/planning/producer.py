"""The live testbed's load: a producer paced by a token bucket, whose rate can change mid-run, in one or more
processes; what the broker acknowledged is what was injected."""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass


@dataclass
class TokenBucket:
    """Paces sends at `rate`/s; at most `burst_s` worth of tokens accumulate, so a producer that was
    held up cannot catch up with a burst: it falls short, and the run shows it (invalid)."""

    rate: float
    burst_s: float = 0.2
    tokens: float = 0.0
    last: float | None = None

    def take(self, now: float) -> int:
        if self.last is not None:
            self.tokens = min(self.tokens + (now - self.last) * self.rate, max(1.0, self.rate * self.burst_s))
        self.last = now
        n = int(self.tokens)
        self.tokens -= n
        return n

    def wait_s(self) -> float:
        return min(0.05, (1.0 - self.tokens) / self.rate) if self.rate > 0 else 0.05


def _pace(service_url: str, topic: str, rate, acked, stop, share: float, batching: bool) -> None:
    """One producer loop (a thread or a process): `rate` (shared, source messages/s of all producers)
    times `share` is this one's; `acked` counts messages the broker acknowledged."""
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(
        topic, batching_enabled=batching, block_if_queue_full=True, max_pending_messages=10000, batching_max_publish_delay_ms=1
    )

    def done(res, _msg_id):
        if res == pulsar.Result.Ok:
            with acked.get_lock():
                acked.value += 1

    bucket = TokenBucket(rate.value * share)
    try:
        while not stop.is_set():
            want = rate.value * share
            if want != bucket.rate:
                bucket = TokenBucket(want, last=time.monotonic())
            for _ in range(bucket.take(time.monotonic())):
                producer.send_async(b"x", done, event_timestamp=int(time.time() * 1000))
            time.sleep(bucket.wait_s())
        producer.flush()
    finally:
        client.close()


class PacedProducer:
    """A rate-limited producer whose rate changes mid-run; `processes` > 1 spreads it over processes
    when one interpreter cannot reach the rate."""

    def __init__(self, service_url: str, topic: str, processes: int = 1, batching: bool = False):
        ctx = multiprocessing.get_context("spawn")
        self._rate = ctx.Value("d", 0.0, lock=False)
        self._acked = ctx.Value("q", 0)
        self._stop = ctx.Event()
        args = lambda n: (service_url, topic, self._rate, self._acked, self._stop, 1.0 / n, batching)  # noqa: E731
        self._workers: list[threading.Thread | multiprocessing.process.BaseProcess]
        if processes <= 1:
            self._workers = [threading.Thread(target=_pace, args=args(1), daemon=True, name="plan-producer")]
        else:
            self._workers = [ctx.Process(target=_pace, args=args(processes), daemon=True) for _ in range(processes)]
        for w in self._workers:
            w.start()

    def set_rate(self, rate: float) -> None:
        self._rate.value = max(0.0, float(rate))

    @property
    def acked(self) -> int:
        return int(self._acked.value)

    def close(self) -> None:
        self.set_rate(0.0)
        self._stop.set()
        for w in self._workers:
            w.join(15)
