"""Source throughput of the `pulsar` Spark data source against a raw pulsar-client Reader.

Both read the same N-message backlog from the same embedded broker in the same run. Spark's
session start and first Python batch (~20 s together) are paid before timing, as a long-lived
job would. Prints one JSON object; the ratio is Spark msg/s over Reader msg/s.

    .venv/bin/python bench/spark_bridge.py --messages 200000 --size 1024
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid

import pulsar

from pulsar_autoscale.broker.embedded import EmbeddedBroker


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
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=5000)
    for _ in range(n):
        reader.read_next(10_000)
    reader.close()
    return time.perf_counter() - t0


def spark_seconds(spark, service_url: str, topic: str, n: int, partitions: int) -> float:
    t0 = time.perf_counter()
    df = (spark.read.format("pulsar").option("service.url", service_url).option("topic", topic)
          .option("minPartitions", str(partitions)).load())
    rows = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()[0]
    elapsed = time.perf_counter() - t0
    if rows.n != n:
        raise SystemExit(f"spark read {rows.n} of {n} messages")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024, help="payload bytes")
    ap.add_argument("--partitions", type=int, nargs="+", default=[1, 2], help="minPartitions values to time")
    ap.add_argument("--repeat", type=int, default=2, help="best of this many timed runs each")
    args = ap.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers import the installed package
    from pyspark.sql import SparkSession

    from pulsar_autoscale.spark_bridge import register

    with EmbeddedBroker() as broker:
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        topic = f"persistent://public/default/bench-spark-{uuid.uuid4().hex[:8]}"
        produce(client, topic, args.messages, args.size)
        raw = min(raw_reader_seconds(client, topic, args.messages) for _ in range(args.repeat))

        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        warm = f"{topic}-warmup"
        produce(client, warm, 100, args.size)
        spark_seconds(spark, broker.service_url, warm, 100, 2)

        result = {
            "messages": args.messages, "payload_bytes": args.size, "cores": os.cpu_count(),
            "raw_reader": {"seconds": round(raw, 3), "msg_per_s": round(args.messages / raw)},
            "spark": {},
        }
        for parts in args.partitions:
            secs = min(spark_seconds(spark, broker.service_url, topic, args.messages, parts) for _ in range(args.repeat))
            result["spark"][f"minPartitions={parts}"] = {
                "seconds": round(secs, 3), "msg_per_s": round(args.messages / secs),
                "ratio_vs_raw_reader": round(raw / secs, 3),
            }
        spark.stop()
        client.close()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
