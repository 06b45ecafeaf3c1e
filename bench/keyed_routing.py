"""What a spread keyedState function's front costs on Apache Pulsar against Key_Shared sticky ranges, at the transport.

Raw pulsar-client consumers and producers, no function code. 3 "workers", each a process of its own with its own
pulsar.Client; 128 key groups split over 3 instances as KeyGroupAssignment.uniform splits them; `--keys` keys.
- front: instance 0's worker also holds the front, one Shared consumer of the input that republishes each record
  to its owner's route topic `<name>-route-<i>` (key and properties kept, the kg-* properties added, unbatched,
  the input acked once the forward is persisted: functions/keyed/cluster.py); each worker consumes its route topic
  (receiver queue 100, as functions/keyed/route_input.py).
- key_shared: each worker consumes the input with a Key_Shared consumer in Sticky mode whose ranges are its key
  groups' hash ranges (functions/model/keygroups.hash_range, one range per group unless --merge-ranges;
  `--assignment interleaved`: group g on instance g % 3, each instance's ranges apart, as after migrations).
- front_batched: the front with the client's default batching (2 ms) on its route producers (a route topic has
  one consumer, so a batch of mixed keys is fine there): what the extra hop costs when its forwards are batched.
The producer sends with key-based batching (what Key_Shared needs) in every setup (`--producer-batching default`:
the client's default batching, to see what Key_Shared does with batches of mixed keys). Per run, fresh topics, then:
- drain: `--messages` records produced at once (after `--warmup` records); records/s until every one has reached
  its owner, and the CPU seconds of the broker (JVM) and of the worker processes meanwhile, per record, from /proc;
- latency: `--rate` records/s for `--seconds`; p50 / p99 / max of send -> receive by the owner.
Every record is checked: received by the owner of its group only, none lost, none twice, each key's in order.
Setups alternate round after round (`--rounds`, after `--discard-rounds` left out: the fresh JVM's JIT warm-up
made the first front drain 5x slower) on one broker. Then, with `--lite-messages` > 0, key_shared once
on pulsar-lite, to see whether it loses records there (defect B11). Prints one JSON object; `--out` writes it.

    .venv/bin/python bench/keyed_routing.py --messages 20000 --warmup 2000 --rate 200 --seconds 20 --rounds 3 \
        --discard-rounds 1 --lite-messages 5000 --out bench/results/keyed_routing.json   # about 7 min here

Results and what they mean: docs/apache-pulsar.md, "Keyed routing: the front against Key_Shared sticky ranges".
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path

import pulsar

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from bench.proc_cpu import cpu_by_pid  # noqa: E402
from bench.report import emit  # noqa: E402
from pulsar_autoscale.broker.lite.incarnation import incarnation_client  # noqa: E402
from pulsar_autoscale.broker.profile import LITE  # noqa: E402
from pulsar_autoscale.functions.keyed.protocol import ORIGINAL_ID, ORIGINAL_PUBLISH, ORIGINAL_TOPIC  # noqa: E402
from pulsar_autoscale.functions.model.keygroups import KeyGroupAssignment, hash_range  # noqa: E402
from pulsar_autoscale.pulsar_client import open_client  # noqa: E402

PARALLELISM = 3
NUM_KEY_GROUPS = 128
SETUPS = ("front", "key_shared", "front_batched")
PAYLOAD = struct.Struct("<qd")  # record index, send time (time.time())
ROUTE_QUEUE = 100  # RouteInput's receiver queue


def assignment_of(kind: str) -> KeyGroupAssignment:
    """uniform: as a function starts (each instance's groups contiguous); interleaved: group g on instance g % 3,
    each instance's ranges far apart, as groups may end up after migrations."""
    if kind == "interleaved":
        return KeyGroupAssignment(NUM_KEY_GROUPS, tuple(g % PARALLELISM for g in range(NUM_KEY_GROUPS)))
    return KeyGroupAssignment.uniform(NUM_KEY_GROUPS, PARALLELISM)


def sticky_ranges(assignment: KeyGroupAssignment, instance: int, merge: bool) -> list[tuple[int, int]]:
    """The Key_Shared sticky ranges of an instance's groups: one per group, or adjacent ones merged."""
    ranges = [hash_range(g, assignment.num_key_groups) for g in assignment.groups_of(instance)]
    if not merge:
        return ranges
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and merged[-1][1] + 1 == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _received(consumer, stop: threading.Event):
    """The consumer's messages until `stop` is set and nothing has come for 100 ms."""
    while True:
        try:
            yield consumer.receive(100)
        except pulsar.Timeout:
            if stop.is_set():
                return


def _front(
    client: pulsar.Client,
    topic: str,
    routes: list[str],
    owner,
    queue: int,
    batched: bool,
    ready: threading.Event,
    stop: threading.Event,
) -> None:
    """The front's transport: receive the input, forward each record to its owner's route topic, ack when persisted.
    Unbatched as the product's route producers (functions/keyed/protocol.py); `batched`: default batching."""
    consumer = client.subscribe(
        topic,
        "fn",
        consumer_type=pulsar.ConsumerType.Shared,
        receiver_queue_size=queue,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    # a route topic has one consumer, so its batches need not be by key: the client's default batching
    batching = {"batching_enabled": True, "batching_max_publish_delay_ms": 2} if batched else {"batching_enabled": False}
    producers = [client.create_producer(r, block_if_queue_full=True, send_timeout_millis=0, **batching) for r in routes]
    ready.set()
    for msg in _received(consumer, stop):
        props = {
            **msg.properties(),
            ORIGINAL_ID: str(msg.message_id()),
            ORIGINAL_TOPIC: msg.topic_name(),
            ORIGINAL_PUBLISH: str(msg.publish_timestamp()),
        }
        kwargs: dict = {"properties": props}
        if msg.partition_key():
            kwargs["partition_key"] = msg.partition_key()
        if msg.event_timestamp():
            kwargs["event_timestamp"] = msg.event_timestamp()

        def done(result, _msg_id, msg=msg):
            if result == pulsar.Result.Ok:
                consumer.acknowledge(msg)
            else:
                consumer.negative_acknowledge(msg)

        producers[owner(msg.partition_key())].send_async(msg.data(), done, **kwargs)
    try:
        for p in producers:
            p.flush()
            p.close()
        consumer.close()
    except pulsar.PulsarException:  # closing on pulsar-lite may time out; the records are counted already
        pass


def worker(
    setup: str,
    lite: bool,
    service_url: str,
    topic: str,
    instance: int,
    ranges: list[tuple[int, int]],
    owners: tuple,
    keys: int,
    queue: int,
    counter,
    after,
    ready,
    stop,
    results,
) -> None:
    """One worker process: its consumer (route topic or sticky Key_Shared input), and for instance 0 the front.
    It subscribes once `after` (the previous worker subscribed) is set: one at a time. On pulsar-lite its client
    has consumer ids of its own (defect B2: a second client cannot join a subscription otherwise)."""
    assignment = KeyGroupAssignment(NUM_KEY_GROUPS, owners)
    if lite:
        client = incarnation_client(service_url, LITE)
    else:
        client = open_client(service_url, log_level=pulsar.LoggerLevel.Error)
    routes = [f"{topic}-route-{i}" for i in range(PARALLELISM)]
    if after is not None:
        after.wait(300)
    if setup.startswith("front"):
        consumer = client.subscribe(
            routes[instance],
            "route",
            consumer_type=pulsar.ConsumerType.Shared,
            receiver_queue_size=ROUTE_QUEUE,
            initial_position=pulsar.InitialPosition.Earliest,
        )
    else:
        consumer = client.subscribe(
            topic,
            "fn",
            consumer_type=pulsar.ConsumerType.KeyShared,
            receiver_queue_size=queue,
            initial_position=pulsar.InitialPosition.Earliest,
            key_shared_policy=pulsar.ConsumerKeySharedPolicy(key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=ranges),
        )
    front_stop, front = threading.Event(), None
    if setup.startswith("front") and instance == 0:
        front_ready = threading.Event()
        front = threading.Thread(
            target=_front,
            args=(client, topic, routes, assignment.owner, queue, setup == "front_batched", front_ready, front_stop),
            daemon=True,
        )
        front.start()
        front_ready.wait(60)
    ready.set()
    indices: list[int] = []
    sent: list[float] = []
    times: list[float] = []
    wrong_key = 0
    for msg in _received(consumer, stop):
        now = time.time()
        index, sent_at = PAYLOAD.unpack(msg.data())
        if msg.partition_key() != f"k{index % keys}":
            wrong_key += 1
        indices.append(index)
        sent.append(sent_at)
        times.append(now)
        consumer.acknowledge(msg)
        counter.value += 1
    if front is not None:
        front_stop.set()
        front.join(30)
    notes = []
    try:
        consumer.close()
        client.close()
    except pulsar.PulsarException as exc:  # pulsar-lite may time out here: the records are still reported
        notes.append(f"worker {instance}: closing: {exc!r}")
    results.put({"instance": instance, "indices": indices, "sent": sent, "recv": times, "wrong_key": wrong_key, "notes": notes})


def _pct(values: list[float], p: float) -> float | None:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(p * len(s)))], 2) if s else None


def _cpu(pids: list[int]) -> float:
    """CPU seconds of these processes and their descendants."""
    procs = cpu_by_pid()
    mine, grew = set(pids), True
    while grew:
        new = {p for p, (pp, _) in procs.items() if pp in mine} - mine
        mine |= new
        grew = bool(new)
    return sum(procs[p][1] for p in mine if p in procs)


class Run:
    """One setup's processes and topics on one broker."""

    def __init__(self, setup: str, service_url: str, broker_pids: list[int], args, lite: bool = False):
        self.setup, self.args, self.broker_pids = setup, args, broker_pids
        self.assignment = assignment_of(args.assignment)
        self.topic = f"persistent://public/default/kr-{setup}-{uuid.uuid4().hex[:6]}"
        ctx = mp.get_context("spawn")
        self.counters = [ctx.RawValue("q", 0) for _ in range(PARALLELISM)]
        self.stop, self.results = ctx.Event(), ctx.Queue()
        readies = [ctx.Event() for _ in range(PARALLELISM)]
        self.procs = [
            ctx.Process(
                target=worker,
                daemon=True,
                args=(
                    setup,
                    lite,
                    service_url,
                    self.topic,
                    i,
                    sticky_ranges(self.assignment, i, args.merge_ranges),
                    self.assignment.owners,
                    args.keys,
                    args.receiver_queue,
                    self.counters[i],
                    readies[i - 1] if i else None,
                    readies[i],
                    self.stop,
                    self.results,
                ),
            )
            for i in range(PARALLELISM)
        ]
        for p in self.procs:
            p.start()
        for e in readies:
            if not e.wait(300):
                raise RuntimeError(f"{setup}: a worker did not subscribe within 300 s")
        self.client = open_client(service_url, log_level=pulsar.LoggerLevel.Error)
        batching = pulsar.BatchingType.KeyBased if args.producer_batching == "key" else pulsar.BatchingType.Default
        self.producer = self.client.create_producer(
            self.topic, batching_enabled=True, batching_type=batching, batching_max_publish_delay_ms=2, block_if_queue_full=True
        )
        self.sent = 0
        self.notes: list[str] = []

    def received(self) -> int:
        return sum(c.value for c in self.counters)

    def send(self, n: int, rate: float | None = None) -> None:
        start = time.monotonic()
        for j in range(n):
            if rate:
                delay = start + j / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            i = self.sent
            self.producer.send_async(PAYLOAD.pack(i, time.time()), None, partition_key=f"k{i % self.args.keys}")
            self.sent += 1
        self.producer.flush()

    def wait_all(self) -> bool:
        """Until every record sent so far is received (True), or no progress for --stall-s (False)."""
        last, since = -1, time.monotonic()
        while True:
            got = self.received()
            if got >= self.sent:
                return True
            if got != last:
                last, since = got, time.monotonic()
            elif time.monotonic() - since > self.args.stall_s:
                return False
            time.sleep(0.005)

    def cpu(self) -> dict[str, float]:
        return {"broker": _cpu(self.broker_pids), "workers": _cpu([p.pid for p in self.procs])}

    def close(self) -> list[dict]:
        try:
            self.producer.close()
            self.client.close()
        except pulsar.PulsarException as exc:  # pulsar-lite may time out here (reported in the run's notes)
            self.notes.append(f"closing the producer: {exc!r}")
        self.stop.set()
        out = [self.results.get(timeout=120) for _ in self.procs]
        for p in self.procs:
            p.join(30)
        return sorted(out, key=lambda r: r["instance"])


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def run_one(setup: str, service_url: str, broker_pids: list[int], args, messages: int, lite: bool = False) -> dict:
    run = Run(setup, service_url, broker_pids, args, lite)
    complete = {}
    try:
        run.send(args.warmup)
        complete["warmup"] = run.wait_all()
        print(f"  {setup}: warmup {run.received()} / {run.sent}", file=sys.stderr, flush=True)
        first = run.sent
        c0, p0, t0 = run.cpu(), _self_cpu(), time.monotonic()
        run.send(messages)
        complete["drain"] = run.wait_all()
        drain_s = time.monotonic() - t0
        print(f"  {setup}: drain {run.received()} / {run.sent} in {drain_s:.1f} s", file=sys.stderr, flush=True)
        c1, p1 = run.cpu(), _self_cpu()
        second = run.sent
        n = int(args.rate * args.seconds)
        run.send(n, rate=args.rate)
        complete["latency"] = run.wait_all()
        c3, p3 = run.cpu(), _self_cpu()
    finally:
        per_worker = run.close()
        run.notes += [n for r in per_worker for n in r["notes"]]
    # correctness over every record of the run
    owner = run.assignment.owner
    seen: dict[int, int] = {}
    recv_at: dict[int, float] = {}
    misrouted = out_of_order = 0
    for r in per_worker:
        last_seq: dict[int, int] = {}
        for index, t in zip(r["indices"], r["recv"]):
            seen[index] = seen.get(index, 0) + 1
            recv_at.setdefault(index, t)
            key = index % args.keys
            if owner(f"k{key}") != r["instance"]:
                misrouted += 1
            seq = index // args.keys
            if seq <= last_seq.get(key, -1):
                out_of_order += 1
            last_seq[key] = max(seq, last_seq.get(key, -1))
    lost = [i for i in range(run.sent) if i not in seen]
    latencies = []
    sent_at = _sent_times(per_worker)
    for i in range(second, run.sent):
        if i in recv_at:
            latencies.append(1000 * (recv_at[i] - sent_at[i]))
    drain_cpu = {k: c1[k] - c0[k] for k in ("broker", "workers")}
    drain_cpu["producer"] = p1 - p0
    rate_cpu = {k: c3[k] - c1[k] for k in ("broker", "workers")}
    rate_cpu["producer"] = p3 - p1

    def per_record(cpu: dict, count: int) -> dict:
        out = {k: round(1000 * v / count, 4) for k, v in cpu.items()}
        out["broker+workers"] = round(out["broker"] + out["workers"], 4)
        out["total"] = round(out["broker+workers"] + out["producer"], 4)
        return out

    return {
        "setup": setup,
        "topic": run.topic,
        "messages": messages,
        "warmup": first,
        "complete": complete,
        "drain_s": round(drain_s, 3),
        "throughput_msg_s": round(messages / drain_s, 1),
        "cpu_ms_per_record": per_record(drain_cpu, messages),
        "cpu_s_drain": {k: round(v, 3) for k, v in drain_cpu.items()},
        "latency_ms_at_rate": {
            "rate_per_s": args.rate,
            "records": len(latencies),
            "p50": _pct(latencies, 0.5),
            "p99": _pct(latencies, 0.99),
            "max": round(max(latencies), 2) if latencies else None,
        },
        "cpu_ms_per_record_at_rate": per_record(rate_cpu, max(n, 1)),
        "notes": run.notes,
        "received_by_instance": [len(r["indices"]) for r in per_worker],
        "check": {
            "sent": run.sent,
            "lost": len(lost),
            "duplicates": sum(c - 1 for c in seen.values()),
            "misrouted": misrouted,
            "out_of_order": out_of_order,
            "wrong_key": sum(r["wrong_key"] for r in per_worker),
            "lost_sample": lost[:10],
        },
    }


def _describe(ranges: list[tuple[int, int]]) -> dict:
    return {"ranges": len(ranges), "first": ranges[0], "last": ranges[-1]}


def _sent_times(per_worker: list[dict]) -> dict[int, float]:
    return {i: t for r in per_worker for i, t in zip(r["indices"], r["sent"])}


def _summary(rs: list[dict]) -> dict:
    return {
        "best_throughput_msg_s": max(r["throughput_msg_s"] for r in rs),
        "median_throughput_msg_s": statistics.median(r["throughput_msg_s"] for r in rs),
        "median_cpu_ms_per_record": {
            k: round(statistics.median(r["cpu_ms_per_record"][k] for r in rs), 4) for k in rs[0]["cpu_ms_per_record"]
        },
        "latency_p50_ms": [r["latency_ms_at_rate"]["p50"] for r in rs],
        "latency_p99_ms": [r["latency_ms_at_rate"]["p99"] for r in rs],
        "latency_max_ms": [r["latency_ms_at_rate"]["max"] for r in rs],
        "correct": all(
            not any(r["check"][k] for k in ("lost", "duplicates", "misrouted", "out_of_order", "wrong_key")) for r in rs
        ),
    }


def _ratios(f: dict, k: dict) -> dict:
    return {
        "best_throughput": round(f["best_throughput_msg_s"] / k["best_throughput_msg_s"], 2),
        "median_throughput": round(f["median_throughput_msg_s"] / k["median_throughput_msg_s"], 2),
        **{
            f"cpu_per_record_{part}": round(f["median_cpu_ms_per_record"][part] / k["median_cpu_ms_per_record"][part], 2)
            for part in ("broker", "workers", "broker+workers", "total")
        },
        "latency_p50": round(statistics.median(f["latency_p50_ms"]) / statistics.median(k["latency_p50_ms"]), 2),
        "latency_p99": round(statistics.median(f["latency_p99_ms"]) / statistics.median(k["latency_p99_ms"]), 2),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000, help="records of the drain")
    ap.add_argument("--warmup", type=int, default=2000, help="records sent and received before the drain")
    ap.add_argument("--keys", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=200.0, help="records/s of the latency phase")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the latency phase")
    ap.add_argument("--rounds", type=int, default=2, help="each round runs every setup once")
    ap.add_argument(
        "--discard-rounds",
        type=int,
        default=1,
        help="rounds run first on the fresh JVM and left out of the summary (JIT warm-up)",
    )
    ap.add_argument("--receiver-queue", type=int, default=1000, help="input consumers' receiver queue")
    ap.add_argument(
        "--assignment",
        choices=("uniform", "interleaved"),
        default="uniform",
        help="uniform: KeyGroupAssignment.uniform; interleaved: group g on instance g %% 3 (non-contiguous)",
    )
    ap.add_argument("--merge-ranges", action="store_true", help="declare adjacent groups' ranges as one range")
    ap.add_argument("--stall-s", type=float, default=15.0, help="give up waiting after this long without a record")
    ap.add_argument("--lite-messages", type=int, default=5000, help="drain size of the key_shared run on pulsar-lite (0: none)")
    ap.add_argument(
        "--producer-batching",
        choices=("key", "default"),
        default="key",
        help="the input producer's batching: key-based (default) or the client's default (mixed keys "
        "in a batch: Key_Shared routes a whole batch by one key)",
    )
    ap.add_argument(
        "--setups",
        default=",".join(SETUPS),
        help="which, in this order: front, key_shared, front_batched (the front with batched forwards)",
    )
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args()
    from pulsar_autoscale.broker.apache import ApacheStandalone

    load0 = os.getloadavg()
    runs: dict[str, list[dict]] = {s: [] for s in args.setups.split(",")}
    discarded: list[dict] = []
    if args.rounds:
        with (
            tempfile.TemporaryDirectory(prefix="keyed-routing-") as d,
            ApacheStandalone(data_dir=d, functions_worker=False, log_level="warn") as broker,
        ):
            for round_ in range(args.discard_rounds + args.rounds):
                for setup in runs:
                    r = run_one(setup, broker.service_url, [broker.pid], args, args.messages)
                    if round_ < args.discard_rounds:  # a fresh JVM: its first runs are JIT warm-up
                        discarded.append(r)
                    else:
                        runs[setup].append(r)
                    print(
                        f"[apache] {setup}: {r['throughput_msg_s']} msg/s, "
                        f"{r['cpu_ms_per_record']['broker+workers']} ms CPU/record, "
                        f"p50 {r['latency_ms_at_rate']['p50']} ms, check {r['check']}",
                        file=sys.stderr,
                        flush=True,
                    )
    summary = {setup: _summary(rs) for setup, rs in runs.items() if rs}
    ratios = {
        f: _ratios(summary[f], summary["key_shared"])
        for f in ("front", "front_batched")
        if f in summary and "key_shared" in summary
    }
    lite = None
    if args.lite_messages > 0:
        from pulsar_autoscale.broker.embedded import EmbeddedBroker

        with (
            tempfile.TemporaryDirectory(prefix="keyed-routing-lite-") as d,
            EmbeddedBroker(data_dir=d, log_level="warn") as broker,
        ):
            pids = [p.pid for p in (broker._proc, broker._relay) if p is not None]
            try:
                lite = run_one("key_shared", broker.service_url, pids, args, args.lite_messages, lite=True)
                print(f"[lite] key_shared: check {lite['check']}", file=sys.stderr, flush=True)
            except Exception as exc:  # noqa: BLE001 -- reported, not fixed
                lite = {"error": repr(exc), "traceback": traceback.format_exc().splitlines()[-6:]}
                print(f"[lite] key_shared: {exc!r}", file=sys.stderr, flush=True)
    result = {
        "bench": "keyed_routing",
        "broker": "apache 4.0.8 standalone (functions worker off)",
        "cpu_cores": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load0],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "parallelism": PARALLELISM,
        "num_key_groups": NUM_KEY_GROUPS,
        "keys": args.keys,
        "messages": args.messages,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "discard_rounds": args.discard_rounds,
        "rate_per_s": args.rate,
        "seconds": args.seconds,
        "merge_ranges": args.merge_ranges,
        "producer_batching": args.producer_batching,
        "assignment": args.assignment,
        "sticky_ranges": [
            _describe(sticky_ranges(assignment_of(args.assignment), i, args.merge_ranges)) for i in range(PARALLELISM)
        ],
        "summary": summary,
        "ratios_over_key_shared": ratios,
        "runs": runs,
        "discarded_warmup_runs": [
            {k: r[k] for k in ("setup", "throughput_msg_s", "cpu_ms_per_record", "check")} for r in discarded
        ],
        "lite_key_shared": lite,
    }
    emit(result, args.out, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
