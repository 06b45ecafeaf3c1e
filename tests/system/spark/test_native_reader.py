"""The source's C read loop (spark_bridge/native.py) against its Python loop on the embedded broker:
the same rows for every range, the same data-loss rules, and the nativeReader option."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pulsar_autoscale.spark_bridge import native
from pulsar_autoscale.spark_bridge.offsets import EARLIEST, Position, TopicRange
from pulsar_autoscale.spark_bridge.options import PulsarOptionError, parse_source_options
from pulsar_autoscale.spark_bridge.ranges import Connection, DataLossError, last_position, read_range
from pulsar_autoscale.spark_bridge.source import SCHEMA, _arrow_schema, _to_arrow
from tests.support.spark_input import produce

WHY_NOT = native.unavailable(parse_source_options({"service.url": "pulsar://h:6650", "topic": "t"}).connection)
needs_native = pytest.mark.skipif(WHY_NOT is not None, reason=f"the C read loop cannot run here: {WHY_NOT}")
ARROW = _arrow_schema(SCHEMA)


@pytest.fixture
def options(broker):
    return parse_source_options({"service.url": broker.service_url, "topic": "unused"})


@pytest.fixture
def conn(options):
    c = Connection(options.connection)
    yield c
    c.close()


def python_rows(conn, rng: TopicRange, chunk: int, poll_timeout_ms: int = 30_000, fail: bool = True) -> pa.Table:
    return pa.Table.from_batches(
        list(_to_arrow(read_range(conn, rng, poll_timeout_ms, fail, chunk), rng.topic, ARROW)), schema=ARROW
    )


def native_rows(options, rng: TopicRange, chunk: int, poll_timeout_ms: int = 30_000, fail: bool = True) -> pa.Table:
    batches = list(native.read_batches(options.connection, rng, poll_timeout_ms, fail, chunk, ARROW))
    assert all(0 < b.num_rows <= chunk for b in batches)
    return pa.Table.from_batches(batches, schema=ARROW)


def varied(client, topic: str) -> None:
    """Unbatched and batched entries; messages with and without key, properties and event time."""
    produce(client, topic, 30, batching=False)
    produce(client, topic, 170, start=30, batching=True)
    producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    for i in range(200, 260):
        producer.send_async(f"bare {i}".encode(), None, event_timestamp=1_700_000_000_000 + i if i % 2 else None)
    producer.flush()
    producer.close()


@needs_native
def test_the_c_loop_reads_every_range_as_the_python_loop_does(pulsar_client, options, conn, topic):
    varied(pulsar_client, topic)
    whole = TopicRange(topic, EARLIEST, last_position(conn, topic))
    expected = python_rows(conn, whole, 7)
    assert expected.num_rows == 260
    assert native_rows(options, whole, 7).equals(expected)
    ids = expected.column("messageId").to_pylist()
    pos = {i: Position.from_bytes(b) for i, b in enumerate(ids)}
    # inside a batch, at entry boundaries, across the unbatched/batched border, one message, the last ones
    for lo, hi in [(9, 29), (29, 30), (20, 120), (150, 151), (100, 259), (258, 259)]:
        rng = TopicRange(topic, pos[lo], pos[hi])
        got = native_rows(options, rng, 16)
        assert got.equals(python_rows(conn, rng, 16)), f"range ({lo}, {hi}]"
        assert got.column("messageId").to_pylist() == ids[lo + 1 : hi + 1], f"range ({lo}, {hi}]"
    pieces = whole.split(4)
    assert len(pieces) > 1
    assert pa.concat_tables([native_rows(options, p, 8192) for p in pieces]).equals(expected)


@needs_native
def test_a_range_past_the_end_is_lost_as_in_the_python_loop(pulsar_client, options, conn, topic):
    produce(pulsar_client, topic, 20, batching=False)
    last = last_position(conn, topic)
    gone = TopicRange(topic, EARLIEST, Position(last.ledger, last.entry + 5, -1))  # never written
    with pytest.raises(DataLossError, match="within 300 ms.*failOnDataLoss=false"):
        native_rows(options, gone, 100, poll_timeout_ms=300)
    kept = native_rows(options, gone, 100, poll_timeout_ms=300, fail=False)
    assert kept.equals(python_rows(conn, gone, 100, poll_timeout_ms=300, fail=False)) and kept.num_rows == 20


def test_the_native_reader_option(broker):
    base = {"service.url": broker.service_url, "topic": "t"}
    assert parse_source_options(base).native_reader == "auto"
    assert parse_source_options({**base, "nativeReader": "FALSE"}).native_reader == "false"
    with pytest.raises(PulsarOptionError, match=r"option 'nativeReader': expected one of \['auto', 'true', 'false'\]"):
        parse_source_options({**base, "nativeReader": "fast"})
    tls_client_cert = parse_source_options(
        {**base, "pulsar.client.authPluginClassName": "tls", "pulsar.client.authParams": "tlsCertFile:/c.pem,tlsKeyFile:/k.pem"}
    )
    why = native.unavailable(tls_client_cert.connection)
    assert why is not None and (WHY_NOT is not None or "tokens only" in why), why


@needs_native
@pytest.mark.spark
def test_a_spark_query_reads_the_same_rows_with_either_loop(spark, broker, pulsar_client, topic):
    varied(pulsar_client, topic)

    def rows(native_reader: str) -> list:
        df = (
            spark.read.format("pulsar")
            .option("service.url", broker.service_url)
            .option("topic", topic)
            .option("nativeReader", native_reader)
            .option("minPartitions", "3")
            .load()
        )
        return sorted(
            (r.messageId, r.key, r.value, r.publishTime, r.eventTime, sorted(r.properties.items())) for r in df.collect()
        )

    got = rows("true")
    assert len(got) == 260 and got == rows("false")
