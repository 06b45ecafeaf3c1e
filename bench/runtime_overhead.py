"""Messages/s through a no-op function at parallelism 1 against a raw pulsar-client
consume-produce-ack loop, both draining the same size of backlog on the same broker in the same run.

    .venv/bin/python bench/runtime_overhead.py [--messages 20000] [--size 1024] [--repeats 3] [--broker both]

Prints one JSON object; `ratio` = function / raw (target >= 0.7); with `--broker both`, one per broker.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid

import pulsar
from brokers import add_broker_option, per_broker

from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.functions.model.config import FunctionConfig


def fill(client, topic: str, n: int, size: int) -> None:
    producer = client.create_producer(topic, batching_enabled=True, block_if_queue_full=True)
    payload = b"x" * size
    for _ in range(n):
        producer.send_async(payload, None)
    producer.flush()
    producer.close()


def raw_loop(client, n: int, size: int) -> float:
    src, dst = f"raw-{uuid.uuid4().hex[:6]}-in", f"raw-{uuid.uuid4().hex[:6]}-out"
    consumer = client.subscribe(
        src, "raw", consumer_type=pulsar.ConsumerType.Shared, initial_position=pulsar.InitialPosition.Earliest
    )
    fill(client, src, n, size)
    producer = client.create_producer(dst, batching_enabled=True, batching_max_publish_delay_ms=1, block_if_queue_full=True)
    done = threading.Semaphore(0)

    def acked(msg):
        def cb(res, _mid):
            consumer.acknowledge(msg)
            done.release()

        return cb

    start = time.perf_counter()
    for _ in range(n):
        msg = consumer.receive()
        producer.send_async(msg.data(), acked(msg))
    for _ in range(n):
        done.acquire()
    elapsed = time.perf_counter() - start
    producer.close()
    consumer.close()
    return n / elapsed


def function_run(client, worker: WorkerServer, n: int, size: int) -> float:
    name = f"noop-{uuid.uuid4().hex[:6]}"
    fqfn = f"public/default/{name}"
    # Same backlog drain as the raw loop: create the function's subscription, fill it, then start the function.
    client.subscribe(f"{name}-in", fqfn, consumer_type=pulsar.ConsumerType.Shared).close()
    fill(client, f"{name}-in", n, size)
    worker.worker.create(
        FunctionConfig.from_dict(
            {
                "name": name,
                "className": "pulsar_autoscale.functions.examples.noop.noop",
                "inputs": [f"{name}-in"],
                "output": f"{name}-out",
                "receiverQueueSize": 1000,
            }
        )
    )
    start = time.perf_counter()
    while worker.worker.counters(fqfn).outputs < n:
        time.sleep(0.01)  # polling the worker costs GIL time the function needs; 10 ms is <1% of a run
    elapsed = time.perf_counter() - start
    worker.worker.delete(fqfn)
    return n / elapsed


def measure(broker, args) -> dict:
    with WorkerServer(broker.service_url, metrics_url=broker.metrics_url) as worker:
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        raw, fn = [], []
        for _ in range(args.repeats):
            raw.append(raw_loop(client, args.messages, args.size))
            fn.append(function_run(client, worker, args.messages, args.size))
        client.close()
    result = {
        "raw_msgs_per_s": round(statistics.median(raw)),
        "function_msgs_per_s": round(statistics.median(fn)),
        "raw_runs": [round(x) for x in raw],
        "function_runs": [round(x) for x in fn],
    }
    result["ratio"] = round(result["function_msgs_per_s"] / result["raw_msgs_per_s"], 3)
    result["target_met"] = result["ratio"] >= 0.7
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    add_broker_option(ap)
    args = ap.parse_args()
    result = {
        "bench": "runtime_overhead",
        "messages": args.messages,
        "size": args.size,
        **per_broker(args.broker, lambda broker: measure(broker, args)),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
