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
import threading
import time
import uuid
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from functions.model.config import FunctionConfig  # noqa: E402
from functions.spark.burst_drain import _ends_entry, _subscribe  # noqa: E402
from pulsar_autoscale.broker.embedded import EmbeddedBroker  # noqa: E402
from pulsar_autoscale.broker.lite.incarnation import incarnation_client, join_shared_subscription  # noqa: E402
from pulsar_autoscale.broker.metrics import fetch  # noqa: E402
from pulsar_autoscale.broker.profile import LITE  # noqa: E402

MESSAGES, DRAINS, PER_DRAIN = 15_000, 5, 1000
STALLED_AFTER_S = 10.0  # nothing received this long with messages missing: stalled
KICKS, KICK_WAIT_S = 8, 3.0


def spin() -> None:
    while True:
        pass


class Instance:
    """The slow instance: one consumer on its own incarnation client, replaced by `reopen`."""

    def __init__(self, broker: EmbeddedBroker, cfg: FunctionConfig):
        self.client = incarnation_client(broker.service_url, LITE)
        self.cfg = cfg
        self.consumer = self._open()
        self.counts: dict[bytes, int] = {}
        self.last = time.monotonic()
        self.lock, self.stop, self.drained = threading.Lock(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._consume, daemon=True)
        self.thread.start()

    def _open(self) -> pulsar.Consumer:
        return self.client.subscribe(
            list(self.cfg.inputs),
            self.cfg.subscription_name,
            consumer_type=pulsar.ConsumerType.Shared,
            receiver_queue_size=100,
        )

    def count(self, msg) -> None:
        with self.lock:
            self.counts[msg.data()] = self.counts.get(msg.data(), 0) + 1
            self.last = time.monotonic()

    def _consume(self) -> None:
        while not self.stop.is_set():
            consumer = self.consumer
            try:
                msg = consumer.receive(100)
            except pulsar.PulsarException:  # a timeout, or the consumer a reopen just closed
                continue
            time.sleep(0.001 if self.drained.is_set() else 0.004)
            self.count(msg)
            try:
                consumer.acknowledge(msg)
            except pulsar.PulsarException:
                pass  # closed by a reopen meanwhile: the subscription redelivers it (a duplicate, not a loss)

    def reopen(self, order: str) -> None:
        old = self.consumer
        if order == "open-close":
            self.consumer = self._open()
            old.close()
        else:
            old.close()
            self.consumer = self._open()

    def idle_s(self) -> float:
        with self.lock:
            return time.monotonic() - self.last

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.consumer.close()
        self.client.close()


def one_run(broker: EmbeddedBroker, order: str) -> dict:
    name = f"stall-{uuid.uuid4().hex[:6]}"
    cfg = FunctionConfig.from_dict(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "sleepy.Sleepy",
            "inputs": [f"persistent://public/default/{name}-in"],
            "output": f"persistent://public/default/{name}-out",
        }
    )
    producer_client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    instance = Instance(broker, cfg)
    try:
        producer = producer_client.create_producer(
            cfg.inputs[0],
            batching_enabled=True,
            batching_max_publish_delay_ms=5,
            batching_max_messages=100,
            block_if_queue_full=True,
        )
        for i in range(MESSAGES):
            producer.send_async(str(i).encode(), None)
        producer.flush()
        producer.close()
        for i in range(DRAINS):
            client, consumer = join_shared_subscription(
                broker.service_url, lambda c: _subscribe(c, cfg, f"drain-{i}", 100), f"drain {i}"
            )
            got: list = []
            while len(got) < PER_DRAIN or not _ends_entry(got[-1]):
                try:
                    got.append(consumer.receive(1000))
                except pulsar.Timeout:
                    break
            for msg in got:
                instance.count(msg)
                consumer.acknowledge(msg)
            consumer.close()
            client.close()
        instance.drained.set()
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
            instance.reopen(order)
            instance.last = time.monotonic()
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
