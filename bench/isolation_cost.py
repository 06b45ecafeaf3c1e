"""What running user code as another user costs the process runtime (docs/security.md, "Isolation of user code").

Two workers on one embedded broker, in one run: `--instance-user nobody` (isolated: each instance drops to
nobody, with a clean environment, before importing its code) and `--instance-user root` (the worker's own
user: no switch), so the bench must run as root. Modes alternate, repetition by repetition, so a
drift of the machine's load hits both alike. For each:

- scale-out latency: a Sleepy function (--service-ms, default 5 ms) on the process runtime under a steady
  --rate (default 100 msg/s); parallelism 1 -> 2; latency = the new instance's first processed message
  minus the moment the PUT returned (and `from_put_sent`, from when it was sent); back to 1 in between.
  --warm-pool N also measures it with N standbys (which drop to the instance user while warming);
- throughput of one instance: --messages (default 20,000) queued before a noop function with one process
  instance starts; messages per second from its first processed message to its last (--tp-repeats runs
  per mode, alternating; the median).

Usage: python bench/isolation_cost.py [--repeats 5] [--rate 100] [--messages 20000] [--tp-repeats 3] [--warm-pool 0]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.support

from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.functions.api.server import WorkerServer  # noqa: E402
from pulsar_autoscale.functions.instance.instance_user import InstanceUser, InstanceUsers  # noqa: E402
from tests.support.scenario import wait_until  # noqa: E402

USERS = ("nobody", "root")


# the suite's bounded wait, polled at 0.005 s: a new instance's first message is what these runs time
wait_for = functools.partial(wait_until, interval_s=0.005)


def load(service_url: str, topic: str, rate: float, stop: threading.Event) -> None:
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    next_t = time.monotonic()
    while not stop.is_set():
        producer.send_async(b"x", None)
        next_t += 1.0 / rate
        time.sleep(max(0.0, next_t - time.monotonic()))
    producer.flush()
    client.close()


class Mode:
    """One worker with one --instance-user, and its scale-out function under load."""

    def __init__(self, broker, user: str, rate: float, service_ms: float, warm_pool: int):
        self.server = WorkerServer(
            broker.service_url,
            metrics_url=broker.metrics_url,
            runtime="process",
            warm_pool=warm_pool,
            instance_users=InstanceUsers(InstanceUser.resolve(user)),
        ).start()
        self.broker, self.user, self.pool = broker, user, warm_pool
        self.admin = FunctionsAdmin(self.server.url)
        self.name = f"iso-{user}-{uuid.uuid4().hex[:6]}"
        self.fqfn = f"public/default/{self.name}"
        self.admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": self.name,
                "inputs": [f"{self.name}-in"],
                "className": "pulsar_autoscale.functions.examples.sleepy.Sleepy",
                "receiverQueueSize": 10,
                "userConfig": {"service_ms": service_ms, "dist": "deterministic"},
            }
        )
        self.stop = threading.Event()
        self.producer = threading.Thread(target=load, args=(broker.service_url, f"{self.name}-in", rate, self.stop), daemon=True)
        self.producer.start()
        self.returned: list[float] = []
        self.sent: list[float] = []
        wait_for(lambda: self.first_processed().get(0), 120, f"{user}: instance 0 to process")

    def first_processed(self) -> dict[int, int]:
        _, figs, _ = self.server.worker.instance_figures(self.fqfn)
        return {i: f.first_processed_ms for i, f in figs.items()}

    def pool_ready(self) -> bool:
        return self.server.worker.warm_pool_view(self.fqfn).ready >= self.pool

    def scale_out_once(self) -> None:
        wait_for(self.pool_ready, 120, f"{self.user}: the warm pool to fill")
        sent_ms = time.time() * 1000
        self.admin.set_parallelism("public", "default", self.name, 2)
        returned_ms = time.time() * 1000
        first = wait_for(lambda: self.first_processed().get(1), 120, f"{self.user}: instance 1 to process")
        self.returned.append(round(first - returned_ms, 1))
        self.sent.append(round(first - sent_ms, 1))
        self.admin.set_parallelism("public", "default", self.name, 1)
        wait_for(lambda: len(self.first_processed()) == 1, 120, f"{self.user}: the scale-in to 1")

    def close(self) -> None:
        self.stop.set()
        self.producer.join(5)
        self.admin.delete("public", "default", self.name)
        self.server.stop()

    def report(self) -> dict:
        return {
            "median_ms": statistics.median(self.returned),
            "max_ms": max(self.returned),
            "samples_ms": self.returned,
            "from_put_sent": {"median_ms": statistics.median(self.sent), "max_ms": max(self.sent)},
        }


def throughput(broker, user: str, messages: int) -> dict:
    """One process instance of a noop function draining `messages` queued before it started."""
    name = f"iso-tp-{user}-{uuid.uuid4().hex[:6]}"
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        client.subscribe(f"{name}-in", f"public/default/{name}").close()  # the function's subscription, first
        producer = client.create_producer(f"{name}-in", batching_enabled=False, block_if_queue_full=True)
        for _ in range(messages):
            producer.send_async(b"x", None)
        producer.flush()
    finally:
        client.close()
    with WorkerServer(
        broker.service_url,
        metrics_url=broker.metrics_url,
        runtime="process",
        instance_users=InstanceUsers(InstanceUser.resolve(user)),
    ) as server:
        admin = FunctionsAdmin(server.url)
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "inputs": [f"{name}-in"],
                "className": "pulsar_autoscale.functions.examples.noop.noop",
                "receiverQueueSize": 1000,
            }
        )
        fqfn = f"public/default/{name}"

        def figures():
            _, figs, _ = server.worker.instance_figures(fqfn)
            return figs.get(0)

        done = wait_for(
            lambda: (lambda f: f if f is not None and f.processed >= messages else None)(figures()),
            600,
            f"{user}: {messages} messages processed",
        )
        admin.delete("public", "default", name)
    span_s = (done.last_invocation_ms - done.first_processed_ms) / 1000
    return {
        "messages": done.processed,
        "span_s": round(span_s, 3),
        "msgs_per_s": round((done.processed - 1) / span_s, 1) if span_s > 0 else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rate", type=float, default=100.0, help="msg/s during the scale-outs")
    ap.add_argument("--service-ms", type=float, default=5.0)
    ap.add_argument("--messages", type=int, default=20000, help="queued for each throughput run")
    ap.add_argument("--tp-repeats", type=int, default=3, help="throughput runs per mode")
    ap.add_argument("--warm-pool", type=int, default=0, help="also measure scale-outs with this many standbys")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the isolated mode switches user code to nobody")
    started = time.perf_counter()
    result: dict = {
        "bench": "isolation_cost",
        "runtime": "process",
        "rate_msgs_per_s": args.rate,
        "service_ms": args.service_ms,
        "repeats": args.repeats,
        "load_avg_before": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    with EmbeddedBroker() as broker:
        for pool in sorted({0, args.warm_pool}):
            modes = [Mode(broker, user, args.rate, args.service_ms, pool) for user in USERS]
            try:
                for _ in range(args.repeats):
                    for mode in modes:  # alternating: load drift hits both modes alike
                        mode.scale_out_once()
            finally:
                for mode in modes:
                    mode.close()
            result[f"scale_out_pool_{pool}"] = {mode.user: mode.report() for mode in modes}
        runs: dict[str, list[dict]] = {user: [] for user in USERS}
        for _ in range(args.tp_repeats):
            for user in USERS:  # alternating, as above
                runs[user].append(throughput(broker, user, args.messages))
        result["throughput_one_instance"] = {
            user: {"median_msgs_per_s": statistics.median(r["msgs_per_s"] for r in rs), "runs": rs} for user, rs in runs.items()
        }
    result["load_avg_after"] = os.getloadavg()
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
