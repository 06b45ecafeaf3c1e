"""keyedState on the thread runtime vs the process runtime, in the same run: what the pipe to the worker's
store costs (functions/runtimes/remote_state.py). A record of a process keyed function crosses the pipe twice: its
receive (which begins its scope) and its incr_counter; the commit and the ack go with the next receive.

A keyed count (functions/examples/keyed_count.py) drains a backlog of `--records` records over `--keys` keys
at parallelism `--parallelism`, on one worker and pulsar-lite; the runtimes alternate for `--rounds` rounds.
Per run: records/s from the first output to the last, and whether every key's count is exact.

    .venv/bin/python bench/keyed_runtime.py [--records 4000] [--keys 100] [--parallelism 2] [--rounds 3]
        [--guarantee EFFECTIVELY_ONCE|ATLEAST_ONCE]

Prints one JSON object: the runs, and per runtime the median records/s; process over thread.
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

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.functions.cli.worker import GIL_SWITCH_INTERVAL_S

EXAMPLES = Path(__file__).resolve().parents[1] / "functions" / "examples"
TIMEOUT_S = 300.0


def _run(admin: FunctionsAdmin, client: pulsar.Client, runtime: str, args) -> dict:
    name = f"kr-{runtime}-{uuid.uuid4().hex[:6]}"
    src, dst = (f"persistent://public/default/{name}-{t}" for t in ("in", "out"))
    # Shared: pulsar-lite delivers an Exclusive subscription's messages twice (B1, docs/dev/pulsar-lite-defects.md)
    outputs = client.subscribe(
        dst, "bench", consumer_type=pulsar.ConsumerType.Shared, initial_position=pulsar.InitialPosition.Earliest
    )
    producer = client.create_producer(src, block_if_queue_full=True)  # else send_async drops beyond 1,000
    for i in range(args.records):
        producer.send_async(b"x", None, partition_key=f"k{i % args.keys}")
    producer.flush()
    admin.create(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "keyed_count.KeyedCount",
            "inputs": [src],
            "output": dst,
            "parallelism": args.parallelism,
            "keyedState": True,
            "instanceRuntime": runtime,
            "processingGuarantees": args.guarantee,
            "subscriptionPosition": "Earliest",
        },
        str(EXAMPLES / "keyed_count.py"),
    )
    first = last = None
    seen: set[bytes] = set()  # "key:count:instance": one per record counted (a redelivered output is seen once)
    deadline = time.monotonic() + TIMEOUT_S
    while len(seen) < args.records and time.monotonic() < deadline:
        try:
            msg = outputs.receive(timeout_millis=1000)
        except pulsar.Timeout:
            continue
        outputs.acknowledge(msg)
        last = time.monotonic()
        first = first or last
        seen.add(msg.data().rsplit(b":", 1)[0])
    received = len(seen)
    counts = [admin.get_state("public", "default", name, f"k{k}").get("numberValue", 0) for k in range(args.keys)]
    admin.delete("public", "default", name)
    outputs.close()
    producer.close()
    span = (last - first) if first and last and last > first else None
    return {
        "runtime": runtime,
        "outputs": received,
        "records_per_s": round((received - 1) / span, 1) if span else None,
        "exact": counts == [args.records // args.keys] * args.keys,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=4000)
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--guarantee", default="EFFECTIVELY_ONCE", choices=["EFFECTIVELY_ONCE", "ATLEAST_ONCE"])
    args = p.parse_args()
    if args.records % args.keys:
        p.error("--records must be a multiple of --keys (exact counts per key)")
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)  # as `pulsar-autoscale worker` runs: the worker is in this process
    runs = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedBroker(data_dir=f"{tmp}/broker") as broker,
        WorkerServer(broker.service_url, data_dir=f"{tmp}/worker", metrics_url=broker.metrics_url) as worker,
    ):
        admin = FunctionsAdmin(worker.url, timeout_s=60)
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            for r in range(args.rounds):
                for runtime in ("thread", "process") if r % 2 == 0 else ("process", "thread"):
                    runs.append({"round": r, **_run(admin, client, runtime, args)})
                    print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
        finally:
            client.close()
    median = {
        rt: statistics.median(x["records_per_s"] for x in runs if x["runtime"] == rt and x["records_per_s"])
        for rt in ("thread", "process")
    }
    print(
        json.dumps(
            {
                "args": vars(args),
                "runs": runs,
                "median_records_per_s": median,
                "process_over_thread": round(median["process"] / median["thread"], 3),
                "all_exact": all(x["exact"] for x in runs),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
