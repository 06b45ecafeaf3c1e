"""pulsar-lite B12 (docs/dev/pulsar-lite-defects.md): how much of a stalled Shared input does one reopen of its
consumer recover, when the fresh consumer opens before the stalled one closes and when it opens after?

Each run is the joins test's steps (tests/system/spark/test_burst.py::test_repeated_lite_joins_lose_nothing):
15,000 batched messages on a Shared subscription, one slow instance consuming, five drains joining and leaving
from incarnation clients, under `--busy` CPU-bound processes (B12 needs CPU load). When the instance then
receives nothing for 10 s while the broker reports a backlog and nothing unacknowledged (B12's state), its
consumer is reopened in the order given, up to 8 times, each after 3 s without a message; the run records what
each reopen recovered. Prints one JSON object.
Usage: python bench/lite_stall_reopen.py [--runs 6] [--order close-open|open-close|both] [--busy 2] [--out FILE]
(--out: the JSON also to FILE, apart from the client library's log lines on stdout)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
import uuid
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from functions.model.config import FunctionConfig  # noqa: E402
from pulsar_autoscale.broker.embedded import EmbeddedBroker  # noqa: E402
from pulsar_autoscale.broker.metrics import fetch  # noqa: E402
from tests.support.burst import SlowInstance, lite_joins, produce_batched, sleepy_config  # noqa: E402

MESSAGES = 15_000
STALLED_AFTER_S = 10.0  # nothing received this long with messages missing: stalled
KICKS, KICK_WAIT_S = 8, 3.0


def spin() -> None:
    while True:
        pass


def one_run(broker: EmbeddedBroker, order: str) -> dict:
    cfg = FunctionConfig.from_dict(sleepy_config(f"stall-{uuid.uuid4().hex[:6]}"))
    producer_client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    instance = SlowInstance(broker.service_url, cfg)
    try:
        produce_batched(producer_client, cfg.inputs[0], MESSAGES)
        lite_joins(broker.service_url, cfg, instance)
        while len(instance.counts) < MESSAGES and instance.idle_s() < STALLED_AFTER_S:
            time.sleep(0.2)
        if len(instance.counts) >= MESSAGES:
            return {"stalled": False}
        key = (cfg.inputs[0], cfg.subscription_name)
        reading = fetch(broker.metrics_url, time.time(), topics=(cfg.inputs[0],))
        run = {
            "stalled": True,
            "received_before": len(instance.counts),
            "backlog_entries": reading.backlog.get(key),
            "unacked": reading.unacked.get(key),
            "recovered_per_reopen": [],
        }
        for _ in range(KICKS):
            before = len(instance.counts)
            instance.reopen(close_first=order == "close-open")
            while len(instance.counts) < MESSAGES and instance.idle_s() < KICK_WAIT_S:
                time.sleep(0.1)
            run["recovered_per_reopen"].append(len(instance.counts) - before)
            if len(instance.counts) >= MESSAGES:
                break
        run["received_after"] = len(instance.counts)
        run["recovered_all"] = len(instance.counts) >= MESSAGES
        return run
    finally:
        instance.close()
        producer_client.close()


def summary(runs: list[dict]) -> dict:
    stalls = [r for r in runs if r["stalled"]]
    reopens = [n for r in stalls for n in r["recovered_per_reopen"]]
    return {
        "runs": len(runs),
        "stalls": len(stalls),
        "stalls_recovered_all": sum(r["recovered_all"] for r in stalls),
        "reopens": len(reopens),
        "reopens_recovering_nothing": sum(n == 0 for n in reopens),
        "mean_recovered_per_reopen": round(sum(reopens) / len(reopens), 1) if reopens else None,
        "max_recovered_per_reopen": max(reopens, default=None),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=6, help="runs per order")
    ap.add_argument("--order", default="both", choices=("close-open", "open-close", "both"))
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside the broker (B12 needs load)")
    ap.add_argument("--out", type=Path, help="write the JSON to this file too")
    args = ap.parse_args()
    orders = ("close-open", "open-close") if args.order == "both" else (args.order,)
    busy = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in busy:
        p.start()
    result: dict = {"messages": MESSAGES, "busy": args.busy, "orders": {}}
    try:
        with EmbeddedBroker() as broker:
            runs: dict[str, list[dict]] = {order: [] for order in orders}
            for i in range(args.runs):  # the orders alternate: a broker slows as subscriptions pile up (B14)
                for order in orders:
                    runs[order].append(one_run(broker, order))
                    print(f"{order} run {i + 1}/{args.runs}: {runs[order][-1]}", file=sys.stderr, flush=True)
            result["orders"] = {order: {"summary": summary(r), "runs": r} for order, r in runs.items()}
    finally:
        for p in busy:
            p.terminate()
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
