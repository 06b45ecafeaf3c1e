"""The `pulsar` sink: at-least-once, each task flushes its producers before reporting success.

A retried task or a replayed micro-batch sends its rows again. Every message carries
`spark.queryId`, `spark.batchId`, `spark.partitionId` and `spark.seq`; for a deterministic
query (a replayed source range yields the same rows in the same tasks) that tuple names one
output row, so a consumer drops replays with `replay_key` / `ReplayFilter`.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterator, Mapping, cast

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, MapType, StringType, StructType, TimestampType

from pulsar_autoscale.errors import PulsarAutoscaleError

from .options import PulsarOptionError, SinkOptions, normalize_topic
from .ranges import Connection

log = logging.getLogger(__name__)

PROP_QUERY, PROP_BATCH, PROP_PARTITION, PROP_SEQ = "spark.queryId", "spark.batchId", "spark.partitionId", "spark.seq"
# Spark sets these local properties for every task of a micro-batch.
_SPARK_BATCH_ID, _SPARK_QUERY_ID = "streaming.sql.batchId", "sql.streaming.queryId"

_COLUMNS = {
    "topic": (StringType,),
    "key": (StringType, BinaryType),
    "value": (BinaryType, StringType),
    "properties": (MapType,),
    "eventTime": (TimestampType,),
}


class SinkWriteError(PulsarAutoscaleError):
    """Pulsar refused or timed out some of a task's messages; the task fails and Spark retries it."""


def check_sink_schema(schema: StructType, options: SinkOptions) -> None:
    """Fail on the driver for a DataFrame the sink cannot write, naming the column."""
    fields = {f.name: f.dataType for f in schema.fields}
    for name, dtype in fields.items():
        if name not in _COLUMNS:
            raise PulsarOptionError(f"pulsar sink: unexpected column {name!r}; allowed: {sorted(_COLUMNS)}")
        if not isinstance(dtype, _COLUMNS[name]):
            allowed = " or ".join(t.typeName() for t in _COLUMNS[name])
            raise PulsarOptionError(f"pulsar sink: column {name!r} is {dtype.simpleString()}, expected {allowed}")
    if "value" not in fields:
        raise PulsarOptionError("pulsar sink: the DataFrame needs a 'value' column (binary or string)")
    if "topic" not in fields and options.topic is None:
        raise PulsarOptionError("pulsar sink: set the 'topic' option or give the DataFrame a 'topic' column")


@dataclass
class SinkCommit(WriterCommitMessage):
    partition_id: int
    sent: int


def _as_bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def write_partition(options: SinkOptions, rows: Iterator, query_id: str, batch_id: str) -> SinkCommit:
    """Send one task's rows and flush; raises unless Pulsar acknowledged every message."""
    import pulsar
    from pyspark import TaskContext

    # Runs inside a Spark task, where TaskContext.get() is always set.
    partition_id = str(cast(TaskContext, TaskContext.get()).partitionId())
    conn = Connection(options.connection)
    producers: dict[str, pulsar.Producer] = {}
    failures: list[str] = []

    def on_sent(result, _msg_id) -> None:
        if result != pulsar.Result.Ok:
            failures.append(str(result))

    sent = 0
    try:
        for seq, row in enumerate(rows):
            d = row.asDict()
            # The option wins over the column, as in Spark's Kafka sink: a job that keeps the
            # source's `topic` column must not write back into its source.
            topic = options.topic or (normalize_topic(d["topic"], "topic column") if d.get("topic") else None)
            if topic is None:
                raise SinkWriteError("pulsar sink: a row has a null 'topic' and no 'topic' option is set")
            producer = producers.get(topic)
            if producer is None:
                producer = producers[topic] = conn.client.create_producer(
                    topic,
                    batching_enabled=options.batching_enabled,
                    block_if_queue_full=True,
                    max_pending_messages=options.max_pending_messages,
                )
            props = {
                **(d.get("properties") or {}),
                PROP_QUERY: query_id,
                PROP_BATCH: batch_id,
                PROP_PARTITION: partition_id,
                PROP_SEQ: str(seq),
            }
            event: datetime | None = d.get("eventTime")
            key = d.get("key")
            producer.send_async(
                _as_bytes(d["value"] or b""),
                on_sent,
                properties=props,
                partition_key=key.decode() if isinstance(key, (bytes, bytearray)) else key,
                event_timestamp=int(event.timestamp() * 1000) if event else None,
            )
            sent += 1
        for producer in producers.values():
            producer.flush()
        if failures:
            raise SinkWriteError(f"pulsar sink: {len(failures)} of {sent} messages failed: {sorted(set(failures))}")
        return SinkCommit(int(partition_id), sent)
    finally:
        for producer in producers.values():
            producer.close()
        conn.close()


class PulsarBatchWriter(DataSourceWriter):
    """A batch write is 'micro-batch 0' of a query id made up for this job."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema, options)
        self.options = options
        self.query_id = uuid.uuid4().hex

    def write(self, iterator: Iterator) -> SinkCommit:
        return write_partition(self.options, iterator, self.query_id, "0")


class PulsarStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator) -> SinkCommit:
        from pyspark import TaskContext

        ctx = cast(TaskContext, TaskContext.get())  # write() runs inside a Spark task, where it is set
        batch_id = ctx.getLocalProperty(_SPARK_BATCH_ID)
        query_id = ctx.getLocalProperty(_SPARK_QUERY_ID)
        if batch_id is None or query_id is None:
            raise SinkWriteError("pulsar sink: Spark did not pass the micro-batch id to the task")
        return write_partition(self.options, iterator, query_id, batch_id)

    def commit(self, messages: list, batchId: int) -> None:
        log.info("pulsar sink: batch %d committed, %d messages", batchId, sum(m.sent for m in messages if m))

    def abort(self, messages: list, batchId: int) -> None:
        log.warning("pulsar sink: batch %d aborted; sent messages stay and the batch is replayed", batchId)


def replay_key(properties: Mapping[str, str]) -> tuple[str, str, str, str] | None:
    """The identity of a sink row across replays; None for messages not written by this sink."""
    try:
        return (properties[PROP_QUERY], properties[PROP_BATCH], properties[PROP_PARTITION], properties[PROP_SEQ])
    except KeyError:
        return None


@dataclass
class ReplayFilter:
    """Drops messages a replayed batch or retried task wrote again (keeps every first copy)."""

    _seen: set = field(default_factory=set)

    def first_time(self, properties: Mapping[str, str]) -> bool:
        key = replay_key(properties)
        if key is None:
            return True
        if key in self._seen:
            return False
        self._seen.add(key)
        return True
