"""B12: under CPU load pulsar-lite may stop dispatching to a Shared consumer left alone after other
clients' joins; the fence reopens such an input.

Tests: tests/integration/broker_conformance/test_stalls.py (the fence on an input put in B12's state),
tests/system/spark/test_burst.py::test_repeated_lite_joins_lose_nothing (the defect, under load).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

import pulsar

from pulsar_autoscale.broker.profile import BrokerProfile
from pulsar_autoscale.errors import PulsarAutoscaleError

if TYPE_CHECKING:
    from pulsar_autoscale.broker.metrics import BrokerMetrics

log = logging.getLogger(__name__)

# Waited in receive() with nothing this long before the broker is asked. pulsar-lite refreshes its gauges every
# 5 s, and a reading serves STALL_METRICS_TTL_S: sooner, the reading could predate the input's last messages and
# show a backlog it has since consumed, which is a stall's picture (measured: backlog 179, 0 unacked for 1.7 s
# after all 199 were consumed).
STALL_IDLE_S = 8.0
STALL_MAX_CHECK_S = 300.0  # an idle input asks again after 1, 2, 4, ... times STALL_IDLE_S, at most this
STALL_METRICS_TTL_S = 2.0  # one /metrics read answers every fenced input of those topics this long


class StallFence:
    """B12 fence, one per worker on pulsar-lite (`for_broker`): an input that has waited `idle_s` in receive()
    with nothing while the broker reports a backlog on its subscription and no unacknowledged message there
    (no consumer holds anything, so the broker is not dispatching what it has) is closed and reopened: a
    fresh consumer gets part or all of the backlog, and the next stall is kicked the same way
    (docs/dev/pulsar-lite-defects.md B12). `reopens` counts them per (topic, subscription).
    A reopen that delivers nothing (still stalled at the next check) is a failure, not a quiet retry: `failure`
    names it for the function's status until a message arrives again (the input still reopens meanwhile)."""

    def __init__(self, metrics_url: str, idle_s: float = STALL_IDLE_S):
        self.metrics_url = metrics_url
        self.idle_s = idle_s
        self.reopens: dict[tuple[str, str], int] = {}
        self._failures: dict[tuple[str, str], str] = {}  # (topic, subscription) -> why its input is stuck
        self._lock = threading.Lock()
        self._read_lock = threading.Lock()  # one /metrics read at a time
        self._readings: dict[tuple[str, ...], tuple[float, BrokerMetrics]] = {}  # topics -> (read at, reading)

    @classmethod
    def for_broker(cls, broker: BrokerProfile, metrics_url: str | None) -> "StallFence | None":
        """Only where the broker stalls (pulsar-lite), and only with its /metrics to ask; None (no fence) otherwise."""
        if not broker.stall_fence or not metrics_url:
            return None
        return cls(metrics_url)

    def watch(self, open_consumer: Callable[[], pulsar.Consumer], topics, subscription: str) -> "StalledInputWatch":
        return StalledInputWatch(self, open_consumer, tuple(topics), subscription)

    def stalled_topic(self, topics: tuple[str, ...], subscription: str) -> tuple[str, float] | None:
        """(topic, backlog entries) of a topic whose subscription has a backlog and nothing unacked, or None."""
        from pulsar_autoscale.broker.metrics import fetch

        # One read at a time answers them all; `_lock` is not held over it: a hung broker's /metrics takes the
        # read's whole timeout, and `failure` (the function's status) must not wait for it.
        with self._read_lock:
            with self._lock:
                read_at, reading = self._readings.get(topics, (float("-inf"), None))
            if reading is None or time.monotonic() - read_at > STALL_METRICS_TTL_S:  # None: never read (-inf)
                reading = fetch(self.metrics_url, time.time(), topics=topics)
                with self._lock:
                    self._readings[topics] = (time.monotonic(), reading)
        for topic in topics:
            backlog = reading.backlog.get((topic, subscription), 0.0)
            if backlog > 0 and reading.unacked.get((topic, subscription)) == 0:
                return topic, backlog
        return None

    def fail(self, topic: str, subscription: str, why: str) -> None:
        with self._lock:
            self._failures[(topic, subscription)] = why

    def recovered(self, topics: tuple[str, ...], subscription: str) -> None:
        with self._lock:
            for topic in topics:
                self._failures.pop((topic, subscription), None)

    def failure(self, inputs) -> str:
        """Why one of these (topic, subscription) inputs is stuck on this worker ("" when none is)."""
        with self._lock:
            return next((self._failures[i] for i in inputs if i in self._failures), "")

    def count(self, topic: str, subscription: str) -> int:
        with self._lock:
            n = self.reopens[(topic, subscription)] = self.reopens.get((topic, subscription), 0) + 1
            return n


def fence_stalls(open_consumer: Callable[[], pulsar.Consumer], topics, subscription: str, fence: StallFence | None):
    """The function's input, watched by the worker's StallFence (B12) on pulsar-lite; elsewhere as it opens."""
    return open_consumer() if fence is None else fence.watch(open_consumer, topics, subscription)


class StalledInputWatch:
    """An input consumer under a StallFence: the consumer's methods (others pass through); receive() counts
    the time it waited with nothing, and past the fence's idle_s asks the broker and reopens when stalled.
    It reopens only when the broker holds no unacked message on the subscription, so no message this
    consumer handed out is left to ack on the consumer it replaces."""

    is_consumer = True  # stands for one consumer of its own: closing it redelivers what it handed out unacked

    def __init__(
        self, fence: StallFence, open_consumer: Callable[[], pulsar.Consumer], topics: tuple[str, ...], subscription: str
    ):
        self._fence = fence
        self._open = open_consumer
        self.topics = topics
        self.subscription = subscription
        self._consumer = open_consumer()
        self._waited = 0.0  # seconds spent in receive() with nothing since the last message
        self._check_after = fence.idle_s  # the next broker check, in seconds waited
        self._reopened = False  # reopened since the last message: a stall now means the reopen failed
        self._closed = False  # the stalled consumer is closed and its successor not open yet
        self._retry_s = fence.idle_s  # wait after a reopen: doubles while reopens deliver nothing (a dead stall)

    def receive(self, timeout_millis: int):
        t0 = time.monotonic()
        if self._closed and not self._reopen():  # the broker refused the fresh consumer: try again, no spin
            time.sleep(timeout_millis / 1000)
            raise pulsar.Timeout("stall fence: the input's consumer could not be reopened yet")
        try:
            msg = self._consumer.receive(timeout_millis)
        except pulsar.Timeout:
            self._waited += time.monotonic() - t0
            if self._waited >= self._check_after:
                self._check()
            raise
        self._waited, self._check_after, self._retry_s = 0.0, self._fence.idle_s, self._fence.idle_s
        if self._reopened:
            self._reopened = False
            self._fence.recovered(self.topics, self.subscription)
        return msg

    def _check(self) -> None:
        self._check_after = min(self._check_after * 2, self._waited + STALL_MAX_CHECK_S)
        try:
            stalled = self._fence.stalled_topic(self.topics, self.subscription)
        except PulsarAutoscaleError as exc:  # metrics unreadable: the input goes on as it is
            log.debug("stall fence: %s", exc)
            return
        if stalled is None:
            return
        topic, backlog = stalled
        if self._reopened:
            self._retry_s = min(self._retry_s * 2, STALL_MAX_CHECK_S)
            self._fence.fail(
                topic,
                self.subscription,
                (
                    f"stalled: pulsar-lite B12: the broker holds a backlog of {backlog:.0f} entries on subscription "
                    f"{self.subscription!r} of {topic} and dispatches none of it; reopening the input delivered nothing "
                    f"({self._fence.reopens.get((topic, self.subscription), 0)} reopen(s) on this worker, "
                    "docs/dev/pulsar-lite-defects.md B12)"
                ),
            )
        # Close first, then open: pulsar-lite keeps one permit count per subscription and takes the closed
        # consumer's permits off it; a fresh consumer opened before the close lost its own permits with them
        # and got at most one receiver queue, mostly nothing (measured, docs/dev/pulsar-lite-defects.md B12).
        try:
            self._consumer.close()
        except pulsar.PulsarException as exc:
            log.debug("stall fence: closing the stalled consumer: %s", exc)
        self._reopen()
        n = self._fence.count(topic, self.subscription)
        log.warning(
            "pulsar-lite B12: the input on subscription %r of %s received nothing for %.0f s while the broker "
            "reports a backlog of %d entries and nothing unacknowledged; reopened its consumer (reopen %d of "
            "this subscription on this worker)",
            self.subscription,
            topic,
            self._waited,
            backlog,
            n,
        )
        self._waited, self._check_after, self._reopened = 0.0, self._retry_s, True

    def _reopen(self) -> bool:
        """Open the consumer that replaces the closed one; False (and a warning) when the broker refuses it now."""
        try:
            self._consumer = self._open()
        except pulsar.PulsarException as exc:
            self._closed = True
            log.warning("pulsar-lite B12: reopening the input on subscription %r failed: %s", self.subscription, exc)
            return False
        self._closed = False
        return True

    def acknowledge(self, msg) -> None:
        self._consumer.acknowledge(msg)

    def negative_acknowledge(self, msg) -> None:
        self._consumer.negative_acknowledge(msg)

    def close(self) -> None:
        self._fence.recovered(self.topics, self.subscription)
        if not self._closed:  # closed already when its successor could not be opened
            self._consumer.close()

    def __getattr__(self, name):  # is_connected, unsubscribe, seek, ...: the current consumer's own
        return getattr(self._consumer, name)
