"""The B12 fence (lite.stalls.StallFence): an input the broker stopped dispatching to is reopened.

B12 itself (tests/system/spark/test_burst.py::test_repeated_lite_joins_lose_nothing) does not happen on demand,
so the stalled input here is the state B12 leaves, made on purpose: the input's first consumer is on a
topic where nothing arrives (what a stalled consumer sees), while the broker holds a backlog on the
watched subscription and nothing unacknowledged. A fence that does not reopen leaves all of it there."""

from __future__ import annotations

import time

import pulsar

from pulsar_autoscale.broker.lite.stalls import StallFence, fence_stalls
from pulsar_autoscale.broker.profile import APACHE, LITE
from tests.support.conformance import client, drain, produce


def test_the_stall_fence_reopens_an_input_the_broker_stopped_dispatching_to(broker, topic):
    n = 200
    fence = StallFence(broker.metrics_url, idle_s=1.0)
    with client(broker.service_url) as c:
        c.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.Shared).close()  # the subscription exists
        opened = []

        def open_consumer():
            stalled = not opened
            opened.append(stalled)
            return c.subscribe(topic + "-nothing" if stalled else topic, "fn", consumer_type=pulsar.ConsumerType.Shared)

        watched = fence_stalls(open_consumer, [topic], "fn", fence)
        idle_until = time.monotonic() + 3.0  # no backlog yet: waiting alone reopens nothing
        while time.monotonic() < idle_until:
            assert drain(watched, idle_ms=200) == []
        assert fence.reopens == {} and opened == [True], "the fence reopened an input without a backlog"
        produce(c, topic, n)
        got: set[bytes] = set()
        deadline = time.monotonic() + 40
        while len(got) < n and time.monotonic() < deadline:
            got.update(msg.data() for msg in drain(watched, idle_ms=200))
        watched.close()
    assert len(got) == n, f"the stalled input got {len(got)} of {n} in 40 s (reopens {fence.reopens})"
    assert fence.reopens == {(topic, "fn"): 1}, fence.reopens


def test_no_stall_fence_on_apache_pulsar(broker, topic):
    """The fence is keyed on the broker's profile: on Apache Pulsar (or without metrics) the input is the consumer."""
    assert StallFence.for_broker(APACHE, broker.metrics_url) is None
    assert StallFence.for_broker(LITE, None) is None
    with client(broker.service_url) as c:
        consumer = fence_stalls(lambda: c.subscribe(topic, "fn"), [topic], "fn", None)
        assert isinstance(consumer, pulsar.Consumer)
        consumer.close()
