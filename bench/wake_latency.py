"""Scale to zero and wake-up: how long the first message on a sleeping function's input takes to come
out of the function (BENCHMARKS.md, section 7).

Embedded pulsar-lite broker, our worker (thread runtime) and a controller (period 0.5 s) on loopback;
one function (exclaim) whose controls say min 0, idle_s 1. Each round waits until the function is at
parallelism 0 with no instance running and the controller's wake watcher holds its input, then sends one
message and times send -> output received, and reads the wake record's execute time (the PUT to the
worker). Prints one JSON object.
Usage: python bench/wake_latency.py [--rounds 10] [--runtime thread|process] [--warm-pool N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from pulsar_autoscale.broker.embedded import EmbeddedBroker  # noqa: E402
from pulsar_autoscale.controller.config import ControllerConfig  # noqa: E402
from pulsar_autoscale.controller.loop import Controller  # noqa: E402
from pulsar_autoscale.functions.api.server import WorkerServer  # noqa: E402
from tests.support.scenario import wait_until  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--runtime", default="thread", choices=("thread", "process"))
    ap.add_argument("--warm-pool", type=int, default=0, help="the worker's pre-started processes (process runtime)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wake-"))
    with (
        EmbeddedBroker(data_dir=str(tmp / "broker")) as broker,
        WorkerServer(
            broker.service_url,
            data_dir=str(tmp / "worker"),
            metrics_url=broker.metrics_url,
            runtime=args.runtime,
            warm_pool=args.warm_pool,
        ) as worker,
    ):
        admin, name = FunctionsAdmin(worker.url), f"sleepy-{uuid.uuid4().hex[:6]}"
        fqfn = f"public/default/{name}"
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "inputs": [f"{name}-in"],
                "output": f"{name}-out",
                "className": "pulsar_autoscale.functions.examples.exclaim.Exclaim",
                "customRuntimeOptions": json.dumps({"autoscale": {"min": 0, "idle_s": 1}}),
            }
        )
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        out = client.subscribe(f"{name}-out", "probe", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(f"{name}-in", batching_enabled=False)
        controller = Controller(
            ControllerConfig(
                service_url=broker.service_url,
                admin_url=worker.url,
                metrics_url=broker.metrics_url,
                policy="threshold",
                period_s=0.5,
                window_s=1.0,
                http_port=0,
                decision_log=str(tmp / "decisions.jsonl"),
            )
        ).start()
        latencies, sleep_s = [], []
        try:
            for i in range(args.rounds):
                awake = time.perf_counter()
                wait_until(
                    lambda: admin.get("public", "default", name)["parallelism"] == 0 and fqfn in controller.watcher.watching,
                    60,
                    f"{fqfn} asleep ({i})",
                )
                sleep_s.append(time.perf_counter() - awake)
                assert admin.status("public", "default", name)["numRunning"] == 0
                sent = time.perf_counter()
                producer.send(f"m{i}".encode())
                msg = out.receive(timeout_millis=30_000)
                latencies.append(time.perf_counter() - sent)
                out.acknowledge(msg)
            wakes = wait_until(
                lambda: (
                    [r for r in controller.why(fqfn, 1000) if r["reason"].startswith("wake")][args.rounds - 1 :]
                    and [r for r in controller.why(fqfn, 1000) if r["reason"].startswith("wake")]
                ),
                10,
                "records",
            )
        finally:
            controller.stop()
            client.close()
    by_watcher = [r for r in wakes if r.get("kind") == "wake"]
    print(
        json.dumps(
            {
                "rounds": args.rounds,
                "runtime": args.runtime,
                "warm_pool": args.warm_pool,
                "wake_send_to_output_s": {
                    "median": round(statistics.median(latencies), 4),
                    "max": round(max(latencies), 4),
                    "min": round(min(latencies), 4),
                    "all": [round(x, 4) for x in latencies],
                },
                "woken_by_watcher": len(by_watcher),
                "woken_by_period": len(wakes) - len(by_watcher),
                "wake_put_s_median": round(statistics.median(r.get("execute_seconds", 0) for r in wakes), 4),
                "idle_to_zero_s_median": round(statistics.median(sleep_s[1:] or sleep_s), 3),
                "lost": 0,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
