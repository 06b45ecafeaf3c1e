"""Source throughput of the `pulsar` Spark data source against a raw pulsar-client Reader.

Both read the same N-message backlog from the same embedded broker in the same run. Spark's
session start and first Python batch (~20 s together) are paid before timing, as a long-lived
job would. The raw Reader and the Spark reads alternate, round after round, so a change in the
machine's load hits both; each query's time includes its planning, and the JVM collects the
previous read's garbage before each timed read (untimed), so no read pays for another's; one
untimed round of every read (`--warmup`) comes first. Prints one JSON object:
`ratio_vs_raw_reader` is best Reader time over best Spark time, `ratio_median` the median of the
rounds' own ratios, `cpu_s` the median CPU seconds of this process tree (broker, relay, Spark's
JVM and Python workers included) per read, and the load average around each round.

Like with like: both read through the embedded broker's relay (`broker.service_url`), with the
same receiver queue (the source's `RECEIVER_QUEUE`). The Spark query is `count(*)` and
`sum(length(value))` (`--query value`): the source builds and ships all seven columns, the JVM
reads `value`; `--query all` makes the JVM read every column (lengths of key, value, topic and
messageId, size of properties, max of both times). Each Spark read is timed with the source's C
read loop (`nativeReader=true`) and its Python loop (`false`) unless `--native-reader` says otherwise.

Spark's own cost per query is timed in the same rounds (`spark_floor`): a Python data source with one
partition that yields one row, same query. It does not depend on the message count, so it weighs on
small reads: `ratio_above_floor` is the best Reader time over (best Spark time - best floor time), the
share of the speed that our source controls.

    .venv/bin/python bench/spark_bridge.py --messages 100000 --repeat 3 [--broker both]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid

import pulsar
from brokers import add_broker_option, per_broker
from proc_cpu import tree_cpu_seconds
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pulsar_autoscale.spark_bridge.ranges import RECEIVER_QUEUE

QUERIES = {
    "value": ["count(*) AS n", "sum(length(value)) AS bytes"],
    "all": [
        "count(*) AS n",
        "sum(coalesce(length(key), 0) + length(value) + length(topic) + length(messageId) + size(properties)) AS bytes",
        "max(publishTime) AS p",
        "max(eventTime) AS e",
    ],
}


class _OneRowReader(DataSourceReader):
    def partitions(self):
        return [InputPartition(0)]

    def read(self, partition):
        yield (b"x",)


class OneRowSource(DataSource):
    """Spark's per-query floor: planning, one task, one Python worker round trip, no Pulsar."""

    @classmethod
    def name(cls) -> str:
        return "one-row"

    def schema(self) -> str:
        return "value binary"

    def reader(self, schema):
        return _OneRowReader()


def produce(client: pulsar.Client, topic: str, n: int, size: int) -> None:
    producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    payload = b"x" * size
    for i in range(n):
        producer.send_async(payload, None, partition_key=f"k{i % 100}")
    producer.flush()
    producer.close()


def raw_reader_seconds(client: pulsar.Client, topic: str, n: int) -> float:
    """The baseline: one Reader, one thread, reading the backlog to its end."""
    t0 = time.perf_counter()
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=RECEIVER_QUEUE)
    for _ in range(n):
        reader.read_next(10_000)
    reader.close()
    return time.perf_counter() - t0


def timed(read) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process tree) of one read."""
    cpu0, t0 = tree_cpu_seconds(), time.perf_counter()
    read()
    return time.perf_counter() - t0, tree_cpu_seconds() - cpu0


def spark_seconds(
    spark, service_url: str, topic: str, n: int, partitions: int, query: str = "value", native_reader: str = "auto"
) -> float:
    t0 = time.perf_counter()
    df = (
        spark.read.format("pulsar")
        .option("service.url", service_url)
        .option("topic", topic)
        .option("minPartitions", str(partitions))
        .option("nativeReader", native_reader)
        .load()
    )
    rows = df.selectExpr(*QUERIES[query]).collect()[0]
    elapsed = time.perf_counter() - t0
    if rows.n != n:
        raise SystemExit(f"spark read {rows.n} of {n} messages")
    return elapsed


def floor_seconds(spark) -> float:
    t0 = time.perf_counter()
    spark.read.format(OneRowSource.name()).load().selectExpr(*QUERIES["value"]).collect()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024, help="payload bytes")
    ap.add_argument("--partitions", type=int, nargs="+", default=[1, 2], help="minPartitions values to time")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each times every read once")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds of every read before the timed ones")
    ap.add_argument(
        "--native-reader",
        nargs="+",
        choices=["true", "false", "auto"],
        default=["true", "false"],
        help="the source's nativeReader values to time: true, the C read loop; false, the Python one",
    )
    ap.add_argument(
        "--query",
        choices=sorted(QUERIES),
        default="value",
        help="value: count and sum(length(value)); all: the JVM reads every column",
    )
    add_broker_option(ap)
    args = ap.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers import the installed package
    print(json.dumps(per_broker(args.broker, lambda broker: measure(args, broker)), indent=2))


def measure(args, broker) -> dict:
    from pyspark.sql import SparkSession

    from pulsar_autoscale.spark_bridge import register

    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    topic = f"persistent://public/default/bench-spark-{uuid.uuid4().hex[:8]}"
    produce(client, topic, args.messages, args.size)

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(OneRowSource)
    warm = f"{topic}-warmup"
    for _ in range(2):  # two entries, so the warm-up query has two tasks and warms two Python workers
        produce(client, warm, 50, args.size)
    spark_seconds(spark, broker.service_url, warm, 100, 2)

    reads = {"raw_reader": lambda: raw_reader_seconds(client, topic, args.messages), "spark_floor": lambda: floor_seconds(spark)}
    for parts in args.partitions:
        for loop in args.native_reader:
            reads[f"minPartitions={parts},nativeReader={loop}"] = lambda parts=parts, loop=loop: spark_seconds(
                spark, broker.service_url, topic, args.messages, parts, args.query, loop
            )
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in reads}
    loads = []
    jvm = spark.sparkContext._jvm
    for _ in range(args.warmup):  # untimed: JIT and caches as warm for every read as in a long-lived job
        for read in reads.values():
            jvm.System.gc()
            read()
    for _ in range(args.repeat):
        loads.append(round(os.getloadavg()[0], 2))
        for name, read in reads.items():
            jvm.System.gc()  # the last query's garbage is collected now, not during the next timed read
            runs[name].append(timed(read))
    loads.append(round(os.getloadavg()[0], 2))
    spark.stop()

    def summary(name: str) -> dict:
        wall = [w for w, _ in runs[name]]
        return {
            "seconds": round(min(wall), 3),
            "msg_per_s": round(args.messages / min(wall)),
            "seconds_per_round": [round(w, 3) for w in wall],
            "cpu_s": round(statistics.median(c for _, c in runs[name]), 2),
        }

    raw = runs["raw_reader"]
    floor = min(w for w, _ in runs["spark_floor"])
    result = {
        "messages": args.messages,
        "payload_bytes": args.size,
        "query": QUERIES[args.query],
        "warmup_rounds": args.warmup,
        "cores": os.cpu_count(),
        "load_average_1m_by_round": loads,
        "raw_reader": summary("raw_reader"),
        "spark_floor": summary("spark_floor"),
        "spark": {},
    }
    for name in reads:
        if name not in ("raw_reader", "spark_floor"):
            result["spark"][name] = {
                **summary(name),
                "ratio_vs_raw_reader": round(min(w for w, _ in raw) / min(w for w, _ in runs[name]), 3),
                "ratio_median": round(statistics.median(r[0] / s[0] for r, s in zip(raw, runs[name])), 3),
                "ratio_above_floor": round(min(w for w, _ in raw) / max(min(w for w, _ in runs[name]) - floor, 1e-3), 3),
            }
    client.close()
    return result


if __name__ == "__main__":
    main()
