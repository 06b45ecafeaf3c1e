"""Key_Shared subscriptions: what a retainKeyOrdering function gets on this broker.

Pulsar derives KEY_SHARED for retainKeyOrdering functions: every key goes to one
instance, in publish order. Scale-in on Key_Shared additionally needs the closed
consumer's unacked messages to move to the survivors, which lite does not do (B4).
"""

from __future__ import annotations

import collections

import pulsar
import pytest

from tests.support.conformance import client, drain, payloads

KEYS = 10


def _subscribe_key_shared(c, topic: str, count: int):
    return [c.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.KeyShared) for _ in range(count)]


def _keyed(c, topic: str, n: int) -> None:
    """Message i carries key k(i % KEYS), so each key's payloads increase in publish order.

    Key-based batching, as Key_Shared producers should use; unbatched sends showed a rare
    duplicate delivery (about 1 in 3000 messages), which would make this test flaky.
    """
    producer = c.create_producer(
        topic, block_if_queue_full=True, batching_max_publish_delay_ms=5, batching_type=pulsar.BatchingType.KeyBased
    )
    for i in range(n):
        producer.send_async(b"%d" % i, None, partition_key=f"k{i % KEYS}")
    producer.flush()
    producer.close()


def _receive_keyed(broker, topic: str, n: int, consumers: int = 3) -> list[list[pulsar.Message]]:
    # Pulsar's default operation timeout: nothing here is refused, and under load (2 cores, load
    # average 12) closing the producer after 500 batched sends once took longer than 5 s.
    with client(broker.service_url, op_timeout_s=30) as c:
        subs = _subscribe_key_shared(c, topic, consumers)
        _keyed(c, topic, n)
        return [drain(cons) for cons in subs]


def test_key_shared_keeps_per_key_order_within_one_client(broker, topic):
    """Every key on one consumer, in publish order, nothing lost (duplicates: next test)."""
    n = 500
    received = _receive_keyed(broker, topic, n)
    owner: dict[str, int] = {}
    per_key: dict[str, list[int]] = collections.defaultdict(list)
    for idx, msgs in enumerate(received):
        for m in msgs:
            assert owner.setdefault(m.partition_key(), idx) == idx, f"key {m.partition_key()} went to two consumers"
            if int(m.data()) not in per_key[m.partition_key()]:
                per_key[m.partition_key()].append(int(m.data()))
    assert sorted(p for seq in per_key.values() for p in seq) == list(range(n)), "lost messages"
    for key, seq in per_key.items():
        assert seq == sorted(seq), f"key {key} out of order: {seq[:10]}..."
    assert len(set(owner.values())) >= 2, f"all keys went to one consumer: {owner}"


@pytest.mark.lite_defect(
    strict=False,
    reason="pulsar-lite, like B1: Key_Shared sometimes delivers a message twice to the "
    "same consumer (1-4 of 500 in about half the runs), too rare to xfail strictly",
)
def test_key_shared_delivers_each_message_once(broker, topic):
    n = 500
    counts = collections.Counter(p for msgs in _receive_keyed(broker, topic, n) for p in payloads(msgs))
    assert set(counts) == set(range(n)), f"lost {n - len(counts)} messages"
    assert max(counts.values()) == 1, f"duplicates: {sorted(p for p, k in counts.items() if k > 1)[:10]}"


@pytest.mark.lite_defect(reason="pulsar-lite B4: Key_Shared messages left unacked by a closed consumer stay stuck")
def test_key_shared_unacked_messages_of_a_closed_consumer_go_to_the_survivors(broker, topic):
    n = 100
    with client(broker.service_url) as c:
        leaving, staying = _subscribe_key_shared(c, topic, 2)
        _keyed(c, topic, n)
        held = drain(leaving, ack=False)
        first = drain(staying)
        assert held, "the leaving consumer was given no key: the test did not test anything"
        leaving.close()
        moved = drain(staying, idle_ms=2000)
    got = sorted(payloads(first) + payloads(moved))
    assert set(got) == set(range(n)), f"{len(held)} held by the closed consumer, only {len(moved)} reached the survivor"


def _murmur_slot(key: str) -> int:
    """Pulsar's Key_Shared hash of a key: Murmur3_32 (seed 0) & 0x7fffffff, mod 65536."""
    import mmh3

    return (mmh3.hash(key.encode(), 0, signed=True) & 0x7FFFFFFF) % 65536


def _sticky_receive(broker, topic: str, n: int, ranges, pipelined: bool = True, **producer_kw) -> list[list[pulsar.Message]]:
    with client(broker.service_url) as c:
        subs = [
            c.subscribe(
                topic,
                "fn",
                consumer_type=pulsar.ConsumerType.KeyShared,
                key_shared_policy=pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=r),
            )
            for r in ranges
        ]
        producer = c.create_producer(topic, block_if_queue_full=True, **producer_kw)
        for i in range(n):
            if pipelined:
                producer.send_async(b"%d" % i, None, partition_key=f"key-{i}")
            else:
                producer.send(b"%d" % i, partition_key=f"key-{i}")
        producer.flush()
        return [drain(s) for s in subs]


def _check_sticky(received, ranges, n: int) -> None:
    got = sorted(p for msgs in received for p in payloads(msgs))
    assert sorted(set(got)) == list(range(n)), f"lost {n - len(set(got))} of {n} messages"
    for idx, msgs in enumerate(received):
        ((start, end),) = ranges[idx]
        wrong = [m.partition_key() for m in msgs if not start <= _murmur_slot(m.partition_key()) <= end]
        assert not wrong, f"consumer {idx} ({start}-{end}) got keys outside its range: {wrong[:5]}"


STICKY = [[(0, 32767)], [(32768, 65535)]]


def test_key_shared_sticky_ranges_give_each_consumer_exactly_its_hash_ranges(broker, topic):
    """What keyedState can use on Apache Pulsar: a worker's consumer with sticky ranges = its key groups
    (routing.sticky_ranges). With one synchronous send at a time: exact on pulsar-lite too."""
    _check_sticky(_sticky_receive(broker, topic, 400, STICKY, pipelined=False, batching_enabled=False), STICKY, 400)


@pytest.mark.lite_defect(
    reason="pulsar-lite B11: sticky Key_Shared consumers lose messages of pipelined "
    "producers (105-361 of 400 never delivered, batched by key or unbatched)"
)
@pytest.mark.parametrize("batching", ["none", "key-based"])
def test_key_shared_sticky_ranges_with_pipelined_producers(broker, topic, batching):
    """The loss shows in 7-8 of 10 rounds of 400 messages (idle machine), not in all: one round alone
    passed 3 of 10 times, which made the strict xfail flaky. Ten rounds, each on its own topic, miss the
    defect with a probability of about 0.3**10, so an XPASS here means lite was fixed."""
    kw = (
        {"batching_enabled": False}
        if batching == "none"
        else {"batching_type": pulsar.BatchingType.KeyBased, "batching_max_publish_delay_ms": 5}
    )
    for round_ in range(10):
        _check_sticky(_sticky_receive(broker, f"{topic}-{round_}", 400, STICKY, **kw), STICKY, 400)
