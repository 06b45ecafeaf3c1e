"""Message metadata, batching, negative acks and delayed delivery.

The function runtime hands key, properties and event time to user code through the
Context, and the controller's inter-arrival statistics use publish timestamps; our
producers batch for throughput; ATLEAST_ONCE relies on negative acks to retry.
"""

from __future__ import annotations

import datetime
import time

import pulsar
import pytest

from tests.support.conformance import client, drain, payloads, produce


def test_key_properties_and_timestamps_propagate(broker, topic):
    """Context.get_message_key/properties/event time and our inter-arrival figures read these fields."""
    with client(broker.service_url) as c:
        consumer = c.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        before_ms = int(time.time() * 1000)
        produce(c, topic, 3, properties={"origin": "conformance", "n": "1"}, partition_key="user-42", event_timestamp=1_234_567)
        msgs = drain(consumer)
    assert payloads(msgs) == [0, 1, 2]
    for m in msgs:
        assert m.properties() == {"origin": "conformance", "n": "1"}
        assert m.partition_key() == "user-42"
        assert m.event_timestamp() == 1_234_567
        assert before_ms - 1000 <= m.publish_timestamp() <= int(time.time() * 1000) + 1000, "publish_timestamp missing or off"
    gaps = [b.publish_timestamp() - a.publish_timestamp() for a, b in zip(msgs, msgs[1:])]
    assert all(g >= 0 for g in gaps), f"publish timestamps go backwards: {gaps}"


def test_batched_producer_is_unbatched_in_order_for_the_consumer(broker, topic):
    """Our producers batch (17-27k msg/s); consumers must still see every message, once, in order."""
    n = 2000
    with client(broker.service_url) as c:
        consumer = c.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        produce(c, topic, n, batching=True, properties={"k": "v"})
        msgs = drain(consumer)
    assert payloads(msgs) == list(range(n))
    assert all(m.properties() == {"k": "v"} for m in msgs)
    assert any(m.message_id().batch_index() > 0 for m in msgs), "nothing was batched: the test did not test batching"


NACKED_REDELIVERED = [
    pytest.param(pulsar.ConsumerType.Shared, id="Shared"),
    pytest.param(
        pulsar.ConsumerType.Failover,
        id="Failover",
        marks=pytest.mark.lite_defect(reason="pulsar-lite B13: a nacked message of a Failover subscription is never redelivered"),
    ),
]


@pytest.mark.parametrize("kind", NACKED_REDELIVERED)
def test_negative_ack_redelivers_to_the_same_subscription(broker, topic, kind):
    """A failed process() nacks the message so it is retried instead of lost (FAILOVER: a function with
    retainOrdering or an EFFECTIVELY_ONCE guarantee)."""
    with client(broker.service_url) as c:
        consumer = c.subscribe(topic, "s", consumer_type=kind, negative_ack_redelivery_delay_ms=100)
        produce(c, topic, 1)
        first = consumer.receive(2000)
        consumer.negative_acknowledge(first)
        again = consumer.receive(3000)
        consumer.acknowledge(again)
    assert again.message_id() == first.message_id()
    # Apache Pulsar counts redeliveries in Shared and Key_Shared dispatchers only (a single-active-consumer
    # dispatcher has none): the client's DeadLetterPolicy cannot see a Failover message's retries
    expected = 1 if kind == pulsar.ConsumerType.Shared else 0
    assert again.redelivery_count() >= expected


@pytest.mark.lite_defect(reason="pulsar-lite B8: deliver_after is ignored, the message is delivered at once")
def test_deliver_after_delays_delivery(broker, topic):
    """Not used by the runtime today; tells us when delayed retries become available on lite."""
    with client(broker.service_url) as c:
        consumer = c.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        produce(c, topic, 1, deliver_after=datetime.timedelta(seconds=2))
        early = drain(consumer, idle_ms=1000)
        assert early == [], f"delivered {len(early)} message(s) before deliver_after elapsed"
        assert payloads(drain(consumer, idle_ms=3000, limit=1)) == [0]
