"""The `pulsar` data source on a real local Spark and the embedded broker.

Waits are bounded: every poll has a deadline and fails with what it was waiting for.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pulsar
import pytest

from pulsar_autoscale.spark_bridge.sink import PROP_BATCH, ReplayFilter, replay_key
from tests.support.spark_input import produce

pytestmark = pytest.mark.spark


def read_topic(client, topic: str, expected: int, timeout_s: float = 60.0) -> list:
    """All messages of `topic`, each once; waits until at least `expected` arrived, then for stragglers.

    A Reader is an Exclusive subscription: pulsar-lite may deliver a message twice (B1,
    docs/dev/pulsar-lite-defects.md); a second copy of one message id is not a sink replay, so it is dropped.
    A Reader that delivers nothing for 2 s short of `expected` is replaced by a fresh one from
    the start (pulsar-lite's Readers stall now and then under load, as the source's do: seen
    here stuck at 5,000 of 10,000); the ids already seen keep each message once, in order.
    """
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got, seen, deadline, idle_since = [], set(), time.monotonic() + timeout_s, time.monotonic()
    try:
        while time.monotonic() < deadline:
            try:
                msg = reader.read_next(500 if len(got) < expected else 200)
                idle_since = time.monotonic()
                if msg.message_id().serialize() not in seen:
                    seen.add(msg.message_id().serialize())
                    got.append(msg)
            except pulsar.Timeout:
                if len(got) >= expected:
                    return got
                if time.monotonic() - idle_since >= 2.0:
                    reader.close()
                    reader = client.create_reader(topic, pulsar.MessageId.earliest)
                    idle_since = time.monotonic()
    finally:
        reader.close()
    raise AssertionError(f"{topic}: {len(got)} of {expected} messages within {timeout_s:.0f}s")


def wait_for(predicate, timeout_s: float, what: str, query=None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query is not None and query.exception() is not None:
            raise AssertionError(f"query failed while waiting for {what}: {query.exception()}")
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(
        f"timed out after {timeout_s:.0f}s waiting for {what}"
        + (f" (progress: {[p['numInputRows'] for p in query.recentProgress]})" if query is not None else "")
    )


def newest(log_dir: Path) -> int:
    """The newest batch id of a checkpoint log (offsets/, commits/), -1 before the first."""
    return max((int(p.name) for p in log_dir.iterdir() if p.name.isdigit()), default=-1) if log_dir.exists() else -1


def pipe(spark, broker, src: str, dst: str, checkpoint: Path, max_rows: int):
    """The query under test: copy src to dst, keeping key, value and properties."""
    return (
        spark.readStream.format("pulsar")
        .option("service.url", broker.service_url)
        .option("topic", src)
        .option("maxRecordsPerTrigger", str(max_rows))
        .load()
        .select("key", "value", "properties")
        .writeStream.format("pulsar")
        .option("service.url", broker.service_url)
        .option("topic", dst)
        .option("checkpointLocation", str(checkpoint))
    )


def assert_per_key_order(messages) -> None:
    last: dict[str, int] = {}
    for m in messages:
        seq = int(m.properties()["keySeq"])
        assert seq > last.get(m.partition_key(), -1), f"key {m.partition_key()}: {seq} after {last[m.partition_key()]}"
        last[m.partition_key()] = seq


def test_stream_10k_with_admission_control_in_key_order(spark, broker, pulsar_client, topic, tmp_path):
    out = topic + "-out"
    produce(pulsar_client, topic, 10_000)
    query = pipe(spark, broker, topic, out, tmp_path / "ck", max_rows=2500).trigger(availableNow=True).start()
    assert query.awaitTermination(240), "AvailableNow query did not finish within 240 s"
    assert query.exception() is None, query.exception()
    rows = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(rows) == 10_000 and max(rows) <= 2500, rows
    assert len(rows) == 4, f"maxRecordsPerTrigger=2500 should give 4 micro-batches, got {rows}"

    messages = read_topic(pulsar_client, out, 10_000)
    assert sorted(int(m.properties()["i"]) for m in messages) == list(range(10_000))
    assert_per_key_order(messages)
    assert all(m.data() == f"{m.partition_key()}:{m.properties()['i']}".encode() for m in messages)


def test_restart_from_checkpoint_loses_nothing_and_replays_are_droppable(spark, broker, pulsar_client, topic, tmp_path):
    out, ck = topic + "-out", tmp_path / "ck"
    produce(pulsar_client, topic, 6000)
    query = pipe(spark, broker, topic, out, ck, max_rows=1000).start()
    # Stopped once idle: a stop in the middle of a batch leaves an uncommitted offsets entry, and Spark
    # then re-runs only that batch, not the one whose commit is dropped below (a race, 1 failure in a full run).
    wait_for(
        lambda: sum(p["numInputRows"] for p in query.recentProgress) == 6000 and newest(ck / "commits") == newest(ck / "offsets"),
        60,
        "all 6,000 read and committed",
        query,
    )
    query.stop()
    # A driver that dies after the sink flushed a batch but before Spark logged its commit:
    # drop the newest commit so the restarted query replays that batch.
    replayed_batch = str(newest(ck / "commits"))
    for name in (replayed_batch, f".{replayed_batch}.crc"):
        (ck / "commits" / name).unlink(missing_ok=True)
    produce(pulsar_client, topic, 2000, start=6000)

    query = pipe(spark, broker, topic, out, ck, max_rows=1000).trigger(availableNow=True).start()
    assert query.awaitTermination(240), "restarted query did not finish within 240 s"
    assert query.exception() is None, query.exception()

    messages = read_topic(pulsar_client, out, 8000)
    keep = ReplayFilter()
    first = [m for m in messages if keep.first_time(m.properties())]
    replays = [m for m in messages if m not in first]
    assert sorted(int(m.properties()["i"]) for m in first) == list(range(8000)), "lost or duplicated messages"
    assert replays and {m.properties()[PROP_BATCH] for m in replays} == {replayed_batch}
    # A replay repeats exactly the original rows: same key -> same content.
    content = {replay_key(m.properties()): m.data() for m in first}
    assert all(content[replay_key(m.properties())] == m.data() for m in replays)
    assert_per_key_order(first)


def test_batch_read_of_explicit_range_is_exact(spark, broker, pulsar_client, topic):
    produce(pulsar_client, topic, 300, batching=False)
    produce(pulsar_client, topic, 300, start=300, batching=True)

    def base():  # a DataFrameReader is mutable: start from a fresh one each time
        return spark.read.format("pulsar").option("service.url", broker.service_url).option("topic", topic)

    ids = {int(r.properties["i"]): list(r.messageId) for r in base().load().select("properties", "messageId").collect()}
    assert sorted(ids) == list(range(600))

    for lo, hi in [(99, 250), (120, 450), (-1, 599), (310, 311)]:
        start = json.dumps({topic: ids[lo] if lo >= 0 else "earliest"})
        df = (
            base()
            .option("startingOffsets", start)
            .option("endingOffsets", json.dumps({topic: ids[hi]}))
            .option("minPartitions", "3")
            .load()
        )
        got = sorted(int(r.properties["i"]) for r in df.select("properties").collect())
        assert got == list(range(lo + 1, hi + 1)), f"range ({lo}, {hi}]"
    assert df.rdd.getNumPartitions() == 1  # a single-message range cannot be cut
    wide = base().option("minPartitions", "3").load()
    assert wide.rdd.getNumPartitions() == 3 and wide.count() == 600


BAD_SOURCE_OPTIONS = [
    ({"startingOffset": "earliest"}, "startingoffset"),
    ({"service.url": None}, "service.url"),
    ({"startingOffsets": "{not json"}, "startingOffsets"),
    ({"startingOffsets": '{"t": [1, 2, 3]}'}, "startingOffsets"),
    ({"maxRecordsPerTrigger": "many"}, "maxRecordsPerTrigger"),
    ({"topic": "never-written-topic"}, "never-written-topic"),
    ({"topicsPattern": "persistent://public/default/.*"}, "admin.url"),
]


@pytest.mark.parametrize("streaming", [False, True], ids=["batch", "stream"])
@pytest.mark.parametrize("change,named", BAD_SOURCE_OPTIONS, ids=[n for _, n in BAD_SOURCE_OPTIONS])
def test_bad_source_input_fails_on_load_naming_the_problem(spark, broker, pulsar_client, topic, change, named, streaming):
    produce(pulsar_client, topic, 1)
    options = {"service.url": broker.service_url, "topic": topic, **change}
    if "topicsPattern" in change:
        del options["topic"]
    reader = (spark.readStream if streaming else spark.read).format("pulsar")
    for k, v in options.items():
        if v is not None:
            reader = reader.option(k, v)
    with pytest.raises(Exception) as info:
        reader.load()
    assert named in str(info.value), str(info.value)[:2000]


def test_bad_sink_input_fails_before_writing(spark, broker):
    df = spark.createDataFrame([("a", b"1")], "key string, value binary")
    with pytest.raises(Exception, match="topic"):
        df.write.format("pulsar").option("service.url", broker.service_url).mode("append").save()
    with pytest.raises(Exception, match="valu"):
        df.withColumnRenamed("value", "valu").write.format("pulsar").option("service.url", broker.service_url).option(
            "topic", "x"
        ).mode("append").save()


def test_topics_option_reads_each_topic_in_its_own_task(spark, broker, pulsar_client, topic):
    other = topic + "-b"
    produce(pulsar_client, topic, 300)
    produce(pulsar_client, other, 200, start=300)
    df = spark.read.format("pulsar").option("service.url", broker.service_url).option("topics", f"{topic},{other}").load()
    assert df.rdd.getNumPartitions() == 2
    counts = {r.topic: r["count"] for r in df.groupBy("topic").count().collect()}
    assert counts == {topic: 300, other: 200}


def test_stream_on_empty_topic_picks_up_later_messages(spark, broker, pulsar_client, topic, tmp_path):
    out = topic + "-out"
    query = (
        spark.readStream.format("pulsar")
        .option("service.url", broker.service_url)
        .option("topic", topic)
        .option("allowEmptyTopics", "true")
        .load()
        .select("key", "value")
        .writeStream.format("pulsar")
        .option("service.url", broker.service_url)
        .option("topic", out)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: query.lastProgress is not None, 120, "the first (empty) trigger", query)
        produce(pulsar_client, topic, 100)
        wait_for(
            lambda: sum(p["numInputRows"] for p in query.recentProgress) >= 100,
            120,
            "100 rows read after the topic got data",
            query,
        )
    finally:
        query.stop()
    assert len(read_topic(pulsar_client, out, 100)) == 100


def test_sink_topic_option_wins_over_a_topic_column(spark, broker, pulsar_client, topic):
    """As Spark's Kafka sink: a job that keeps the source's `topic` column must not write back into it."""
    produce(pulsar_client, topic, 20)
    out = topic + "-out"
    (
        spark.read.format("pulsar")
        .option("service.url", broker.service_url)
        .option("topic", topic)
        .load()
        .select("topic", "key", "value")
        .write.format("pulsar")
        .option("service.url", broker.service_url)
        .option("topic", out)
        .mode("append")
        .save()
    )
    assert len(read_topic(pulsar_client, out, 20)) == 20
    source = spark.read.format("pulsar").option("service.url", broker.service_url).option("topic", topic).load()
    assert source.count() == 20, "rows went back into the source topic"


def test_sink_topic_column_routes_rows_without_the_option(spark, broker, pulsar_client, topic):
    a, b = topic + "-a", topic + "-b"
    df = spark.createDataFrame([(a, b"1"), (b, b"2"), (a, b"3")], "topic string, value binary")
    df.write.format("pulsar").option("service.url", broker.service_url).mode("append").save()
    assert sorted(m.data() for m in read_topic(pulsar_client, a, 2)) == [b"1", b"3"]
    assert [m.data() for m in read_topic(pulsar_client, b, 1)] == [b"2"]


def test_batch_write_needs_append_mode(spark, broker, pulsar_client, topic):
    """Spark refuses its default mode (errorifexists) for Python data sources before the sink is
    asked (docs/spark.md says so); overwrite is refused by the sink; append writes."""
    df = spark.createDataFrame([("a", b"1")], "key string, value binary")
    writer = df.write.format("pulsar").option("service.url", broker.service_url).option("topic", topic)
    with pytest.raises(Exception, match="Append"):
        writer.save()
    with pytest.raises(Exception, match="only appends"):
        writer.mode("overwrite").save()
    writer.mode("append").save()
    assert len(read_topic(pulsar_client, topic, 1)) == 1


def test_batch_read_of_an_empty_topic_with_allow_empty_topics_is_empty(spark, broker, topic):
    df = (
        spark.read.format("pulsar")
        .option("service.url", broker.service_url)
        .option("topic", topic)
        .option("allowEmptyTopics", "true")
        .load()
    )
    assert df.collect() == []
    assert df.count() == 0
