"""`pulsar-admin functions stop` then `start` of every instance of a keyedState function with state, on a
3-worker cluster: how long until every instance has restored its key groups, and what the restores read.

A keyed windowed count (functions/examples/windowed_count.py), 128 key groups, parallelism `--parallelism`
(default 2), `--keys` keys with state of `--state-mb` in all, loaded through the function (one record per key).
Then every instance is stopped (the bench waits until each worker has closed the instance's store), the
parallelism set to `--to` if given (an operator's parallelism change with everything stopped), every instance
started, and the time from the start until every instance logged its restore (and, with `--to`, until the
groups are where the new parallelism puts them) is reported with each restore's and open's groups, how many
came from a snapshot, and the changelog it replayed (records, MB, seconds), and the groups a surplus instance
released without restoring them. Prints one JSON object.

    .venv/bin/python bench/keyed_stop_start.py [--state-mb 50] [--keys 10000] [--parallelism 2] [--to N]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bench.state_migration import _userconfig, preload_counting_outputs  # noqa: E402
from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from pulsar_autoscale.broker.embedded import EmbeddedBroker  # noqa: E402
from pulsar_autoscale.functions.model.keygroups import KeyGroupAssignment  # noqa: E402
from tests.support.cluster_harness import WorkerCluster  # noqa: E402
from tests.support.scenario import EXAMPLES, keyed_settled, wait_until  # noqa: E402

RESTORED = re.compile(
    r"instance (\d+) restored (\d+) key groups \((\d+) from a snapshot\): (\d+) changelog records, "
    r"([\d.]+) MB in ([\d.]+) s"
)
OPENED = re.compile(
    r"instance (\d+) (opened|pre-copied) (\d+) key groups \((\d+) from a snapshot\): (\d+) changelog "
    r"records, ([\d.]+) MB in ([\d.]+) s"
)
RELEASED_UNRESTORED = re.compile(r"instance (\d+) released (\d+) key groups it never restored")
CLOSED = re.compile(r"instance (\d+) left this worker")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state-mb", type=float, default=50.0)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--service-ms", type=float, default=4.0, help="work per record (sleep)")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--to", type=int, help="the parallelism set while every instance is stopped")
    args = ap.parse_args()
    after = args.to or args.parallelism
    keys = [f"key-{i}" for i in range(args.keys)]
    name = "wc"
    src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
    tmp = Path(tempfile.mkdtemp(prefix="bench-keyed-stop-start-"))
    with (
        EmbeddedBroker(data_dir=str(tmp / "broker"), log_level="warn") as broker,
        WorkerCluster(broker.service_url, broker.metrics_url, tmp, n=3) as cluster,
    ):
        cluster.wait_ready()
        admin = FunctionsAdmin([w.url for w in cluster.live()])

        def running() -> set[int]:
            return {i["instanceId"] for i in admin.status("public", "default", name)["instances"] if i["status"]["running"]}

        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "windowed_count.WindowedCount",
                "inputs": [src],
                "output": dst,
                "parallelism": args.parallelism,
                "keyedState": True,
                "receiverQueueSize": 100,
                "subscriptionPosition": "Earliest",
                "userConfig": _userconfig(args, int(args.state_mb * 1e6 / args.keys)),
            },
            str(EXAMPLES / "windowed_count.py"),
        )
        wait_until(lambda: running() == set(range(args.parallelism)), 90, f"{args.parallelism} instances running")
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        preload_counting_outputs(client, broker.service_url, src, dst, keys)
        client.close()
        mb_on_disk = sum(p.stat().st_size for p in tmp.glob("w*/**/*.sqlite*") if p.is_file()) / 1e6
        logged = {w.worker_id: w.log_path.stat().st_size for w in cluster.live()}

        def since(pattern: re.Pattern) -> list[tuple[str, ...]]:
            return [
                m.groups()
                for w in cluster.live()
                for m in pattern.finditer(w.log_path.read_bytes()[logged[w.worker_id] :].decode())
            ]

        t0 = time.monotonic()
        admin.action("public", "default", name, "stop")
        wait_until(lambda: not running(), 60, "every instance stopped")
        wait_until(lambda: len(since(CLOSED)) >= args.parallelism, 60, "every instance's store closed")
        stopped_s = time.monotonic() - t0
        if args.to:
            admin.set_parallelism("public", "default", name, args.to)
        t1 = time.monotonic()
        admin.action("public", "default", name, "start")
        wait_until(lambda: len(since(RESTORED)) >= min(args.parallelism, after), 300, "every instance restored")
        started_s = time.monotonic() - t1
        owners = KeyGroupAssignment.uniform(128, after).owners
        uniform = {str(i): owners.count(i) for i in sorted(set(owners))}
        keyed = lambda: admin.keyed_state("public", "default", name)  # noqa
        wait_until(
            lambda: keyed_settled(keyed(), uniform), 300, lambda: f"the groups where {after} instances put them: {keyed()}"
        )
        served_s = time.monotonic() - t1

        restores = [
            {
                "instance": int(i),
                "groups": int(g),
                "from_snapshot": int(s),
                "records": int(r),
                "mb": float(mb),
                "seconds": float(sec),
            }
            for i, g, s, r, mb, sec in since(RESTORED)
        ]
        moves = {
            what: [(int(r), float(mb), float(sec)) for _i, w, _g, _s, r, mb, sec in since(OPENED) if w == what]
            for what in ("pre-copied", "opened")
        }
        released = sum(int(n) for _i, n in since(RELEASED_UNRESTORED))
    shutil.rmtree(tmp, ignore_errors=True)
    print(
        json.dumps(
            {
                "state_mb": args.state_mb,
                "keys": args.keys,
                "state_mb_on_disk": round(mb_on_disk, 1),
                "parallelism": args.parallelism,
                "to": after,
                "stop_s": round(stopped_s, 2),
                "start_until_restored_s": round(started_s, 2),
                "start_until_groups_served_s": round(served_s, 2),
                "restores": restores,
                **{
                    what.replace("-", "_"): {
                        "count": len(done),
                        "records": sum(r for r, _, _ in done),
                        "mb": round(sum(mb for _, mb, _ in done), 1),
                        "seconds": round(sum(sec for _, _, sec in done), 2),
                    }
                    for what, done in moves.items()
                },
                "released_unrestored_groups": released,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
