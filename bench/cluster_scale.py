"""Throughput of a CPU-bound function (process runtime) on a cluster of 1, 2, 3 worker processes.

One broker; for each cluster size a fresh cluster of worker processes (`worker --cluster`),
a Spin function (5 ms of CPU per message) with `--per-worker` process instances per worker,
`--messages` produced at once when its instances run, then the time until every message has an output.
The 1-worker cluster is the baseline of the same run. Prints one JSON object.
Usage: python bench/cluster_scale.py [--workers 1,2,3] [--messages 3000] [--per-worker 1] [--broker lite|apache|both]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench.brokers import add_broker_option, per_broker  # noqa: E402
from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from tests.support.cluster_harness import WorkerCluster  # noqa: E402
from tests.support.scenario import EXAMPLES, OutputCollector, wait_until  # noqa: E402


def run_one(broker, workers: int, messages: int, per_worker: int, work_ms: float) -> dict:
    with (
        tempfile.TemporaryDirectory(prefix="cluster-bench-") as d,
        WorkerCluster(broker.service_url, broker.metrics_url, Path(d), n=workers, runtime="process") as c,
    ):
        admin = FunctionsAdmin([w.url for w in c.live()])
        name = f"spin{workers}"
        src, dst = f"persistent://public/default/{name}-{c.name}-in", f"persistent://public/default/{name}-{c.name}-out"
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        collector = OutputCollector(client, dst)
        instances = workers * per_worker
        t0 = time.monotonic()
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "spin.Spin",
                "inputs": [src],
                "output": dst,
                "parallelism": instances,
                "receiverQueueSize": 20,
                "userConfig": {"work_ms": work_ms},
            },
            str(EXAMPLES / "spin.py"),
        )
        wait_until(lambda: admin.status("public", "default", name)["numRunning"] == instances, 120, "instances running")
        running_s = time.monotonic() - t0
        # The subscription starts at the latest message (as in Pulsar): produce once it exists.
        producer = client.create_producer(src, batching_enabled=True, batching_max_messages=20, block_if_queue_full=True)
        t1 = time.monotonic()
        for i in range(messages):
            producer.send_async(str(i).encode(), None)
        producer.flush()
        wait_until(
            lambda: collector.distinct() >= messages,
            600,
            lambda: f"{messages} outputs (got {collector.distinct()})",
            interval_s=0.05,
        )
        drain_s = time.monotonic() - t1
        placed = {w: len(v) for w, v in admin.assignments().items()}
        admin.delete("public", "default", name)
        collector.close()
        producer.close()
        client.close()
        return {
            "workers": workers,
            "instances": instances,
            "placement": placed,
            "messages": messages,
            "start_s": round(running_s, 2),
            "drain_s": round(drain_s, 2),
            "throughput_msg_s": round(messages / drain_s, 1),
            "duplicates": collector.duplicates(),
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,3", help="cluster sizes, comma-separated (default 1,2,3)")
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--per-worker", type=int, default=1, help="process instances per worker (default 1)")
    ap.add_argument("--work-ms", type=float, default=5.0, help="CPU per message (default 5 ms)")
    add_broker_option(ap)
    args = ap.parse_args()
    sizes = [int(x) for x in args.workers.split(",")]

    def measure(broker) -> dict:
        runs = [run_one(broker, n, args.messages, args.per_worker, args.work_ms) for n in sizes]
        base = runs[0]["throughput_msg_s"]
        for r in runs:
            r["speedup_vs_1_worker"] = round(r["throughput_msg_s"] / base, 2)
            r["efficiency"] = round(r["speedup_vs_1_worker"] / (r["workers"] / runs[0]["workers"]), 2)
        return {"runs": runs}

    print(
        json.dumps(
            {
                "bench": "cluster_scale",
                "cpu_cores": os.cpu_count(),
                "work_ms": args.work_ms,
                "per_worker": args.per_worker,
                **per_broker(args.broker, measure),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
