"""kill -9 of a worker that runs instances of a keyedState function spread over a 3-worker cluster: how long
until their key groups serve again on a survivor, which restores them from the changelog (BENCHMARKS.md, section 8).

A keyed windowed count (functions/examples/windowed_count.py), 128 key groups, parallelism 3 (one
instance per worker, fed by the front on instance 0's worker), `--keys` keys with state of `--state-mb`
in all; the state is loaded through the function (one record per key), then probe records flow at
`--rate`/s and the worker of instance `--kill` (0: the front's, else another) is killed with -9.
Reported: the time from the kill until the instance runs on a survivor, and until the first output of
a record sent after the kill whose key group that instance owns (restored), with the changelog size the
survivor had to read. Prints one JSON object.

    .venv/bin/python bench/state_failover.py [--state-mb 50] [--keys 10000] [--kill 1] [--broker both]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from brokers import add_broker_option, per_broker  # noqa: E402

from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from pulsar_autoscale.functions.keyed.cluster import read_assignment  # noqa: E402
from pulsar_autoscale.functions.keyed.protocol import KeyedTopics  # noqa: E402
from pulsar_autoscale.functions.model.keygroups import key_group  # noqa: E402
from tests.support.cluster_harness import WorkerCluster  # noqa: E402
from tests.support.scenario import EXAMPLES, wait_until  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state-mb", type=float, default=50.0)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=20.0, help="probe records/s after the preload")
    ap.add_argument("--kill", type=int, default=1, help="kill the worker of this instance (0: the front's)")
    ap.add_argument("--log", action="store_true", help="add the survivor's log lines about the function")
    add_broker_option(ap)
    args = ap.parse_args()
    print(json.dumps(per_broker(args.broker, lambda broker: measure(args, broker)), indent=1))


def measure(args, broker) -> dict:
    state_bytes = int(args.state_mb * 1e6 / args.keys)
    keys = [f"key-{i}" for i in range(args.keys)]
    out: dict = {
        "keys": args.keys,
        "state_bytes_per_key": state_bytes,
        "workers": 3,
        "parallelism": 3,
        "killed_instance": args.kill,
    }
    with (
        tempfile.TemporaryDirectory(prefix="bench-failover-") as d,
        WorkerCluster(broker.service_url, broker.metrics_url, Path(d)) as cluster,
    ):
        cluster.wait_ready()
        admin = FunctionsAdmin([w.url for w in cluster.live()])
        name = f"fo-{uuid.uuid4().hex[:6]}"
        src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "windowed_count.WindowedCount",
                "inputs": [src],
                "output": dst,
                "parallelism": 3,
                "keyedState": True,
                "subscriptionPosition": "Earliest",
                "userConfig": {"window_s": 3600, "state_bytes": state_bytes},
            },
            str(EXAMPLES / "windowed_count.py"),
        )
        placed = wait_until(lambda: cluster.spread(name, 3), 60, "3 instances on 3 workers")
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        outputs = client.subscribe(dst, "bench", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(src, batching_enabled=True, batching_max_publish_delay_ms=5, block_if_queue_full=True)
        t0 = time.monotonic()
        for k in keys:
            producer.send_async(b"x", None, partition_key=k)
        producer.flush()
        seen = 0
        while seen < args.keys:  # every key's state is written (and its changelog record persisted)
            outputs.acknowledge(outputs.receive(120_000))
            seen += 1
        out["preload_s"] = round(time.monotonic() - t0, 1)
        stop = threading.Event()
        kill_ms: list[float] = []

        def probe():
            i = 0
            while not stop.is_set():
                producer.send_async(b"x", None, partition_key=keys[i % len(keys)], event_timestamp=int(time.time() * 1000))
                i += 1
                time.sleep(1 / args.rate)

        sender = threading.Thread(target=probe, daemon=True)
        sender.start()
        time.sleep(2)
        owners = read_assignment(
            client, KeyedTopics("public", "default", name, admin.get("public", "default", name)["stateId"]).assignment
        )
        victim = cluster.by_id(placed[args.kill])
        lost = {i for i, w in placed.items() if w == victim.worker_id}
        kill_ms.append(time.time() * 1000)
        killed = time.monotonic()
        cluster.kill(victim)
        placed = wait_until(
            lambda: (lambda p: p if all(p.get(i) not in (None, victim.worker_id) for i in lost) else None)(
                cluster.placement(name)
            ),
            300,
            f"instances {lost} on a survivor",
        )
        survivor = placed[args.kill]
        out["instances_running_after_s"] = round(time.monotonic() - killed, 2)
        while True:  # the first output, of a record sent after the kill, from a group the victim owned
            msg = outputs.receive(300_000)
            outputs.acknowledge(msg)
            key = msg.data().decode().split(":", 1)[0]
            if msg.event_timestamp() > kill_ms[0] and owners.owners[key_group(key, owners.num_key_groups)] in lost:
                out["serving_again_after_s"] = round(time.time() - kill_ms[0] / 1000, 2)
                # key:window:count; every key was loaded once, so a count of 1 would be lost state
                out["first_output_after_kill"] = msg.data().decode()
                out["state_restored"] = int(msg.data().decode().rsplit(":", 1)[1]) >= 2
                break
        stop.set()
        sender.join(5)
        out["survivor_is_another_worker"] = survivor != victim.worker_id
        # the survivor's restores (no snapshot on its disk: the whole changelog), from its log
        out["survivor_restores"] = [
            line.split("restored ", 1)[1].strip()
            for line in cluster.by_id(survivor).log_path.read_text().splitlines()
            if " restored " in line
        ]
        if args.log:
            out["survivor_log"] = [
                line[:160] for line in cluster.by_id(survivor).log_path.read_text().splitlines() if name in line or "lead" in line
            ][-20:]
            out["kill_time"] = time.strftime("%H:%M:%S", time.gmtime(kill_ms[0] / 1000))
        client.close()
    return out


if __name__ == "__main__":
    main()
