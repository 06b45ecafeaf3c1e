"""Live migration of key groups vs stop-migrate-restart, on the same keyed workload in the same run (BENCHMARKS.md, section 9).

A keyed windowed count (functions/examples/windowed_count.py, keyedState) over 128 key groups and
10,000 keys, each key's state padded to state_mb / keys bytes, fed at 70% of the measured capacity of
2 instances. For each mode (live: subscales of 4 groups; stop-the-world: every group pauses, all moves
as one batch, then all resume, while the instances keep running; restart, on a cluster: every instance stops,
the parallelism changes, every instance starts, which is what stock Pulsar does on a parallelism change) the
function scales 2 -> 3 and 3 -> 2. Per change: peak and mean
end-to-end latency of the records sent during it (from its PUT until 1 s after it finished), its
duration, and the p99 of keys whose group does not move, during the change vs the steady period before
(the issue's target) and vs the steady period after (at the new parallelism: after a scale-in the unaffected
keys' instances carry more load, so their steady p99 is higher whatever the migration does).

    .venv/bin/python bench/state_migration.py [--state-mb 50] [--keys 10000] [--service-ms 4] [--workers 3]
        [--changelog-shards 1] [--cycles 4] [--modes live,restart] [--arrivals FILE [--route-times]]
        [--no-relay] [--broker-dir DIR] [--broker lite|apache] [--rescore FILE]

A latency is from the record's send to its output's receipt, both taken to the microsecond by the load process
(the output carries its record's event time in whole ms only, and 1 ms is 5-7% of the unaffected keys' p99).

`--cycles N` repeats 2 -> 3 -> 2 N times per mode and also gives the unaffected keys' p99 over the records of
all N changes of a kind together (`unaffected_p99_pooled`, with a bootstrap 90% interval): a single 3 -> 2
at 50 MB lasts 1-2 s, so its p99 rests on the slowest few of a few hundred records.

Prints one JSON object. `--workers 1` (the default): one worker with thread instances, each key group its
own file on the worker's disk, so a move copies nothing. `--workers 3`: a 3-worker cluster (worker
processes, tests/support/cluster_harness.py); the instances are spread over the workers, so every moving group's
state crosses workers through the changelog. The mode is the function's customRuntimeOptions.keyedMigration
(an update between the modes restarts the instances; the next change waits for the backlog to drain).
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "functions" / "examples"
CHANGE_TAIL_S = 1.0
# How often the cluster bench asks a worker's REST API whether a change is done: each status call gathers every
# worker's view (CPU and GIL time on the workers under test), which at 20 calls/s raised the unaffected keys'
# p50 by 2-3 ms during changes, an effect of the measurement, not of the migration. The steady period before a
# change is polled as often, so both sides of the comparison carry the same cost.
STATUS_POLL_S = 0.5
DRAIN_S = 300.0
MODES = ("live", "stop-the-world", "restart")


def _load(
    service_url: str, src: str, dst: str, keys: list[str], rate: float, stop, started, sent, received, out_path: str
) -> None:
    """Child process: send keyed records at `rate`/s until `stop`, collect the outputs' latencies."""
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    consumer = client.subscribe(dst, f"bench-{uuid.uuid4().hex[:6]}", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(src, batching_enabled=True, batching_max_publish_delay_ms=2, block_if_queue_full=True)
    arrivals: list[tuple[float, float, str]] = []
    # an output carries its record's event time in whole ms: the exact send time by (key, event ms), in send order
    # (a key's outputs come in its order), so that a latency is not off by up to 1 ms of a 15-20 ms p99
    sent_at: dict[tuple[str, int], collections.deque] = collections.defaultdict(collections.deque)
    done = threading.Event()

    def collect():
        while not done.is_set():
            try:
                msg = consumer.receive(200)
            except pulsar.Timeout:
                continue
            received_ms, event_ms, key = time.time() * 1000, msg.event_timestamp(), msg.partition_key()
            sent_ms = sent_at.get((key, event_ms))
            arrivals.append((round(received_ms, 3), round(sent_ms.popleft() if sent_ms else event_ms, 3), key))
            consumer.acknowledge(msg)
            received.value = len(arrivals)

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    started.set()
    rnd = random.Random(7)
    t0 = time.monotonic()
    i = 0
    while not stop.is_set():
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        key, now_ms = rnd.choice(keys), time.time() * 1000
        sent_at[(key, int(now_ms))].append(now_ms)
        producer.send_async(b"x", None, partition_key=key, event_timestamp=int(now_ms))
        i += 1
        if i % 50 == 0:
            sent.value = i
    producer.flush()
    sent.value = i
    deadline = time.monotonic() + DRAIN_S  # the outputs of the backlog a change left, bounded
    while len(arrivals) < i and time.monotonic() < deadline:
        time.sleep(0.1)
    done.set()
    collector.join(5)
    Path(out_path).write_text(json.dumps({"sent": i, "arrivals": arrivals}))
    client.close()


def _wait(predicate, timeout_s: float, what: str, every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(every_s)


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


def _pooled_p99(cycles: list[tuple[list[float], list[float], list[float]]], resamples: int = 2000) -> dict:
    """The unaffected keys' p99 during every change of a kind, and in the steady periods after them, over their p99
    in the steady periods before, each taken over the records of all cycles together, with bootstrap 90% intervals.
    After a scale-in the unaffected keys' instances carry more load: after/before is what the new parallelism
    itself costs them, whatever the migration does."""
    import numpy as np

    rng = np.random.default_rng(13)
    before, during, after = (np.array([lat for c in cycles for lat in c[i]], dtype=float) for i in range(3))

    def p99s(values):
        return np.percentile(rng.choice(values, (resamples, values.size)), 99, axis=1)

    samples = {"before": before, "during": during, "after": after}
    p99 = {name: float(np.percentile(values, 99)) for name, values in samples.items()}
    boot = {name: p99s(values) for name, values in samples.items()}
    out = {"records_before": int(before.size), "p99_before_ms": round(p99["before"], 1)}
    for name in ("during", "after"):
        out.update(
            {
                f"records_{name}": int(samples[name].size),
                f"p99_{name}_ms": round(p99[name], 1),
                f"{name}_over_before": round(p99[name] / p99["before"], 3),
                f"{name}_over_before_90pct_interval": [
                    round(float(q), 3) for q in np.percentile(boot[name] / boot["before"], [5, 95])
                ],
            }
        )
    # what the migration itself costs them: the level to compare with is the higher of the two parallelisms'
    out["during_over_higher_of_before_and_after"] = round(p99["during"] / max(p99["before"], p99["after"]), 3)
    out["during_over_higher_of_before_and_after_90pct_interval"] = [
        round(float(q), 3) for q in np.percentile(boot["during"] / np.maximum(boot["before"], boot["after"]), [5, 95])
    ]
    return out


class RouteTimes:
    """Readers of a keyed function's route topics (a cluster's front forwards each record to its instance's):
    (sent ms, forwarded ms, key, instance) of every record forwarded while they run."""

    def __init__(self, client, topics: list[str]):
        import pulsar

        self.rows: list[tuple[int, int, str, int]] = []
        self._readers = [client.create_reader(t, pulsar.MessageId.latest) for t in topics]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read, args=(r, i), daemon=True) for i, r in enumerate(self._readers)]
        for t in self._threads:
            t.start()

    def _read(self, reader, instance_id: int) -> None:
        import pulsar

        while not self._stop.is_set():
            try:
                msg = reader.read_next(200)
            except pulsar.Timeout:
                continue
            self.rows.append((msg.event_timestamp(), msg.publish_timestamp(), msg.partition_key(), instance_id))

    def close(self) -> list[tuple[int, int, str, int]]:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for r in self._readers:
            r.close()
        return self.rows


class Load:
    """The load child process (_load), fed at `rate`/s; `caught_up` waits until its backlog is processed."""

    def __init__(self, service_url: str, src: str, dst: str, keys: list[str], rate: float, tmp: str):
        ctx = mp.get_context("spawn")
        self.stop, started = ctx.Event(), ctx.Event()
        self.sent, self.received = ctx.Value("q", 0), ctx.Value("q", 0)
        os.makedirs(tmp, exist_ok=True)
        self.result_path = os.path.join(tmp, "arrivals.json")
        self.proc = ctx.Process(
            target=_load, args=(service_url, src, dst, keys, rate, self.stop, started, self.sent, self.received, self.result_path)
        )
        self.proc.start()
        if not started.wait(60):
            raise SystemExit("the load process did not start within 60 s")

    def caught_up(self, timeout_s: float = 300, settled_s: float = 0.25) -> None:
        """Every record sent until now has its output (one output per record), and the last wait for that took
        under `settled_s`: the records sent while a long backlog drains are a backlog of their own, and a steady
        period that started on it would compare a change with its predecessor's tail (seen after restarts of
        500 MB: 3.6 s p99 in the first half of the "steady" period, 21 ms in the second; 0.9 s with 1 s here)."""
        deadline = time.monotonic() + timeout_s
        while True:
            start, backlog_end = time.monotonic(), self.sent.value
            _wait(lambda: self.received.value >= backlog_end, deadline - start, "the backlog to drain")
            if time.monotonic() - start < settled_s:
                return

    def finish(self) -> dict:
        self.stop.set()
        self.proc.join(DRAIN_S + 60)
        return json.loads(Path(self.result_path).read_text())


def _preload(service_url: str, src: str, keys: list[str], processed, timeout_s: float = 600) -> float:
    """One record per key (the state's full size), as fast as 2 instances go: returns their capacity (records/s)."""
    import pulsar

    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(src, batching_enabled=True, batching_max_publish_delay_ms=5, block_if_queue_full=True)
    t0 = time.monotonic()
    for k in keys:
        producer.send_async(b"x", None, partition_key=k, event_timestamp=int(time.time() * 1000))
    producer.flush()
    _wait(lambda: processed() >= len(keys), timeout_s, "the preload")
    capacity = len(keys) / (time.monotonic() - t0)
    producer.close()
    client.close()
    return capacity


def preload_counting_outputs(client, service_url: str, src: str, dst: str, keys: list[str]) -> float:
    """_preload a function (on a cluster, whose instances' counters are spread) by counting its outputs on `dst`."""
    import pulsar

    outputs = client.subscribe(dst, "preload", consumer_type=pulsar.ConsumerType.Shared)
    seen = [0]

    def processed() -> int:
        while True:
            try:
                outputs.acknowledge(outputs.receive(100))
            except pulsar.Timeout:
                return seen[0]
            seen[0] += 1

    capacity = _preload(service_url, src, keys, processed)
    outputs.unsubscribe()
    return capacity


def _userconfig(args, state_bytes: int) -> dict:
    return {"window_s": 10, "state_bytes": state_bytes, "service_ms": args.service_ms}


def _one_worker(args, keys: list[str], state_bytes: int, tmp: str, out: dict) -> tuple[list[dict], dict, dict]:
    """One worker in this process, thread instances: (changes, restores, the load's result)."""
    from pulsar_autoscale.broker.embedded import EmbeddedBroker
    from pulsar_autoscale.functions.model.config import FunctionConfig
    from pulsar_autoscale.functions.model.keygroups import moves
    from pulsar_autoscale.functions.model.migration_settings import KeyedMigration
    from pulsar_autoscale.functions.worker.worker import Worker

    out["worker"] = "one process, thread instances"
    with EmbeddedBroker(data_dir=_broker_dir(args, tmp), log_level="warn") as broker:
        worker = Worker(broker.service_url, os.path.join(tmp, "worker"), broker_kind="pulsar-lite")
        name = f"wc-{uuid.uuid4().hex[:6]}"
        src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
        cfg = worker.create(
            FunctionConfig.from_dict(
                {
                    "tenant": "public",
                    "namespace": "default",
                    "name": name,
                    "className": "windowed_count.WindowedCount",
                    "inputs": [src],
                    "output": dst,
                    "parallelism": 2,
                    "keyedState": True,
                    "numKeyGroups": args.groups,
                    "receiverQueueSize": 100,
                    "userConfig": _userconfig(args, state_bytes),
                    **_shards(args),
                }
            ),
            (EXAMPLES / "windowed_count.py").read_bytes(),
            "windowed_count.py",
        )
        fn = worker._functions[cfg.fqfn]
        live = KeyedMigration(args.subscale, args.duty, pre_copy_mb_per_s=args.pre_copy_mbps)
        _wait(lambda: fn.keyed.router.attached() == {0, 1}, 60, "2 instances")
        capacity = _preload(broker.service_url, src, keys, lambda: worker.counters(cfg.fqfn).processed or 0)
        state_files = [p for p in (worker._fn_dir(cfg) / "keyed-state").rglob("*.sqlite*") if p.is_file()]
        out["state_mb_on_disk"] = round(sum(p.stat().st_size for p in state_files) / 1e6, 1)
        out["capacity_2_instances_per_s"] = round(capacity, 1)
        load = Load(broker.service_url, src, dst, keys, args.load * capacity, tmp)
        changes = []
        for mode in args.modes:
            how = replace(live, stop_the_world=mode == "stop-the-world")
            fn.keyed.settings = lambda how=how: how
            for target in (3, 2) * args.cycles:
                load.caught_up()  # the previous change's backlog is gone, then the steady period compared with
                time.sleep(args.steady_s)
                before = fn.keyed.router.assignment
                t_put = time.time() * 1000
                worker.update(cfg.fqfn, {"parallelism": target})
                if not fn.keyed.idle(300):
                    raise SystemExit(f"{mode} change to {target} did not finish: {fn.keyed.failure}")
                report = fn.keyed.reports[-1]
                changes.append(
                    {
                        "mode": mode,
                        "change": f"{len(set(before.owners))}->{target}",
                        "t_put": t_put,
                        "t_done": time.time() * 1000,
                        "moved_groups": report.moved_groups,
                        "subscales": report.subscales,
                        "duration_s": round(report.duration_s, 3),
                        "put_down_s": round(report.put_down_s, 3),
                        "release_s": round(report.release_s, 3),
                        "open_s": round(report.open_s, 3),
                        "moving": sorted({m.group for m in moves(before, fn.keyed.router.assignment)}),
                    }
                )
        time.sleep(args.steady_s)
        data = load.finish()
        moved = [r for r in fn.keyed.stores.restores if r.groups]
        worker.close()
    restores = {
        "opens": len(moved),
        "groups": sum(r.groups for r in moved),
        "from_snapshot": sum(r.from_snapshot for r in moved),
        "mb": round(sum(r.bytes for r in moved) / 1e6, 2),
        "seconds": round(sum(r.seconds for r in moved), 3),
    }
    return changes, restores, data


def _broker_dir(args, tmp: str) -> str:
    """Named after the run's temporary directory, which is unique, wherever --broker-dir puts it."""
    return os.path.join(args.broker_dir or tmp, os.path.basename(tmp) + "-broker")


def _cluster(args, keys: list[str], state_bytes: int, tmp: str, out: dict) -> tuple[list[dict], dict, dict]:
    """`args.workers` worker processes, the function's instances spread over them: (changes, restore log, load).
    Each mode runs on a function of its own, created for it (fresh topics, no group file on any disk), fed at
    the same rate: the one measured on the first."""
    import pulsar

    from pulsar_autoscale.admin.client import FunctionsAdmin
    from pulsar_autoscale.broker.embedded import EmbeddedBroker
    from pulsar_autoscale.functions.keyed.cluster import read_assignment
    from pulsar_autoscale.functions.keyed.protocol import KeyedTopics
    from pulsar_autoscale.functions.model.keygroups import moves

    sys.path.insert(0, str(ROOT))
    from tests.support.cluster_harness import WorkerCluster

    out["worker"] = f"{args.workers} worker processes (a cluster), thread instances spread over them"
    out["relay"] = not args.no_relay
    changes: list[dict] = []
    data: dict = {"sent": 0, "arrivals": []}
    lines: list[str] = []
    if args.broker == "apache":
        from bench.brokers import open_broker

        opened = open_broker("apache")
        out["relay"] = False
    else:
        opened = EmbeddedBroker(data_dir=_broker_dir(args, tmp), log_level="warn", relay=not args.no_relay)
    out["broker"] = args.broker
    with opened as broker, WorkerCluster(broker.service_url, broker.metrics_url, Path(tmp), n=args.workers) as cluster:
        admin = FunctionsAdmin([w.url for w in cluster.live()])
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        for mode in args.modes:
            name = f"wc-{uuid.uuid4().hex[:6]}"
            src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"

            def keyed_view() -> dict:
                return admin.keyed_state("public", "default", name)

            def running() -> set[int]:
                return {i["instanceId"] for i in admin.status("public", "default", name)["instances"] if i["status"]["running"]}

            migration = {
                "subscaleSize": args.subscale,
                "duty": args.duty,
                "mode": "stop-the-world" if mode == "restart" else mode,
                "preCopyMBps": args.pre_copy_mbps,
            }
            admin.create(
                {
                    "tenant": "public",
                    "namespace": "default",
                    "name": name,
                    "className": "windowed_count.WindowedCount",
                    "inputs": [src],
                    "output": dst,
                    "parallelism": 2,
                    "keyedState": True,
                    "numKeyGroups": args.groups,
                    "receiverQueueSize": 100,
                    "subscriptionPosition": "Earliest",
                    "customRuntimeOptions": json.dumps({"keyedMigration": migration}),
                    "userConfig": _userconfig(args, state_bytes),
                    **_shards(args),
                },
                str(EXAMPLES / "windowed_count.py"),
            )
            _wait(lambda: cluster.spread(name, 2), 90, "2 instances on 2 workers")
            capacity = preload_counting_outputs(client, broker.service_url, src, dst, keys)
            out.setdefault("capacity_2_instances_per_s", round(capacity, 1))
            out.setdefault("capacity_by_mode", {})[mode] = round(capacity, 1)
            if mode == "live":
                out["state_mb_on_disk"] = round(
                    sum(p.stat().st_size for p in Path(tmp).glob("w*/**/*.sqlite*") if p.is_file()) / 1e6, 1
                )
            load = Load(
                broker.service_url, src, dst, keys, args.load * out["capacity_2_instances_per_s"], os.path.join(tmp, name)
            )
            topics = KeyedTopics("public", "default", name, admin.get("public", "default", name)["stateId"])
            routed = RouteTimes(client, [topics.route(i) for i in range(3)]) if args.route_times else None
            for target in (3, 2) * args.cycles:
                load.caught_up()  # the previous change's backlog is gone, then the steady period compared with,
                # polled like the change: a status call fans out to every worker, which costs the records in flight
                steady_end = time.monotonic() + args.steady_s
                while time.monotonic() < steady_end:
                    keyed_view()
                    time.sleep(min(STATUS_POLL_S, max(0.0, steady_end - time.monotonic())))
                before = read_assignment(client, topics.assignment)
                last = keyed_view().get("lastMigration")
                t_put = time.time() * 1000
                if mode == "restart":  # stock Pulsar's parallelism change: every instance stops, then all start
                    admin.action("public", "default", name, "stop")
                    _wait(lambda: not running(), 60, "every instance stopped", STATUS_POLL_S / 10)
                admin.set_parallelism("public", "default", name, target)
                if mode == "restart":
                    admin.action("public", "default", name, "start")
                _wait(
                    lambda: (
                        (
                            lambda v: (
                                not v.get("migrating")
                                and v.get("lastMigration") not in (None, last)
                                and len(v.get("groupsPerInstance", {})) == target
                            )
                        )(keyed_view())
                        and running() == set(range(target))
                    ),
                    600,
                    f"the {mode} change to {target} instances",
                    STATUS_POLL_S,
                )
                t_done = time.time() * 1000
                report = keyed_view()["lastMigration"]
                after = read_assignment(client, topics.assignment)
                changes.append(
                    {
                        "mode": mode,
                        "change": f"{before.parallelism}->{target}",
                        "t_put": t_put,
                        "t_done": t_done,
                        "moved_groups": report["movedGroups"],
                        "subscales": report["subscales"],
                        "duration_s": report["seconds"],
                        "pre_copy_s": report.get("preCopySeconds"),
                        "pre_copy_rounds": report.get("preCopyRounds"),
                        "placement": cluster.placement(name),
                        "moving": sorted({m.group for m in moves(before, after)}),
                    }
                )
            time.sleep(args.steady_s)
            result = load.finish()
            data["sent"] += result["sent"]
            data["arrivals"] += result["arrivals"]
            if routed is not None:
                data.setdefault("routed", []).extend(routed.close())
            admin.delete("public", "default", name)
            lines += [
                f"{mode}: {line.split(': ', 2)[-1][:200]}"
                for w in cluster.workers
                for line in w.log_path.read_text().splitlines()
                if name in line and any(f" {verb} " in line for verb in ("restored", "pre-copied", "opened"))
            ]
        client.close()
    restores = {
        "pre-copies": sum(" pre-copied " in line for line in lines),
        "opens": sum(" opened " in line for line in lines),
        "log": lines[-80:],
    }
    return changes, restores, data


def _shards(args) -> dict:
    """The function's changelogShards when given (else the worker's default for a keyedState function)."""
    return {"changelogShards": args.changelog_shards} if args.changelog_shards else {}


def main() -> None:
    from pulsar_autoscale.functions.model.migration_settings import KeyedMigration

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state-mb", type=float, default=50.0)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--groups", type=int, default=128)
    ap.add_argument("--service-ms", type=float, default=4.0, help="work per record (sleep): sets the capacity")
    ap.add_argument("--load", type=float, default=0.7, help="share of the 2-instance capacity to feed")
    ap.add_argument("--subscale", type=int, default=4)
    ap.add_argument("--duty", type=float, default=0.5, help="share of the time migration work may take")
    ap.add_argument(
        "--pre-copy-mbps",
        type=float,
        default=KeyedMigration.pre_copy_mb_per_s,
        help="how fast the pre-copy may read the changelog (MB/s; the function's default when not given)",
    )
    ap.add_argument(
        "--changelog-shards", type=int, help="the functions' changelogShards (1: one changelog topic; default: the worker's, 16)"
    )
    ap.add_argument("--steady-s", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=1, help="1: one worker, in this process; more: a cluster")
    ap.add_argument(
        "--cycles",
        type=int,
        default=1,
        help="2 -> 3 -> 2 cycles per mode: the unaffected keys' p99 is also given over the records of every "
        "cycle together (one 3 -> 2 lasts 1-2 s at 50 MB, so its own p99 rests on a few records)",
    )
    ap.add_argument(
        "--no-relay",
        action="store_true",
        help="clients reach pulsar-lite directly, not through the relay that fences B10 (docs/dev/pulsar-lite-defects.md): "
        "to measure what the relay's hop costs; nothing here kills a client",
    )
    ap.add_argument(
        "--broker",
        choices=("lite", "apache"),
        default="lite",
        help="with --workers > 1: the embedded pulsar-lite (default) or an Apache Pulsar standalone "
        "(docs/apache-pulsar.md; --no-relay and --broker-dir are pulsar-lite's)",
    )
    ap.add_argument(
        "--broker-dir",
        metavar="DIR",
        help="keep the broker's data in a new directory under DIR (default: beside the workers' stores, "
        "in the run's temporary directory): to tell the broker's disk waits from the workers'",
    )
    ap.add_argument("--arrivals", help="also write every output's (received ms, sent ms, key) and the changes here")
    ap.add_argument(
        "--route-times",
        action="store_true",
        help="with --workers 3 and --arrivals: also read the instances' route topics and write when the "
        "front forwarded each record (sent ms, forwarded ms, key, instance), to tell a slow front from a slow "
        "instance",
    )
    ap.add_argument(
        "--modes",
        help="comma-separated, live and the baselines to compare it with (default: all that "
        "apply; live alone: the unaffected keys over many cycles, no baseline): stop-the-world (every group pauses, the instances keep running); restart "
        "(every instance stops, the parallelism changes, all start: stock Pulsar's "
        "parallelism change; a cluster only)",
    )
    ap.add_argument(
        "--rescore",
        metavar="FILE",
        help="run nothing: score the changes and outputs an earlier run wrote with --arrivals "
        "(give the same --groups, --steady-s and --cycles)",
    )
    args = ap.parse_args()
    if args.broker == "apache" and args.workers == 1:
        ap.error("--broker apache: with --workers > 1 (one worker in this process runs on pulsar-lite)")
    default = MODES if args.workers > 1 else MODES[:2]
    args.modes = [m.strip() for m in args.modes.split(",")] if args.modes else list(default)
    if set(args.modes) - set(default) or "live" not in args.modes:
        ap.error(f"--modes: live, alone or with any of {', '.join(default[1:])} (got {','.join(args.modes)})")

    sys.path.insert(0, str(ROOT))
    if args.rescore:
        saved = json.loads(Path(args.rescore).read_text())
        print(json.dumps(_score({"rescored": args.rescore}, saved["changes"], saved["arrivals"], args), indent=1))
        return

    state_bytes = int(args.state_mb * 1e6 / args.keys)
    keys = [f"key-{i}" for i in range(args.keys)]
    tmp = tempfile.mkdtemp(prefix="bench-state-migration-")
    out: dict = {
        "keys": args.keys,
        "key_groups": args.groups,
        "state_bytes_per_key": state_bytes,
        "service_ms": args.service_ms,
        "subscale": args.subscale,
        "duty": args.duty,
        "pre_copy_mb_per_s": args.pre_copy_mbps,
        "changelog_shards": args.changelog_shards or "default",
    }
    run = _one_worker if args.workers == 1 else _cluster
    try:
        changes, restores, data = run(args, keys, state_bytes, tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(_broker_dir(args, tmp), ignore_errors=True)
    out["rate_per_s"] = round(args.load * out["capacity_2_instances_per_s"], 1)
    arrivals = data["arrivals"]
    if args.arrivals:
        Path(args.arrivals).write_text(json.dumps({"changes": changes, "arrivals": arrivals, "routed": data.get("routed", [])}))
    out["sent"] = data["sent"]
    out["received"] = len(arrivals)
    out["restores"] = restores
    print(json.dumps(_score(out, changes, arrivals, args), indent=1))


def _score(out: dict, changes: list[dict], arrivals: list, args) -> dict:
    """Per change: latencies of the records sent during it, the unaffected keys' p99 before, during and after it;
    per kind of change: live over stop-the-world, and with --cycles the pooled p99s."""
    from pulsar_autoscale.functions.model.keygroups import key_group

    next_put = {id(c): min((d["t_put"] for d in changes if d["t_put"] > c["t_done"]), default=float("inf")) for c in changes}
    pooled: dict[tuple[str, str], list[tuple[list, list, list]]] = collections.defaultdict(list)
    for c in changes:
        moving = set(c.pop("moving"))
        end_after = min(next_put[id(c)], c["t_done"] + (CHANGE_TAIL_S + args.steady_s) * 1000)
        lo, hi = c.pop("t_put"), c.pop("t_done")
        during = [(r - e, k) for r, e, k in arrivals if lo <= e <= hi + CHANGE_TAIL_S * 1000]
        steady = [(r - e, k) for r, e, k in arrivals if lo - args.steady_s * 1000 + 1000 <= e < lo]
        after = [(r - e, k) for r, e, k in arrivals if hi + CHANGE_TAIL_S * 1000 < e < end_after]
        unmoved = lambda rows: [lat for lat, k in rows if key_group(k, args.groups) not in moving]  # noqa: E731
        p99_before = _pct(unmoved(steady), 0.99)
        pooled[(c["mode"], c["change"])].append((unmoved(steady), unmoved(during), unmoved(after)))
        slow = collections.Counter(
            int((e - lo) / 500) / 2
            for r, e, k in arrivals
            if lo <= e <= hi + CHANGE_TAIL_S * 1000 and key_group(k, args.groups) not in moving and r - e > 2 * p99_before
        )
        c.update(
            {
                "put_at_epoch_s": round(lo / 1000, 3),  # to line up with the workers' logs
                "records_during": len(during),
                "peak_ms": max((lat for lat, _ in during), default=None),
                "mean_ms": round(statistics.fmean(lat for lat, _ in during), 1) if during else None,
                "steady_mean_ms": round(statistics.fmean(lat for lat, _ in steady), 1) if steady else None,
                "unaffected_p99_before_ms": _pct(unmoved(steady), 0.99),
                "unaffected_p99_during_ms": _pct(unmoved(during), 0.99),
                "unaffected_p99_after_ms": _pct(unmoved(after), 0.99),
                # the noise floor: the same p99 in each half of the steady period before
                "unaffected_p99_before_halves_ms": [
                    _pct(unmoved(half), 0.99) for half in (steady[: len(steady) // 2], steady[len(steady) // 2 :])
                ],
                # when the unaffected records slower than twice the p99 before were sent: s after the PUT -> count
                "unaffected_slow_by_half_second": dict(sorted(slow.items())),
            }
        )
    out["changes"] = changes
    for change in ("2->3", "3->2"):
        of = lambda mode: [c for c in changes if c["mode"] == mode and c["change"] == change]  # noqa: E731
        live = of("live")
        per_cycle = {
            f"{what}_live_over_{abbrev}": [round(a[f"{what}_ms"] / b[f"{what}_ms"], 3) for a, b in zip(live, of(mode))]
            for mode, abbrev in (("stop-the-world", "stw"), ("restart", "restart"))
            if of(mode)
            for what in ("peak", "mean")
        } | {
            "unaffected_p99_during_over_before": [
                round(a["unaffected_p99_during_ms"] / a["unaffected_p99_before_ms"], 3) for a in live
            ],
            "unaffected_p99_during_over_steady": [
                round(a["unaffected_p99_during_ms"] / max(a["unaffected_p99_before_ms"], a["unaffected_p99_after_ms"] or 0), 3)
                for a in live
            ],
        }
        out[f"ratio_{change}"] = {k: v[0] if args.cycles == 1 else v for k, v in per_cycle.items()}
        if args.cycles > 1:
            out[f"ratio_{change}"]["unaffected_p99_pooled"] = _pooled_p99(pooled[("live", change)])
    return out


if __name__ == "__main__":
    main()
