"""Coordination: an Exclusive subscription on a coordination topic as the leader lock.

Controller replicas elect a leader by holding an Exclusive subscription; the lock must
refuse a second holder, and be freed when the holder's client closes or its process
dies. Because a refusal on lite drops the refused client's whole connection (B3), the
lock uses a dedicated client with a 1 s operation timeout. Producer access modes (B6)
would be the alternative lock; lite ignores them.
"""

from __future__ import annotations

import time

import pulsar
import pytest

from tests.support.conformance import Child, client, drain, make_client, payloads, produce, wait_for

LOCK_SUB = "leader"


def _try_lock(service_url: str, topic: str):
    """One attempt on a fresh 1 s-timeout client: (client, consumer) when acquired, else None."""
    c = make_client(service_url, op_timeout_s=1)
    try:
        return c, c.subscribe(topic, LOCK_SUB, consumer_type=pulsar.ConsumerType.Exclusive)
    except pulsar.PulsarException:
        c.close()
        return None


def _acquire_within(service_url: str, topic: str, timeout_s: float):
    return wait_for(lambda: _try_lock(service_url, topic), timeout_s, f"the lock on {topic} to be free", 0.05)


def test_exclusive_subscription_refuses_a_second_holder_and_frees_on_close(broker, topic):
    holder = _try_lock(broker.service_url, topic)
    assert holder, "first holder could not take a free lock"
    assert _try_lock(broker.service_url, topic) is None, "a second holder got the lock"
    holder[0].close()
    started = time.monotonic()
    c, _ = _acquire_within(broker.service_url, topic, 5)
    print(f"lock free {1000 * (time.monotonic() - started):.0f} ms after the holder's client closed")
    c.close()


def test_exclusive_subscription_frees_after_kill9_of_the_holder_process(broker, topic):
    with Child("hold-exclusive", broker.service_url, topic, LOCK_SUB) as holder:
        assert holder.expect(timeout_s=10) == "HELD"
        assert _try_lock(broker.service_url, topic) is None, "lock not held by the child"
        holder.kill9()
        started = time.monotonic()
        c, _ = _acquire_within(broker.service_url, topic, 10)
        print(f"lock free {1000 * (time.monotonic() - started):.0f} ms after kill -9")
        c.close()


@pytest.mark.lite_defect(
    reason="pulsar-lite B3: a command error (here: refused Exclusive subscribe) closes the "
    "whole connection, so the client's other consumers are dropped and re-subscribed"
)
def test_refused_command_leaves_other_consumers_of_the_client_alone(broker, topic):
    lock = topic + "-lock"
    holder = _try_lock(broker.service_url, lock)
    assert holder, "could not take the lock"
    try:
        with client(broker.service_url, op_timeout_s=1) as c:
            bystander = c.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
            produce(c, topic, 1)
            first = bystander.receive(2000)  # held unacked: only a reconnect would deliver it again
            with pytest.raises(pulsar.PulsarException):
                c.subscribe(lock, LOCK_SUB, consumer_type=pulsar.ConsumerType.Exclusive)
            again = drain(bystander, idle_ms=1000)
    finally:
        holder[0].close()
    assert payloads([first]) == [0]
    assert again == [], "the bystander consumer was re-subscribed: its unacked message came back"


@pytest.mark.lite_defect(reason="pulsar-lite B6: producer access mode Exclusive is ignored")
def test_exclusive_producer_refuses_a_second_producer(broker, topic):
    with client(broker.service_url) as c, client(broker.service_url, op_timeout_s=1) as other:
        c.create_producer(topic, access_mode=pulsar.ProducerAccessMode.Exclusive)
        with pytest.raises(pulsar.PulsarException):
            other.create_producer(topic)
