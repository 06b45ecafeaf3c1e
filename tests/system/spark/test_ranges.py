"""read_range on the embedded broker, without Spark: the (start, end] contract every source task
relies on (each message of the range once, in id order, none outside it), in seconds."""

from __future__ import annotations

import pytest

from pulsar_autoscale.spark_bridge.offsets import EARLIEST, Position, TopicRange
from pulsar_autoscale.spark_bridge.options import parse_source_options
from pulsar_autoscale.spark_bridge.ranges import Connection, last_position, read_range
from tests.support.spark_input import produce


@pytest.fixture
def conn(broker):
    c = Connection(parse_source_options({"service.url": broker.service_url, "topic": "unused"}).connection)
    yield c
    c.close()


def read(conn, rng: TopicRange, chunk: int = 8192) -> list[tuple[int, bytes]]:
    """(global index, messageId bytes) of each message read, in order; every chunk within its size."""
    out = []
    for c in read_range(conn, rng, poll_timeout_ms=30_000, fail_on_data_loss=True, chunk=chunk):
        assert 0 < len(c) <= chunk and len({len(c.keys), len(c.ids), len(c.publish_ms), len(c.event_ms), len(c.properties)}) == 1
        out += [(int(p["i"]), i) for p, i in zip(c.properties, c.ids)]
    return out


def test_ranges_are_exact_at_batch_and_entry_boundaries(broker, pulsar_client, conn, topic):
    produce(pulsar_client, topic, 40, batching=False)
    produce(pulsar_client, topic, 260, start=40, batching=True)
    everything = read(conn, TopicRange(topic, EARLIEST, last_position(conn, topic)), chunk=7)
    assert [i for i, _ in everything] == list(range(300))
    pos = {i: Position.from_bytes(mid) for i, mid in everything}
    for lo, hi in [(-1, 299), (9, 30), (20, 120), (39, 40), (150, 151), (100, 299), (298, 299)]:
        start = pos[lo] if lo >= 0 else EARLIEST
        got = [i for i, _ in read(conn, TopicRange(topic, start, pos[hi]), chunk=16)]
        assert got == list(range(lo + 1, hi + 1)), f"range ({lo}, {hi}]"


def test_split_pieces_read_back_to_back_cover_the_range_once(broker, pulsar_client, conn, topic):
    for start in range(0, 500, 100):  # each flush ends a batch: several entries of 100 messages
        produce(pulsar_client, topic, 100, start=start, batching=True)
    whole = TopicRange(topic, EARLIEST, last_position(conn, topic))
    pieces = whole.split(4)
    assert len(pieces) > 1
    assert [i for p in pieces for i, _ in read(conn, p)] == list(range(500))
    assert read(conn, TopicRange(topic, whole.end, whole.end)) == []
