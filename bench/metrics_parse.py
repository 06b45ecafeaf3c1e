"""Controller period cost of reading broker /metrics on a broker with many topics.

Parses a pulsar-lite-shaped /metrics page of N topics (one subscription each) in full, as the controller
did, and filtered to the inputs of 10 functions, as it does now; prints JSON with the ratio.

    .venv/bin/python bench/metrics_parse.py --topics 1000 3000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import time

from pulsar_autoscale.broker.metrics import parse


def page(topics: int) -> str:
    base = 'cluster="pulsar-lite",namespace="public/default",partition="-1"'
    lines = [f"pulsar_broker_in_messages_total {topics * 10}", f"pulsar_entry_size_count {topics}"]
    per_topic = (
        "pulsar_in_messages_total",
        "pulsar_in_bytes_total",
        "pulsar_rate_in",
        "pulsar_storage_size",
        "pulsar_producers_count",
        "pulsar_consumers_count",
        "pulsar_subscriptions_count",
    )
    per_sub = (
        "pulsar_subscription_back_log",
        "pulsar_out_messages_total",
        "pulsar_out_bytes_total",
        "pulsar_subscription_unacked_messages",
        "pulsar_subscription_msg_rate_out",
        "pulsar_subscription_consumers_count",
        "pulsar_subscription_msg_ack_rate",
    )
    for i in range(topics):
        lines += [f'{m}{{{base},topic="t{i}"}} {i}' for m in per_topic]
        lines += [f'{m}{{{base},subscription="public/default/f{i}",topic="t{i}"}} 1' for m in per_sub]
    return "\n".join(lines) + "\n"


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, nargs="+", default=[1000, 3000])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    results = []
    for n in args.topics:
        text = page(n)
        inputs = {f"persistent://public/default/t{i}" for i in range(0, n, max(n // 10, 1))}
        full = best_of(args.repeat, lambda: parse(text, 0.0))
        filtered = best_of(args.repeat, lambda: parse(text, 0.0, topics=inputs))
        results.append(
            {
                "topics": n,
                "lines": text.count("\n"),
                "inputs": len(inputs),
                "full_s": round(full, 4),
                "filtered_s": round(filtered, 4),
                "speedup": round(full / filtered, 1),
            }
        )
    print(json.dumps({"bench": "metrics_parse", "results": results}, indent=2))


if __name__ == "__main__":
    main()
