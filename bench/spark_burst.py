"""Burst drain: time to drain a backlog of a slow function, instances alone vs instances + Spark.

Both runs use the same embedded broker, worker and function (sleepy, deterministic service
time, waiting like a call to a model server) with the same number of thread instances. A
backlog of N messages is produced; "instances" lets the instances drain it, "burst" also
hands a slice to `BurstDrain` at once, sized by `should_burst` for a recovery deadline.
Drain time runs from the first message produced to the last distinct output seen at the
output topic. Spark's session start and first Python job are paid before timing, as a
long-lived driver would. Prints one JSON object with both runs, loss, duplicates and the ratio.

    .venv/bin/python bench/spark_burst.py                       # 20,000 messages, 20 ms, 4 instances
    .venv/bin/python bench/spark_burst.py --messages 5000       # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from pulsar_autoscale.broker.embedded import EmbeddedBroker  # noqa: E402
from pulsar_autoscale.controller.burst_plan import should_burst  # noqa: E402
from pulsar_autoscale.functions.api.server import WorkerServer  # noqa: E402
from pulsar_autoscale.functions.spark.burst_drain import BurstDrain  # noqa: E402
from pulsar_autoscale.snapshot import FunctionSnapshot  # noqa: E402
from tests.support.burst import produce_batched, sleepy_config  # noqa: E402

SLEEPY = str(Path(__file__).resolve().parent.parent / "functions" / "examples" / "sleepy.py")


class Counter:
    """Counts distinct payloads and duplicates on a topic (Shared: pulsar-lite B1 spares Shared)."""

    def __init__(self, client: pulsar.Client, topic: str):
        self.seen: dict[bytes, int] = {}
        self.last_new = 0.0
        self._consumer = client.subscribe(
            topic,
            f"bench-{uuid.uuid4().hex[:8]}",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._consumer.receive(100)
            except pulsar.Timeout:
                continue
            data = msg.data()
            if data not in self.seen:
                self.last_new = time.monotonic()
            self.seen[data] = self.seen.get(data, 0) + 1
            self._consumer.acknowledge(msg)

    def wait(self, n: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while len(self.seen) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(self.seen) >= n

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


def one_run(mode: str, args, broker, worker, client, spark) -> dict:
    name = f"bench-burst-{mode}-{uuid.uuid4().hex[:6]}"
    cfg = sleepy_config(name, parallelism=args.instances, userConfig={"service_ms": args.service_ms, "dist": "deterministic"})
    admin = FunctionsAdmin(worker.url)
    admin.create(cfg, SLEEPY)
    counter = Counter(client, cfg["output"])
    fqfn = f"public/default/{name}"
    deadline = time.monotonic() + 60
    while admin.status("public", "default", name)["numRunning"] < args.instances:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: instances did not start")
        time.sleep(0.05)
    t0 = time.monotonic()
    produce_batched(client, cfg["inputs"][0], args.messages, lambda i: {"event_timestamp": int(time.time() * 1000)})
    produced_s = time.monotonic() - t0
    out: dict = {"mode": mode, "messages": args.messages, "instances": args.instances, "produce_s": round(produced_s, 2)}
    if mode == "burst":
        mu = 1000.0 / args.service_ms
        snap = FunctionSnapshot(
            name=fqfn, parallelism=args.instances, backlog=float(args.messages), service_rate=mu, arrival_rate=0.0
        )
        burst = should_burst(snap, args.instances, args.instances, 0.0, args.deadline_s)
        out["should_burst"] = burst
        if burst > 0:
            drain = BurstDrain(spark, broker.service_url, worker.worker.get(fqfn), SLEEPY, metrics_url=broker.metrics_url)
            r = drain.run(max_messages=burst, partitions=args.partitions, threads_per_partition=args.threads)
            out["drain"] = {
                "taken": r.taken,
                "processed": r.processed,
                "outputs": r.outputs,
                "failed": r.failed,
                "seconds": round(r.seconds, 2),
                **{k: round(v, 2) for k, v in r.timings.items()},
            }
    complete = counter.wait(args.messages, args.timeout_s)
    time.sleep(1.0)  # late duplicates
    counters = worker.worker.counters(fqfn)
    out.update(
        {
            "complete": complete,
            "drain_s": round(counter.last_new - t0, 2),
            "lost": args.messages - len(counter.seen),
            "duplicates": sum(c - 1 for c in counter.seen.values()),
            "instances_received": int(counters.received),
        }
    )
    counter.close()
    admin.delete("public", "default", name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--service-ms", type=float, default=20.0)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=2, help="Spark partitions of the drain")
    ap.add_argument("--threads", type=int, default=16, help="threads per partition (a waiting function's concurrency)")
    ap.add_argument("--deadline-s", type=float, default=10.0, help="recovery deadline given to should_burst")
    ap.add_argument("--spark-master", default="local[2]")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--modes", default="instances,burst")
    args = ap.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(args.spark_master)
        .appName("bench-spark-burst")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .config("spark.local.dir", tempfile.mkdtemp(prefix="bench-spark-"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).collect()  # first Python job, untimed
    runs = []
    with EmbeddedBroker() as broker, WorkerServer(broker.service_url, metrics_url=broker.metrics_url) as worker:
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        for mode in args.modes.split(","):
            runs.append(one_run(mode, args, broker, worker, client, spark))
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        client.close()
    spark.stop()
    by_mode = {r["mode"]: r for r in runs}
    result = {
        "bench": "spark_burst",
        "service_ms": args.service_ms,
        "spark_master": args.spark_master,
        "partitions": args.partitions,
        "threads_per_partition": args.threads,
        "runs": runs,
    }
    if "instances" in by_mode and "burst" in by_mode and by_mode["burst"]["drain_s"] > 0:
        result["speedup"] = round(by_mode["instances"]["drain_s"] / by_mode["burst"]["drain_s"], 2)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
