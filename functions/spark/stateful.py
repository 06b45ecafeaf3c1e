"""A stateful stage: a DAG node whose runtime is a Spark Structured Streaming query.

The stage reads its input topic with the `pulsar` source, counts messages per key (and per
tumbling event-time window when one is configured) with `applyInPandasWithState` on the
RocksDB state store, and writes every changed count (output mode "update") to its output
topic with the `pulsar` sink, whose replay properties let a consumer drop replayed rows.

Parallelism, as the controller sees it, is the number of input partitions per micro-batch
(the source's `minPartitions`): the read, decode and key-extraction tasks. The number of
state partitions (`spark.sql.shuffle.partitions` of the stateful operator) is fixed when the
checkpoint is created; see docs/spark-stateful.md.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.functions.spark.stateful_config import AVAILABLE_NOW, STATE_STORES, StatefulStageConfig, check_parallelism
from pulsar_autoscale.pulsar_client import ClientSettings
from pulsar_autoscale.snapshot import FunctionSnapshot
from pulsar_autoscale.spark_bridge.session import SparkSettings, worker_session

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)

# Message properties the stage adds to each output (the sink adds spark.queryId/batchId/...).
PROP_STAGE, PROP_COUNT, PROP_WINDOW_START, PROP_WINDOW_END, PROP_FINAL = ("stage", "count", "windowStart", "windowEnd", "final")

# Output of the per-group function, and the state kept per group.
_OUTPUT_SCHEMA = "key string, windowStart long, windowEnd long, count long, final boolean, eventMs long"
_STATE_SCHEMA = "count long"


class StatefulStageError(PulsarAutoscaleError):
    """The stage's streaming query failed or did not do what was asked in time."""


def count_group(key: tuple, batches: Iterator, state) -> Iterator:
    """applyInPandasWithState: add a group's rows to its count and emit the running count.

    The group is (key, windowStart, windowEnd); the window columns are null without a window.
    Exactly one row per call, so a replayed micro-batch writes the same rows in the same order
    (Spark sorts a partition by group) and the sink's replay properties name them again.
    A window whose watermark passed times out: its final count is emitted and its state dropped.
    """
    import pandas as pd

    group_key, window_start, window_end = key
    # Null grouping values reach Python as None or NaN, numbers as numpy scalars.
    window_start = None if pd.isna(window_start) else int(window_start)
    window_end = None if pd.isna(window_end) else int(window_end)
    if state.hasTimedOut:
        (count,) = state.get
        state.remove()
        event_ms, final = window_end, True
    else:
        count = state.get[0] if state.exists else 0
        event_ms, final = None, False
        for pdf in batches:
            count += len(pdf)
            latest = pdf["eventMs"].max()
            if pd.notna(latest) and (event_ms is None or latest > event_ms):
                event_ms = int(latest)
        state.update((count,))
        if window_end is not None:
            state.setTimeoutTimestamp(window_end)
    yield pd.DataFrame(
        {
            "key": pd.Series([group_key], dtype="object"),
            "windowStart": pd.Series([window_start], dtype="Int64"),
            "windowEnd": pd.Series([window_end], dtype="Int64"),
            "count": pd.Series([count], dtype="int64"),
            "final": pd.Series([final], dtype="bool"),
            "eventMs": pd.Series([event_ms], dtype="Int64"),
        }
    )


def build_query(spark: "SparkSession", cfg: StatefulStageConfig, client: ClientSettings | None = None) -> "DataFrame":
    """The stage's streaming DataFrame, in the sink's columns (key, value, properties, eventTime).
    `client`: auth and TLS for the source (default: none, at cfg.service_url)."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from pulsar_autoscale.spark_bridge.options import client_options

    reader = (
        spark.readStream.format("pulsar")
        .options(**client_options(client or ClientSettings(cfg.service_url)))
        .option("topic", cfg.input)
        .option("minPartitions", str(cfg.parallelism))
        .option("allowEmptyTopics", "true")
    )
    if cfg.max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", str(cfg.max_records_per_trigger))
    src = reader.load()
    when = F.col("publishTime") if cfg.event_time == "publishTime" else F.coalesce("eventTime", "publishTime")
    key = F.col("properties")[cfg.key_property] if cfg.key_property else F.col("key")
    rows = src.select(key.alias("key"), when.alias("ts"))
    if cfg.window:
        rows = (
            rows.withWatermark("ts", cfg.allowed_lateness)
            .withColumn("w", F.window("ts", cfg.window))
            .select("key", "ts", F.unix_millis("w.start").alias("windowStart"), F.unix_millis("w.end").alias("windowEnd"))
        )
        timeout = GroupStateTimeout.EventTimeTimeout
    else:
        rows = rows.select(
            "key", "ts", F.lit(None).cast("long").alias("windowStart"), F.lit(None).cast("long").alias("windowEnd")
        )
        timeout = GroupStateTimeout.NoTimeout
    # `ts` stays in the input: Spark needs the watermarked column to time out windows.
    counts = (
        rows.withColumn("eventMs", F.unix_millis("ts"))
        .groupBy("key", "windowStart", "windowEnd")
        .applyInPandasWithState(count_group, _OUTPUT_SCHEMA, _STATE_SCHEMA, "append", timeout)
    )
    props = [F.lit(PROP_STAGE), F.lit(cfg.fqfn), F.lit(PROP_COUNT), F.col("count").cast("string")]
    if cfg.window:
        props += [
            F.lit(PROP_WINDOW_START),
            F.col("windowStart").cast("string"),
            F.lit(PROP_WINDOW_END),
            F.col("windowEnd").cast("string"),
            F.lit(PROP_FINAL),
            F.when(F.col("final"), "true").otherwise("false"),
        ]
    value = F.to_json(F.struct("key", "windowStart", "windowEnd", "count", "final"))
    return counts.select(
        "key", value.alias("value"), F.create_map(*props).alias("properties"), F.timestamp_millis("eventMs").alias("eventTime")
    )


def checkpoint_confs(checkpoint_dir: str | Path) -> dict[str, str]:
    """The SQL confs Spark stored with the newest batch of a checkpoint ({} before the first batch)."""
    offsets = Path(checkpoint_dir) / "offsets"
    batches = sorted((int(p.name) for p in offsets.glob("*") if p.name.isdigit()), reverse=True)
    for batch in batches:
        lines = (offsets / str(batch)).read_text().splitlines()
        if len(lines) >= 2:
            return dict(json.loads(lines[1]).get("conf", {}))
    return {}


@dataclass(frozen=True)
class StageStatus:
    """What the controller reads about a stateful stage (None: not measured yet)."""

    name: str
    running: bool
    parallelism: int  # input partitions per micro-batch
    state_partitions: int | None  # fixed by the checkpoint
    batch_id: int | None = None
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    num_input_rows: int | None = None  # in the last micro-batch
    state_rows: int | None = None  # groups held in state
    end_offsets: Mapping[str, list] | None = None
    backlog_entries: int | None = None  # entries (batches, when producers batch) behind the topic's end
    error: str | None = None

    def to_snapshot(self) -> FunctionSnapshot:
        return FunctionSnapshot(
            name=self.name,
            parallelism=self.parallelism,
            arrival_rate=self.input_rows_per_second,
            backlog=None if self.backlog_entries is None else float(self.backlog_entries),
            processing_rate=self.processed_rows_per_second,
            running=self.parallelism if self.running else 0,
        )


def progress_field(progress: Any, name: str) -> Any:
    """A field of a streaming progress report (a dict or a StreamingQueryProgress), None when absent."""
    if progress is None:
        return None
    try:
        return progress[name]
    except (KeyError, TypeError):
        return getattr(progress, name, None)


class StatefulStage:
    """Starts, supervises, re-scales and stops one stage's streaming query.

    The stage's shuffle partitions and state store provider are set on the session only while
    the query starts (a query copies the session's confs then), so they do not leak into
    other queries of the same session.
    """

    def __init__(
        self,
        config: StatefulStageConfig,
        spark: "SparkSession | None" = None,
        client: ClientSettings | None = None,
        spark_settings: SparkSettings | None = None,
    ) -> None:
        """`client`: auth and TLS for the stage's source and sink (its URL is the config's serviceUrl);
        `spark_settings`: the master to start a session on when `spark` is None (default local[*])."""
        self.config = config.validated()
        self.spark_settings = spark_settings
        self.client = replace(client or ClientSettings(self.config.service_url), service_url=self.config.service_url)
        self._base = spark
        self._session: "SparkSession | None" = None
        self._query: "StreamingQuery | None" = None

    # ---- lifecycle ----------------------------------------------------------------------
    @property
    def query(self) -> "StreamingQuery | None":
        return self._query

    def session(self) -> "SparkSession":
        if self._session is None:
            from pulsar_autoscale.spark_bridge import register

            self._session = self._base or worker_session(self.spark_settings, f"stateful-{self.config.fqfn}")
            register(self._session)
        return self._session

    def start(self) -> "StreamingQuery":
        if self._query is not None and self._query.isActive:
            raise StatefulStageError(f"stateful stage {self.config.fqfn} is already running")
        from pulsar_autoscale.spark_bridge.options import client_options

        cfg = self.config
        spark = self.session()
        # Spark looks Python data sources up in the JVM thread's active session, which a thread
        # other than the session's creator (the worker's supervisor) does not have: set it, as
        # PySpark's own createDataFrame does.
        type(spark)._get_j_spark_session_class(spark._jvm).setActiveSession(spark._jsparkSession)
        # The query copies the session's confs when it starts, so the stage's own values are
        # set for start() only and the session is left as it was. Shuffle partitions count only
        # for a new checkpoint: afterwards Spark restores the stored value.
        confs = {
            "spark.sql.shuffle.partitions": str(cfg.state_partitions or cfg.parallelism),
            "spark.sql.streaming.stateStore.providerClass": STATE_STORES[cfg.state_store],
        }
        before = {k: spark.conf.get(k, None) for k in confs}
        try:
            for k, v in confs.items():
                spark.conf.set(k, v)
            writer = (
                build_query(spark, cfg, self.client)
                .writeStream.format("pulsar")
                .outputMode("append")
                .options(**client_options(self.client))
                .option("topic", cfg.output)
                .option("checkpointLocation", cfg.checkpoint_dir)
                .queryName(_query_name(cfg.fqfn))
            )
            if cfg.trigger == AVAILABLE_NOW:
                writer = writer.trigger(availableNow=True)
            else:
                writer = writer.trigger(processingTime=cfg.trigger)
            self._query = writer.start()
        finally:
            for k, old in before.items():
                if old is None:
                    spark.conf.unset(k)
                else:
                    spark.conf.set(k, old)
        log.info(
            "stateful stage %s started: parallelism %d, query %s run %s",
            cfg.fqfn,
            cfg.parallelism,
            self._query.id,
            self._query.runId,
        )
        return self._query

    def stop(self, graceful_timeout_s: float = 30.0) -> None:
        """Stop the query, first waiting (bounded) for a running micro-batch to finish.

        A micro-batch cut short is replayed from the checkpoint on the next start: its rows go
        out again with the same replay properties, so waiting only saves work downstream.
        """
        query = self._query
        if query is None:
            return
        deadline = time.monotonic() + graceful_timeout_s
        while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.1)
        query.stop()

    def set_parallelism(self, parallelism: int) -> "StreamingQuery | None":
        """Use `parallelism` input partitions per micro-batch; a running query restarts now.

        The restart is from the same checkpoint, so state and offsets are kept. The state
        partitions stay as the checkpoint fixed them: see docs/spark-stateful.md. A stopped
        stage (or a finished availableNow run) takes the new value at its next start().
        """
        check_parallelism(parallelism, self.config.max_parallelism, "parallelism")
        was_running = self._query is not None and self._query.isActive
        self.stop()
        self.config = replace(self.config, parallelism=parallelism)
        return self.start() if was_running else self._query

    def await_termination(self, timeout_s: float) -> None:
        """For trigger availableNow: wait (bounded) until the query read all it found at start."""
        query = self._require_query()
        # pyspark annotates `timeout: Optional[int]`, but it takes a float too (it checks for int or float).
        if not query.awaitTermination(timeout_s):  # type: ignore[arg-type]
            raise StatefulStageError(f"stateful stage {self.config.fqfn}: query still running after {timeout_s:.0f}s")
        self._raise_failure()

    def wait_for_rows(self, rows: int, timeout_s: float) -> None:
        """Wait (bounded) until this run of the query has read at least `rows` input rows."""
        query = self._require_query()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._raise_failure()
            if sum(p["numInputRows"] for p in query.recentProgress) >= rows:
                return
            time.sleep(0.2)
        raise StatefulStageError(f"stateful stage {self.config.fqfn}: fewer than {rows} rows read in {timeout_s:.0f}s")

    # ---- figures --------------------------------------------------------------------------
    def status(self, with_backlog: bool = True) -> StageStatus:
        cfg = self.config
        query = self._query
        state_partitions = checkpoint_confs(cfg.checkpoint_dir).get("spark.sql.shuffle.partitions")
        base: dict[str, Any] = dict(
            name=cfg.fqfn,
            running=bool(query and query.isActive),
            parallelism=cfg.parallelism,
            state_partitions=int(state_partitions) if state_partitions else None,
        )
        progress = query.lastProgress if query is not None else None
        error = None
        if query is not None and not query.isActive and query.exception() is not None:
            error = str(query.exception())
        if progress is None:
            return StageStatus(**base, error=error)
        sources = progress_field(progress, "sources") or []
        end = progress_field(sources[0], "endOffset") if sources else None
        end_offsets = json.loads(end) if isinstance(end, str) else end
        operators = progress_field(progress, "stateOperators") or []
        return StageStatus(
            **base,
            batch_id=progress_field(progress, "batchId"),
            input_rows_per_second=progress_field(progress, "inputRowsPerSecond"),
            processed_rows_per_second=progress_field(progress, "processedRowsPerSecond"),
            num_input_rows=progress_field(progress, "numInputRows"),
            state_rows=sum(progress_field(op, "numRowsTotal") or 0 for op in operators) if operators else None,
            end_offsets=end_offsets,
            backlog_entries=self._backlog(end_offsets) if with_backlog and end_offsets else None,
            error=error,
        )

    def _backlog(self, end_offsets: Mapping[str, list]) -> int | None:
        """Entries between the last processed offset and each topic's last message."""
        from pulsar_autoscale.spark_bridge.offsets import TopicRange, offsets_from_json
        from pulsar_autoscale.spark_bridge.options import ConnectionOptions
        from pulsar_autoscale.spark_bridge.ranges import Connection, last_position

        conn = Connection(ConnectionOptions(self.client, None, 10))
        try:
            total = 0
            for topic, pos in offsets_from_json(end_offsets).items():
                last = last_position(conn, topic)
                if last is not None and last > pos:
                    total += max(1, TopicRange(topic, pos, last).entries())
            return total
        except Exception as exc:  # a figure, not a reason to fail the controller's loop
            log.warning("stateful stage %s: backlog unknown: %s", self.config.fqfn, exc)
            return None
        finally:
            conn.close()

    # ---- helpers --------------------------------------------------------------------------
    def _require_query(self) -> "StreamingQuery":
        if self._query is None:
            raise StatefulStageError(f"stateful stage {self.config.fqfn} was never started")
        return self._query

    def _raise_failure(self) -> None:
        query = self._require_query()
        if query.exception() is not None:
            raise StatefulStageError(f"stateful stage {self.config.fqfn} failed: {query.exception()}")


def _query_name(fqfn: str) -> str:
    return "stateful_" + re.sub(r"[^A-Za-z0-9_]", "_", fqfn)
