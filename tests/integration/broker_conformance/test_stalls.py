"""The B12 fence (lite.stalls.StallFence): an input the broker stopped dispatching to is reopened.

B12 itself (tests/system/spark/test_burst.py::test_repeated_lite_joins_lose_nothing) does not happen on demand,
so the stalled input here is the state B12 leaves, made on purpose: the input's first consumer is on a
topic where nothing arrives (what a stalled consumer sees), while the broker holds a backlog on the
watched subscription and nothing unacknowledged. A fence that does not reopen leaves all of it there."""

from __future__ import annotations

import time

import pulsar

from pulsar_autoscale.broker.lite.stalls import StallFence, fence_stalls
from pulsar_autoscale.broker.metrics import fetch
from pulsar_autoscale.broker.profile import APACHE, LITE
from tests.support.conformance import client, drain, produce
from tests.support.scenario import wait_until


def _receive(watched, n: int, timeout_s: float) -> set[bytes]:
    """The payloads the fenced input receives until it has `n` or `timeout_s` passes."""
    got: set[bytes] = set()
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got.update(msg.data() for msg in drain(watched, idle_ms=200))
    return got


def _backlog_shown(broker, topic: str) -> None:
    """Wait until the broker's gauges show the backlog of subscription "fn" (pulsar-lite refreshes them every 5 s)."""
    wait_until(
        lambda: fetch(broker.metrics_url, time.time(), topics=(topic,)).backlog.get((topic, "fn")), 30, "the backlog gauge"
    )


def test_the_stall_fence_reopens_an_input_the_broker_stopped_dispatching_to(broker, topic):
    n = 200
    fence = StallFence(broker.metrics_url, idle_s=1.0)
    with client(broker.service_url) as c:
        c.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.Shared).close()  # the subscription exists
        opened: list[pulsar.Consumer] = []
        open_while_another_is = []  # a reopen must close the stalled consumer first (B12: the permit count)

        def open_consumer():
            open_while_another_is.extend(o.is_connected() for o in opened)
            stalled = not opened
            opened.append(c.subscribe(topic + "-nothing" if stalled else topic, "fn", consumer_type=pulsar.ConsumerType.Shared))
            return opened[-1]

        watched = fence_stalls(open_consumer, [topic], "fn", fence)
        idle_until = time.monotonic() + 3.0  # no backlog yet: waiting alone reopens nothing
        while time.monotonic() < idle_until:
            assert drain(watched, idle_ms=200) == []
        assert fence.reopens == {} and len(opened) == 1, "the fence reopened an input without a backlog"
        produce(c, topic, n)
        got = _receive(watched, n, 40)
        watched.close()
    assert len(got) == n, f"the stalled input got {len(got)} of {n} in 40 s (reopens {fence.reopens})"
    assert fence.reopens == {(topic, "fn"): 1}, fence.reopens
    assert not any(open_while_another_is), "the fence opened the fresh consumer before it closed the stalled one"


def test_reopens_that_deliver_nothing_back_off_and_name_the_stall(broker, topic):
    """A dead stall (B12: nothing reaches any consumer of the subscription) is retried after twice the wait
    before each time, not at every idle period, and named for the function's status."""
    fence = StallFence(broker.metrics_url, idle_s=0.5)
    with client(broker.service_url) as c:
        c.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.Shared).close()
        produce(c, topic, 10)  # the backlog no consumer of the fence will ever see
        _backlog_shown(broker, topic)
        watched = fence_stalls(
            lambda: c.subscribe(topic + "-nothing", "fn", consumer_type=pulsar.ConsumerType.Shared), [topic], "fn", fence
        )
        idle_until = time.monotonic() + 5.0  # reopens after 0.5, 0.5, 1 and 2 s of idle; without the backoff 9-10
        while time.monotonic() < idle_until:
            assert drain(watched, idle_ms=200) == []
        why = fence.failure([(topic, "fn")])
        watched.close()
    assert 2 <= fence.reopens[(topic, "fn")] <= 4, fence.reopens
    assert why.startswith("stalled: pulsar-lite B12") and "delivered nothing" in why, why


def test_a_reopen_that_cannot_open_is_retried_and_loses_nothing(broker, topic):
    """The stalled consumer is closed before its successor opens; when that open fails (here a topic name the
    client refuses), the next receive tries again instead of leaving the input without a consumer."""
    n, opened = 50, []
    fence = StallFence(broker.metrics_url, idle_s=0.5)
    with client(broker.service_url) as c:
        c.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.Shared).close()
        produce(c, topic, n)
        _backlog_shown(broker, topic)

        def open_consumer():
            opened.append(len(opened))
            where = {0: topic + "-nothing", 1: "persistent://not a topic//x"}.get(opened[-1], topic)
            return c.subscribe(where, "fn", consumer_type=pulsar.ConsumerType.Shared)

        watched = fence_stalls(open_consumer, [topic], "fn", fence)
        got = _receive(watched, n, 30)
        watched.close()
    assert len(got) == n, f"got {len(got)} of {n} after {len(opened)} opens"
    assert len(opened) == 3, f"{len(opened)} opens: the stalled one, the refused one, the one that got the backlog"


def test_no_stall_fence_on_apache_pulsar(broker, topic):
    """The fence is keyed on the broker's profile: on Apache Pulsar (or without metrics) the input is the consumer."""
    assert StallFence.for_broker(APACHE, broker.metrics_url) is None
    assert StallFence.for_broker(LITE, None) is None
    with client(broker.service_url) as c:
        consumer = fence_stalls(lambda: c.subscribe(topic, "fn"), [topic], "fn", None)
        assert isinstance(consumer, pulsar.Consumer)
        consumer.close()
