"""Process-runtime scale-out latency with and without the warm pool (BENCHMARKS.md, section 2).

For each mode (no pool, pool of 4 standbys per function) and each repetition: a Sleepy function
(--service-ms, default 5 ms, deterministic) on the process runtime under a steady --rate (default
200 msg/s) load, parallelism 1 -> 4,
then 4 -> 8; latency of each new instance = the time its first message was processed minus the
moment the PUT returned (so it includes one 5 ms service; a warm instance can beat the PUT's
answer, hence negative values), and `from_put_sent` the same from when the PUT was sent. Between repetitions the function goes
back to 1 and the pool refills. Embedded broker, one worker. Prints one JSON object.

At the defaults 8 instances share 200 msg/s at 12.5% utilization: a new instance waits for its turn
among idle ones (about 8 x 5 ms), so its first message measures the arrival process as much as the
start. `--service-ms 25` makes 4 instances too few for 200 msg/s (a backlog, the reason for a
scale-out): the first message then measures the start plus one 25 ms service.

`--keyed`: the function is keyedState (records keyed over 1,000 keys), so a new instance's first message also
waits for its first key groups to move to it (the first subscale's release and open). Each step starts once
the previous change's groups have all moved (a change made during a migration waits for it to end).
Usage: python bench/scale_latency.py [--repeats 3] [--pool 4] [--rate 200] [--service-ms 5] [--keyed]
       [--broker lite|apache|both]
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
from brokers import add_broker_option, per_broker

from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from pulsar_autoscale.functions.api.server import WorkerServer  # noqa: E402
from tests.support.scenario import wait_until  # noqa: E402

STEPS = ((1, 4), (4, 8))


def load(service_url: str, topic: str, rate: float, stop: threading.Event, keyed: bool) -> None:
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    next_t = time.monotonic()
    n = 0
    while not stop.is_set():
        n += 1
        producer.send_async(b"x", None, **({"partition_key": f"k{n % 1000}"} if keyed else {}))
        next_t += 1.0 / rate
        time.sleep(max(0.0, next_t - time.monotonic()))
    producer.flush()
    client.close()


# the suite's bounded wait, polled at 0.01 s: a new instance's first message is what these runs time
wait_for = functools.partial(wait_until, interval_s=0.01)


def run_mode(broker, pool: int, repeats: int, rate: float, service_ms: float, keyed: bool) -> dict:
    out: dict = {f"{a}->{b}": [] for a, b in STEPS}
    sent_out: dict = {f"{a}->{b}": [] for a, b in STEPS}
    with WorkerServer(broker.service_url, metrics_url=broker.metrics_url, runtime="process", warm_pool=pool) as server:
        admin = FunctionsAdmin(server.url)
        name = f"lat-{uuid.uuid4().hex[:6]}"
        fqfn = f"public/default/{name}"
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "inputs": [f"{name}-in"],
                "output": f"{name}-out",
                "className": "pulsar_autoscale.functions.examples.sleepy.Sleepy",
                "receiverQueueSize": 10,
                "userConfig": {"service_ms": service_ms, "dist": "deterministic"},
                "keyedState": keyed,
            }
        )
        stop = threading.Event()
        producer = threading.Thread(target=load, args=(broker.service_url, f"{name}-in", rate, stop, keyed), daemon=True)
        producer.start()
        worker = server.worker

        def first_processed() -> dict[int, int]:
            _, figs, _ = worker.instance_figures(fqfn)
            return {i: f.first_processed_ms for i, f in figs.items()}

        def pool_ready() -> bool:
            fn = worker._functions[fqfn]
            return fn.warm_pool is None or sum(s.ready() for s in list(fn.warm_pool._standbys)) >= pool

        def migrating() -> bool:
            return bool(admin.keyed_state("public", "default", name).get("migrating"))

        try:
            wait_for(lambda: first_processed().get(0), 60, "instance 0 to process")
            for _ in range(repeats):
                for a, b in STEPS:
                    wait_for(pool_ready, 60, "the warm pool to refill")
                    # a new instance gets its first groups after the migration under way ends: not the start's cost
                    wait_for(lambda: not migrating(), 120, "the previous change's key groups to move")
                    sent_ms = time.time() * 1000
                    admin.set_parallelism("public", "default", name, b)
                    returned_ms = time.time() * 1000
                    new = range(a, b)
                    firsts = wait_for(
                        lambda: (lambda f: f if all(f.get(i) for i in new) else None)(first_processed()),
                        60,
                        f"instances {a}..{b - 1} to process",
                    )
                    out[f"{a}->{b}"] += [round(firsts[i] - returned_ms, 1) for i in new]
                    sent_out[f"{a}->{b}"] += [round(firsts[i] - sent_ms, 1) for i in new]
                admin.set_parallelism("public", "default", name, 1)
                wait_for(lambda: len(first_processed()) == 1, 60, "the scale-in to 1")
        finally:
            stop.set()
            producer.join(5)
            admin.delete("public", "default", name)
    return {
        step: {
            "median_ms": statistics.median(v),
            "max_ms": max(v),
            "samples_ms": v,
            "from_put_sent": {"median_ms": statistics.median(sent_out[step]), "max_ms": max(sent_out[step])},
        }
        for step, v in out.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pool", type=int, default=4)
    ap.add_argument("--rate", type=float, default=200.0, help="msg/s")
    ap.add_argument("--service-ms", type=float, default=5.0)
    ap.add_argument("--no-cold", action="store_true", help="only the pooled mode")
    ap.add_argument("--keyed", action="store_true", help="a keyedState function")
    add_broker_option(ap)
    args = ap.parse_args()
    started = time.perf_counter()
    result = {
        "bench": "scale_latency",
        "runtime": "process",
        "rate_msgs_per_s": args.rate,
        "service_ms": args.service_ms,
        "repeats": args.repeats,
        "keyed": args.keyed,
        "load_avg_before": os.getloadavg(),
    }

    def measure(broker) -> dict:
        modes = {} if args.no_cold else {"no_pool": run_mode(broker, 0, args.repeats, args.rate, args.service_ms, args.keyed)}
        pooled = modes[f"pool_{args.pool}"] = run_mode(broker, args.pool, args.repeats, args.rate, args.service_ms, args.keyed)
        return {**modes, "target_met": all(v["max_ms"] <= 100 for v in pooled.values())}

    result.update(per_broker(args.broker, measure))
    result["load_avg_after"] = os.getloadavg()
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
