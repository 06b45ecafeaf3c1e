"""What a keyedState function's routing costs, on one worker and on a worker cluster (BENCHMARKS.md, section 10).

The same keyed count (functions/examples/keyed_count.py), 3 thread instances, in four setups: with keyedState
on one worker (no --cluster: one input consumer, records reach the instances through in-process mailboxes) and
spread over 3 workers (a cluster: every record goes through the front's worker and one more topic, its
instance's route topic); and without keyedState on one worker and on 3 workers (each instance a consumer of
the one Shared subscription). Per setup, a fresh worker (or cluster) on one broker, then:
- drain: `--messages` keyed records produced at once; the time until each has its output, and the CPU seconds
  the broker, its relay and the workers used meanwhile, per record (what the hop costs, whatever the cores);
- latency: `--rate` records/s for `--seconds`; p50 / p99 / max of send -> output.
Setups alternate round after round (`--rounds`). Prints one JSON object.

    .venv/bin/python bench/keyed_front.py [--messages 20000] [--rate 100] [--seconds 20] [--keys 1000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from proc_cpu import tree_cpu_seconds  # noqa: E402

from bench.state_migration import _pct  # noqa: E402
from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from pulsar_autoscale.broker.embedded import EmbeddedBroker  # noqa: E402
from tests.support.cluster_harness import WorkerCluster  # noqa: E402
from tests.support.scenario import EXAMPLES, OutputCollector, wait_until  # noqa: E402

SETUPS = [
    ("keyed, 1 worker", 1, True),
    ("keyed, 3 workers", 3, True),
    ("not keyed, 1 worker", 1, False),
    ("not keyed, 3 workers", 3, False),
]
PARALLELISM = 3


def run_one(broker: EmbeddedBroker, label: str, workers: int, keyed: bool, args) -> dict:
    with (
        tempfile.TemporaryDirectory(prefix="keyed-front-") as d,
        WorkerCluster(broker.service_url, broker.metrics_url, Path(d), n=workers, cluster=workers > 1) as cluster,
    ):
        admin = FunctionsAdmin([w.url for w in cluster.live()])
        name = f"kc-{uuid.uuid4().hex[:6]}"
        src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "keyed_count.KeyedCount",
                "inputs": [src],
                "output": dst,
                "parallelism": PARALLELISM,
                "keyedState": keyed,
                "subscriptionPosition": "Earliest",
                "receiverQueueSize": 100,
            },
            str(EXAMPLES / "keyed_count.py"),
        )
        if workers == 1:
            wait_until(lambda: admin.status("public", "default", name)["numRunning"] == PARALLELISM, 120, "3 instances running")
        else:
            wait_until(lambda: cluster.spread(name, PARALLELISM), 120, "3 instances on 3 workers")
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        outputs = OutputCollector(client, dst)
        producer = client.create_producer(src, batching_enabled=True, batching_max_publish_delay_ms=2, block_if_queue_full=True)
        cpu0, t0 = tree_cpu_seconds(include_root=False), time.monotonic()
        for i in range(args.messages):
            producer.send_async(b"x", None, partition_key=f"k{i % args.keys}", event_timestamp=int(time.time() * 1000))
        producer.flush()
        wait_until(
            lambda: outputs.distinct() >= args.messages,
            600,
            lambda: f"{args.messages} outputs (got {outputs.distinct()})",
            interval_s=0.05,
        )
        drain_s, drain_cpu = time.monotonic() - t0, tree_cpu_seconds(include_root=False) - cpu0

        first = outputs.distinct()
        start = time.monotonic()
        n = int(args.rate * args.seconds)
        for i in range(n):
            delay = start + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            producer.send_async(b"x", None, partition_key=f"k{i % args.keys}", event_timestamp=int(time.time() * 1000))
        producer.flush()
        wait_until(
            lambda: outputs.distinct() >= first + n,
            120,
            lambda: f"{n} outputs at {args.rate}/s (got {outputs.distinct() - first})",
            interval_s=0.05,
        )
        latencies = outputs.lags_ms[-n:]
        outputs.close()
        producer.close()
        client.close()
        admin.delete("public", "default", name)
    return {
        "setup": label,
        "workers": workers,
        "keyedState": keyed,
        "messages": args.messages,
        "drain_s": round(drain_s, 2),
        "throughput_msg_s": round(args.messages / drain_s, 1),
        "cpu_ms_per_record": round(1000 * drain_cpu / args.messages, 3),
        "latency_ms_at_rate": {
            "rate_per_s": args.rate,
            "records": len(latencies),
            "p50": _pct(latencies, 0.5),
            "p99": _pct(latencies, 0.99),
            "max": max(latencies),
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000, help="records of the drain")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=100.0, help="records/s of the latency phase")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the latency phase")
    ap.add_argument("--rounds", type=int, default=2, help="each round runs every setup once")
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in SETUPS}
    with EmbeddedBroker() as broker:
        for _ in range(args.rounds):
            for label, workers, keyed in SETUPS:
                runs[label].append(run_one(broker, label, workers, keyed, args))
                print(f"{label}: {runs[label][-1]['throughput_msg_s']} msg/s", file=sys.stderr)
    summary = {}
    for label, rs in runs.items():
        summary[label] = {
            "best_throughput_msg_s": max(r["throughput_msg_s"] for r in rs),
            "median_cpu_ms_per_record": round(statistics.median(r["cpu_ms_per_record"] for r in rs), 3),
            "latency_p50_ms": [r["latency_ms_at_rate"]["p50"] for r in rs],
            "latency_p99_ms": [r["latency_ms_at_rate"]["p99"] for r in rs],
        }
    for label, s in summary.items():
        plain = summary[label.replace("keyed", "not keyed", 1)] if label.startswith("keyed") else s
        s["cpu_per_record_vs_not_keyed"] = round(s["median_cpu_ms_per_record"] / plain["median_cpu_ms_per_record"], 2)
        s["throughput_vs_not_keyed"] = round(s["best_throughput_msg_s"] / plain["best_throughput_msg_s"], 2)
    print(
        json.dumps(
            {
                "bench": "keyed_front",
                "cpu_cores": os.cpu_count(),
                "parallelism": PARALLELISM,
                "messages": args.messages,
                "summary": summary,
                "runs": runs,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
