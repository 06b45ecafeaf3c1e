"""A Spark stateful stage's parallelism change (stop, restart from its checkpoint) on the keyed workload of
bench/state_migration.py: 10,000 keys, one count per key, fed at a fixed rate; 2 -> 3 and 3 -> 2.

Per change: how long set_parallelism takes (every key waits), and the peak and mean end-to-end latency of
the outputs whose newest input was sent from the change until 1 s after it, against the steady period
before. Compare with the live migration's numbers (BENCHMARKS.md, docs/keyed-state.md).

    .venv/bin/python bench/spark_stateful_restart.py [--keys 10000] [--rate 80]

Prints one JSON object. Spark local[2], trigger 1 s, RocksDB state store.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from state_migration import CHANGE_TAIL_S, _load, _wait  # noqa: E402  (bench/ is not a package)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=80.0, help="records/s (bench/state_migration.py's 70%% load)")
    ap.add_argument("--steady-s", type=float, default=10.0)
    args = ap.parse_args()

    import pulsar
    from pyspark.sql import SparkSession

    from pulsar_autoscale.broker.embedded import EmbeddedBroker
    from pulsar_autoscale.functions.spark.stateful import StatefulStage
    from pulsar_autoscale.functions.spark.stateful_config import StatefulStageConfig
    from pulsar_autoscale.spark_bridge import register

    os.environ["PYSPARK_PYTHON"] = sys.executable
    tmp = tempfile.mkdtemp(prefix="bench-spark-restart-")
    keys = [f"key-{i}" for i in range(args.keys)]
    out: dict = {"keys": args.keys, "rate_per_s": args.rate, "spark": "local[2], trigger 1 s, rocksdb"}
    with EmbeddedBroker(data_dir=os.path.join(tmp, "broker"), log_level="warn") as broker:
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("bench-spark-restart")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "1g")
            .config("spark.local.dir", os.path.join(tmp, "spark"))
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        name = f"sc-{uuid.uuid4().hex[:6]}"
        src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
        stage = StatefulStage(
            StatefulStageConfig(
                name=name,
                input=src,
                output=dst,
                service_url=broker.service_url,
                checkpoint_dir=os.path.join(tmp, "ck"),
                parallelism=2,
                state_partitions=2,
                trigger="1 second",
            ),
            spark,
        )
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        producer = client.create_producer(src, batching_enabled=True, batching_max_publish_delay_ms=5, block_if_queue_full=True)
        for k in keys:  # the state: one count per key
            producer.send_async(b"x", None, partition_key=k, event_timestamp=int(time.time() * 1000))
        producer.flush()
        producer.close()
        client.close()
        stage.start()
        _wait(lambda: (stage.status().state_rows or 0) >= args.keys, 600, "the preload in the state")

        ctx = mp.get_context("spawn")
        stop, started, sent = ctx.Event(), ctx.Event(), ctx.Value("q", 0)
        result_path = os.path.join(tmp, "arrivals.json")
        loader = ctx.Process(target=_load, args=(broker.service_url, src, dst, keys, args.rate, stop, started, sent, result_path))
        loader.start()
        started.wait(60)
        changes = []
        for target in (3, 2):
            time.sleep(args.steady_s)
            t_put = time.time() * 1000
            stage.set_parallelism(target)
            t_done = time.time() * 1000
            changes.append(
                {
                    "change": f"{5 - target}->{target}",
                    "t_put": t_put,
                    "t_done": t_done,
                    "set_parallelism_s": round((t_done - t_put) / 1000, 3),
                }
            )
        time.sleep(args.steady_s)
        stop.set()
        loader.join(120)
        stage.stop()
        spark.stop()
    data = json.loads(Path(result_path).read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    arrivals = data["arrivals"]
    out["sent"], out["outputs"] = data["sent"], len(arrivals)
    for c in changes:
        lo, hi = c.pop("t_put"), c.pop("t_done")
        during = [r - e for r, e, _ in arrivals if lo <= e <= hi + CHANGE_TAIL_S * 1000]
        steady = [r - e for r, e, _ in arrivals if lo - args.steady_s * 1000 + 1000 <= e < lo]
        c.update(
            {
                "outputs_during": len(during),
                "peak_ms": max(during, default=None),
                "mean_ms": round(statistics.fmean(during), 1) if during else None,
                "steady_mean_ms": round(statistics.fmean(steady), 1) if steady else None,
                "steady_peak_ms": max(steady, default=None),
            }
        )
    out["changes"] = changes
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
