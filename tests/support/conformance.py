"""Shared helpers for the broker conformance tests (and, run as a script, the child processes they start).

Only pulsar-client, requests and prometheus-client are used here: the tests check the
broker, not our code, so the child processes must not import the project either.
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import sys
import threading
import time
from typing import Callable, Iterator, TypeVar

import pulsar

T = TypeVar("T")

QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


def make_client(service_url: str, op_timeout_s: int = 5) -> pulsar.Client:
    """A client whose failures surface within op_timeout_s (lite turns refusals into timeouts, B3)."""
    return pulsar.Client(service_url, operation_timeout_seconds=op_timeout_s, logger=QUIET)


@contextlib.contextmanager
def client(service_url: str, op_timeout_s: int = 5) -> Iterator[pulsar.Client]:
    c = make_client(service_url, op_timeout_s)
    try:
        yield c
    finally:
        c.close()


def produce(client_: pulsar.Client, topic: str, n: int, batching: bool = False, **send_kw) -> list[pulsar.MessageId]:
    """Send payloads b'0'..b'n-1' asynchronously (as our runtime does) and return their ids in order.

    block_if_queue_full: without it send_async silently drops past 1000 pending messages.
    """
    producer = client_.create_producer(
        topic, batching_enabled=batching, block_if_queue_full=True, batching_max_publish_delay_ms=5
    )
    ids: list[pulsar.MessageId | None] = [None] * n
    errors: list[object] = []

    def done(i: int):
        def callback(res, mid):
            if res == pulsar.Result.Ok:
                ids[i] = mid
            else:
                errors.append(res)

        return callback

    try:
        for i in range(n):
            producer.send_async(b"%d" % i, done(i), **send_kw)
        producer.flush()
    finally:
        producer.close()
    assert not errors, f"{len(errors)} of {n} sends failed, first: {errors[0]}"
    assert not any(mid is None for mid in ids), "flush returned before every send was acknowledged"
    return ids


def drain(
    consumer, idle_ms: int = 500, ack: bool = True, limit: int | None = None, first_ms: int | None = None
) -> list[pulsar.Message]:
    """Receive until nothing arrives for idle_ms (or limit messages), acking unless told not to. first_ms: how
    long to wait for the first message (Apache Pulsar starts a new Failover consumer after
    activeConsumerFailoverDelayTimeMillis, 1 s by default)."""
    out: list[pulsar.Message] = []
    while limit is None or len(out) < limit:
        try:
            msg = consumer.receive(first_ms if first_ms is not None and not out else idle_ms)
        except pulsar.Timeout:
            break
        out.append(msg)
        if ack:
            consumer.acknowledge(msg)
    return out


def payloads(messages) -> list[int]:
    return [int(m.data()) for m in messages]


def wait_for(probe: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.25) -> T:
    """Poll probe() until it returns a truthy value; fail naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last probe: {last!r}")
        time.sleep(interval_s)


# ---------------------------------------------------------------- /metrics


def scrape(metrics_url: str) -> dict[tuple[str, frozenset], float]:
    """Parse the Prometheus text page into {(name, labels): value}."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(metrics_url, timeout=5).text
    out: dict[tuple[str, frozenset], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def topic_label(topic: str) -> str:
    """pulsar-lite labels a topic by its local name ('t-abc'), not the full persistent:// URL."""
    return topic.rsplit("/", 1)[-1]


def metric(samples: dict, name: str, topic: str, subscription: str | None = None) -> float | None:
    """The sample of `name` for this topic (and subscription), or None when the broker does not expose it."""
    for (n, labels), value in samples.items():
        lab = dict(labels)
        if n != name or lab.get("topic") not in (topic, topic_label(topic)):
            continue
        if subscription is None or lab.get("subscription") == subscription:
            return value
    return None


# ---------------------------------------------------------------- child processes


class Child:
    """A helper process (this file run as a script) that reports on stdout, one word per line."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.PIPE, text=True
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def expect(self, timeout_s: float) -> str:
        """The next line, or fail if none comes within timeout_s."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"child {self.proc.args[2:]} said nothing within {timeout_s}s") from None
        if line is None:
            raise AssertionError(f"child {self.proc.args[2:]} exited ({self.proc.wait()}) without reporting")
        return line

    def lines_until_exit(self, timeout_s: float) -> list[str]:
        out, deadline = [], time.monotonic() + timeout_s
        while (line := self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))) is not None:
            out.append(line)
        return out

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _child_hold_exclusive(url: str, topic: str, sub: str) -> None:
    c = make_client(url, 2)
    c.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Exclusive)
    print("HELD", flush=True)
    sys.stdin.read()  # hold until killed or stdin closes


def _child_join_shared(url: str, topic: str, sub: str, pad: str, op_timeout: str, idle_ms: str) -> None:
    """Open `pad` throwaway consumers (the B2 workaround when pad > 0), join the Shared
    subscription, then receive and ack, printing each payload, until idle."""
    c = make_client(url, int(op_timeout))
    scratch = topic + "-idpad"
    for i in range(int(pad)):
        c.subscribe(scratch, f"pad-{i}").close()
    try:
        consumer = c.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared)
    except pulsar.PulsarException as exc:
        print(f"FAILED {type(exc).__name__}", flush=True)
        return
    print("JOINED", flush=True)
    got_any = False
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            msg = consumer.receive(int(idle_ms))
        except pulsar.Timeout:
            if got_any:
                break
            continue
        got_any = True
        consumer.acknowledge(msg)
        print(f"GOT {int(msg.data())}", flush=True)
    c.close()


if __name__ == "__main__":
    role, *rest = sys.argv[1:]
    {"hold-exclusive": _child_hold_exclusive, "join-shared": _child_join_shared}[role](*rest)
