"""Down time of a function's instances across parallelism updates: stock Pulsar's worker against ours, one broker.

The seed paper's central claim: stock Pulsar Functions restart every instance of a function on every parallelism
update, while a worker that starts or drains single instances leaves the others running. Measured here on ONE
Apache Pulsar standalone (ApacheStandalone), with the same function (bench/workloads/tag_instance.py, an
unmodified pulsar.Function that tags each output with context.get_instance_id(), its incarnation and the input's
send time), the same fixed-rate load and the same sequence of parallelism updates, each sent as the same REST
call (PUT /admin/v3/functions/..., what `pulsar-admin functions update --parallelism` sends):

- stock: the function on the standalone's own functions worker (process runtime, the distribution's python
  instance);
- ours: the function on our worker (`pulsar-autoscale worker --runtime process`, a child process) against the
  same standalone.

Per update: the time until every instance of the new parallelism emits from the incarnation it keeps; each
surviving instance's down time (its largest gap in outputs from the update request until that time plus
SETTLE_S; the same measure over as long a window just before the request is its floor, what an instance that
keeps emitting shows) and whether it was restarted (its incarnation changed); end-to-end latency (consumer
receive - send) of the
messages sent in a window after the request against a quiet window before it. Over the run: messages lost
(sent, never output) and duplicates (output more than once; one output message read twice by the bench's
reader is counted apart, as read_twice). Prints one JSON object, writes it under
bench/results/. Each mode runs the sequence --rounds times, the modes alternating (stock, ours, ours, stock, ...)
so that load drifting on a shared machine falls on both alike. `--broker lite` runs our worker alone on the
embedded broker (stock mode needs Apache).

Usage: python bench/update_downtime.py [--quick] [--rate 100] [--sequence 1,2,3,2,1] [--rounds 2] [--broker lite]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import pulsar
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.support

from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from pulsar_autoscale.netutil import free_port  # noqa: E402
from tests.support.fault_scenarios import stop  # noqa: E402
from tests.support.scenario import wait_until  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FUNCTION = REPO / "bench" / "workloads" / "tag_instance.py"
CLASS_NAME = "tag_instance.TagInstance"
CLI = Path(sys.executable).parent / "pulsar-autoscale"
RESULTS = REPO / "bench" / "results"
SETTLE_S = 1.0  # after the new parallelism is all running, this long still counts as the update's


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Plan:
    """The run both modes share."""

    sequence: tuple[int, ...]  # parallelism: the first is the create, each next one an update
    rate: float  # msg/s offered, fixed
    service_ms: float  # the function's work per message
    warmup_s: float  # after every initial instance emits, before the first update
    hold_s: float  # between updates (and after the last)
    update_window_s: float  # latency "during update": messages sent this long after a request
    quiet_window_s: float  # latency "quiet": messages sent this long before a request
    warm_pool: int  # our worker's standbys (0: every new instance starts cold, as stock's)
    rounds: int  # each mode runs the sequence this many times, alternating which goes first


@dataclass(frozen=True)
class Output:
    seq: int
    send_ts: float
    instance: int
    incarnation: str
    proc_ts: float
    recv_ts: float
    message_id: str  # the output's: one output read twice is the reader's duplicate, not the function's


@dataclass(frozen=True)
class Update:
    old: int
    new: int
    requested_ts: float
    answered_ts: float


@dataclass
class Trace:
    """Everything one mode's run saw; analyse() turns it into figures."""

    sent: dict[int, float] = field(default_factory=dict)
    send_failed: set[int] = field(default_factory=set)
    outputs: list[Output] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    ready_s: float = 0.0  # from the create to every initial instance's first output
    end_ts: float = 0.0  # when the producer stopped


def produce(client: pulsar.Client, topic: str, rate: float, trace: Trace, stop: threading.Event) -> None:
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    seq, next_t = 0, time.monotonic()
    while not stop.is_set():
        now = time.time()
        trace.sent[seq] = now

        def done(res, _msg_id, seq=seq):
            if res != pulsar.Result.Ok:
                trace.send_failed.add(seq)

        producer.send_async(f"{seq},{now:.6f}".encode(), done)
        seq += 1
        next_t += 1.0 / rate
        time.sleep(max(0.0, next_t - time.monotonic()))
    producer.flush()
    producer.close()


def consume(consumer: pulsar.Consumer, trace: Trace, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            msg = consumer.receive(200)
        except pulsar.Timeout:
            continue
        recv = time.time()
        seq, send_ts, inst, inc, proc = msg.data().decode().split(",")
        trace.outputs.append(Output(int(seq), float(send_ts), int(inst), inc, float(proc), recv, str(msg.message_id())))
        consumer.acknowledge(msg)


def run_mode(mode: str, admin_url: str, service_url: str, plan: Plan) -> Trace:
    """Create the function at sequence[0] under load, apply each update, stop the load, wait for the outputs."""
    name = f"ud-{mode}-{uuid.uuid4().hex[:6]}"
    in_topic, out_topic = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
    admin = FunctionsAdmin(admin_url, timeout_s=120)
    client = pulsar.Client(service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    trace, stop_load, stop_read = Trace(), threading.Event(), threading.Event()
    # Shared: pulsar-lite delivers some messages twice on Exclusive subscriptions (docs/dev/pulsar-lite-defects.md B1)
    consumer = client.subscribe(
        out_topic, "bench", initial_position=pulsar.InitialPosition.Earliest, consumer_type=pulsar.ConsumerType.Shared
    )
    reader = threading.Thread(target=consume, args=(consumer, trace, stop_read), daemon=True)
    loader = threading.Thread(target=produce, args=(client, in_topic, plan.rate, trace, stop_load), daemon=True)
    config = {
        "tenant": "public",
        "namespace": "default",
        "name": name,
        "className": CLASS_NAME,
        "inputs": [in_topic],
        "output": out_topic,
        "parallelism": plan.sequence[0],
        "subscriptionPosition": "Earliest",
        "py": str(FUNCTION),
        "userConfig": {"service_ms": plan.service_ms},
    }
    created = time.time()
    admin.create(config, str(FUNCTION))
    try:
        reader.start()
        loader.start()
        initial = set(range(plan.sequence[0]))
        wait_until(
            lambda: initial <= {o.instance for o in list(trace.outputs)},
            180,
            f"{mode}: the {plan.sequence[0]} initial instance(s) emitting",
            interval_s=0.2,
        )
        trace.ready_s = time.time() - created
        say(f"{mode}: {name} running at {plan.sequence[0]} after {trace.ready_s:.1f}s; warm-up {plan.warmup_s:g}s")
        time.sleep(plan.warmup_s)
        for old, new in zip(plan.sequence, plan.sequence[1:]):
            requested = time.time()
            admin.set_parallelism("public", "default", name, new)
            trace.updates.append(Update(old, new, requested, time.time()))
            say(f"{mode}: update {old} -> {new} answered in {time.time() - requested:.2f}s; holding {plan.hold_s:g}s")
            time.sleep(max(0.0, requested + plan.hold_s - time.time()))
        stop_load.set()
        loader.join(30)
        trace.end_ts = time.time()
        expected = set(trace.sent) - trace.send_failed
        last, idle_since = -1, time.monotonic()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and time.monotonic() - idle_since < 15:
            if expected <= {o.seq for o in list(trace.outputs)}:
                break
            if len(trace.outputs) != last:
                last, idle_since = len(trace.outputs), time.monotonic()
            time.sleep(1)
        say(f"{mode}: {len(trace.sent)} sent, {len(trace.outputs)} outputs")
    finally:
        stop_load.set()
        stop_read.set()
        reader.join(5)
        try:
            admin.delete("public", "default", name)
        except Exception as exc:  # noqa: BLE001 - the figures are taken; a failed cleanup is only reported
            say(f"{mode}: delete failed: {exc}")
        client.close()
    return trace


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def median(values: list[float], digits: int = 1) -> float | None:
    return round(statistics.median(values), digits) if values else None


def max_gap(points: list[float]) -> float:
    return max((b - a for a, b in zip(points, points[1:])), default=0.0)


def analyse(trace: Trace, plan: Plan) -> dict:
    """Per-update and whole-run figures (times in ms unless named _s)."""
    by_instance: dict[int, list[Output]] = {}
    first: dict[int, Output] = {}
    unique = list({o.message_id: o for o in trace.outputs}.values())  # an output the reader got twice: once
    for o in sorted(unique, key=lambda o: o.proc_ts):
        by_instance.setdefault(o.instance, []).append(o)
        if o.seq not in first or o.recv_ts < first[o.seq].recv_ts:
            first[o.seq] = o
    expected = set(trace.sent) - trace.send_failed
    lost = expected - set(first)
    repeats = [o for o in unique if first[o.seq] is not o]

    def latencies(lo: float, hi: float) -> list[float]:
        return [(first[s].recv_ts - t) * 1000 for s, t in trace.sent.items() if lo <= t < hi and s in first]

    updates, lat_update, lat_quiet = [], [], []
    for k, u in enumerate(trace.updates):
        t0 = u.requested_ts
        t_end = trace.updates[k + 1].requested_ts if k + 1 < len(trace.updates) else trace.end_ts
        running: dict[int, float | None] = {}
        for i in range(u.new):
            window = [o for o in by_instance.get(i, []) if t0 <= o.proc_ts <= t_end]
            kept = [o for o in window if o.incarnation == window[-1].incarnation] if window else []
            running[i] = round(kept[0].proc_ts - t0, 3) if kept else None
        all_running = None if None in running.values() else max(running.values())
        # steady again: every instance of the new parallelism emits from the incarnation it keeps, plus a margin
        steady = t_end if all_running is None else min(t_end, t0 + all_running + SETTLE_S)
        down, quiet_gap, restarted, restart_gap = {}, {}, [], {}
        for i in range(min(u.old, u.new)):
            outs = by_instance.get(i, [])
            window = [o for o in outs if t0 <= o.proc_ts <= steady]
            down[i] = round(max_gap([t0, *(o.proc_ts for o in window), steady]) * 1000, 1)
            # the floor: the same measure over a window as long, just before the request
            lo = t0 - (steady - t0)
            quiet_gap[i] = round(max_gap([lo, *(o.proc_ts for o in outs if lo <= o.proc_ts < t0), t0]) * 1000, 1)
            before = [o for o in outs if o.proc_ts < t0]
            after = [o for o in outs if t0 <= o.proc_ts <= t_end]
            if after and before and after[-1].incarnation != before[-1].incarnation:
                restarted.append(i)
                last_old = max(o.proc_ts for o in outs if o.incarnation == before[-1].incarnation)
                first_new = min(o.proc_ts for o in after if o.incarnation == after[-1].incarnation)
                restart_gap[i] = round((first_new - last_old) * 1000, 1)
        removed_last = {
            i: round(max((o.proc_ts for o in by_instance.get(i, []) if t0 <= o.proc_ts <= t_end), default=t0) - t0, 3)
            for i in range(u.new, u.old)
        }
        window_lat = latencies(t0, t0 + plan.update_window_s)
        quiet_lat = latencies(t0 - plan.quiet_window_s, t0)
        lat_update += window_lat
        lat_quiet += quiet_lat
        sent_in_window = [s for s, t in trace.sent.items() if t0 <= t < t0 + plan.update_window_s]
        updates.append(
            {
                "update": f"{u.old}->{u.new}",
                "put_answered_ms": round((u.answered_ts - t0) * 1000, 1),
                "down_ms": down,
                "quiet_max_gap_ms": quiet_gap,
                "restarted": restarted,
                "restart_gap_ms": restart_gap,
                "running_s": running,
                "all_running_s": all_running,
                "steady_s": round(steady - t0, 3),
                "removed_last_output_s": removed_last,
                "latency_update_ms": {"p50": pct(window_lat, 0.5), "p99": pct(window_lat, 0.99), "max": pct(window_lat, 1.0)},
                "latency_quiet_ms": {"p50": pct(quiet_lat, 0.5), "p99": pct(quiet_lat, 0.99)},
                "lost_in_window": sum(1 for s in sent_in_window if s in lost),
                # outputs of a message already output, by when they were made: which change brought them
                "duplicates_until_next": sum(1 for o in repeats if t0 <= o.proc_ts < t_end),
            }
        )
    return {
        "ready_s": round(trace.ready_s, 2),
        "updates": updates,
        "lat_update": lat_update,
        "lat_quiet": lat_quiet,
        "sent": len(trace.sent),
        "send_failed": len(trace.send_failed),
        "outputs": len(unique),
        "lost": len(lost),
        "duplicates": len(unique) - len(first),
        "read_twice": len(trace.outputs) - len(unique),
    }


def summarise(parts: list[dict]) -> dict:
    """One mode's figures pooled over its rounds (each part: analyse() of one round)."""
    updates = [u for p in parts for u in p["updates"]]
    lat_update = [v for p in parts for v in p["lat_update"]]
    lat_quiet = [v for p in parts for v in p["lat_quiet"]]
    downs = [d for u in updates for d in u["down_ms"].values()]
    survivors = sum(len(u["down_ms"]) for u in updates)
    alls = [u["all_running_s"] for u in updates if u["all_running_s"] is not None]
    gaps = [g for u in updates for g in u["restart_gap_ms"].values()]
    return {
        "summary": {
            "down_ms": {"median": median(downs), "max": pct(downs, 1.0), "samples": len(downs)},
            "quiet_max_gap_ms": {
                "median": median([g for u in updates for g in u["quiet_max_gap_ms"].values()]),
                "max": pct([g for u in updates for g in u["quiet_max_gap_ms"].values()], 1.0),
            },
            "restarted_instances": f"{sum(len(u['restarted']) for u in updates)}/{survivors}",
            "restart_gap_ms": {"median": median(gaps), "max": pct(gaps, 1.0), "samples": len(gaps)},
            "all_running_s": {
                "median": median(alls, 3),
                "max": max(alls) if alls else None,
                "not_reached": len(updates) - len(alls),
            },
            "latency_update_ms": {"p50": pct(lat_update, 0.5), "p99": pct(lat_update, 0.99), "max": pct(lat_update, 1.0)},
            "latency_quiet_ms": {"p50": pct(lat_quiet, 0.5), "p99": pct(lat_quiet, 0.99)},
            **{k: sum(p[k] for p in parts) for k in ("sent", "send_failed", "outputs", "lost", "duplicates", "read_twice")},
        },
        "ready_s": [p["ready_s"] for p in parts],
        "updates": updates,
    }


@contextmanager
def our_worker(service_url: str, metrics_url: str | None, work: Path, warm_pool: int) -> Iterator[str]:
    """`pulsar-autoscale worker --runtime process` as a child process: its own interpreter, as stock's JVM is."""
    port = free_port()
    cmd = [
        str(CLI),
        "worker",
        "--service-url",
        service_url,
        "--port",
        str(port),
        "--runtime",
        "process",
        "--data-dir",
        str(work / "worker"),
        "--warm-pool",
        str(warm_pool),
    ]
    cmd += ["--metrics-url", metrics_url] if metrics_url else []
    log_path = work / "worker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"our worker exited {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            return requests.get(f"{url}/admin/v3/functions/public/default", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(up, 90, "our worker's REST API", interval_s=0.2)
        yield url
    finally:
        stop(proc, 60)


def write_trace(trace: Trace, path: Path) -> None:
    """The raw outputs and updates of one round, for looking at what the figures summarise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "updates": [asdict(u) for u in trace.updates],
                "end_ts": trace.end_ts,
                "sent": len(trace.sent),
                "outputs": [asdict(o) for o in trace.outputs],
            }
        )
    )


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 1) if a is not None and b else None


def ratios(stock: dict, ours: dict) -> dict:
    s, o = stock["summary"], ours["summary"]
    return {
        "down_ms_median": ratio(s["down_ms"]["median"], o["down_ms"]["median"]),
        "down_ms_max": ratio(s["down_ms"]["max"], o["down_ms"]["max"]),
        "all_running_s_median": ratio(s["all_running_s"]["median"], o["all_running_s"]["median"]),
        "latency_update_p99": ratio(s["latency_update_ms"]["p99"], o["latency_update_ms"]["p99"]),
    }


def run(plan: Plan, modes: list[str], broker_kind: str, trace_dir: Path | None = None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="update-downtime-"))  # kept (logs) only when the run fails
    result: dict = {"bench": "update_downtime", "broker": broker_kind, "plan": asdict(plan), "load_avg_before": os.getloadavg()}
    if broker_kind == "apache":
        from pulsar_autoscale.broker.apache import ApacheStandalone

        broker_cm = ApacheStandalone(data_dir=str(work / "apache"))
    else:
        from pulsar_autoscale.broker.embedded import EmbeddedBroker

        broker_cm = EmbeddedBroker(data_dir=str(work / "lite"))
    say(f"starting {broker_kind} broker")
    with broker_cm as broker:
        if broker_kind == "apache":
            result["broker"] = f"apache {broker.home.parent.name}"
            if broker.python_missing and "stock" in modes:
                raise RuntimeError(f"the stock python instance lacks {broker.python_missing}")
        say(f"broker ready: {broker.service_url}")
        with ExitStack() as stack:
            ours_url = (
                stack.enter_context(our_worker(broker.service_url, broker.metrics_url, work, plan.warm_pool))
                if "ours" in modes
                else None
            )
            parts: dict[str, list[dict]] = {m: [] for m in modes}
            for r in range(plan.rounds):
                # ABBA: each mode goes first as often as second, so load drifting on a shared machine evens out
                for mode in modes if r % 2 == 0 else modes[::-1]:
                    say(f"round {r + 1}/{plan.rounds}: {mode}")
                    url = broker.admin_url if mode == "stock" else ours_url
                    trace = run_mode(mode, url, broker.service_url, plan)
                    if trace_dir is not None:
                        write_trace(trace, trace_dir / f"{mode}-{r + 1}.json")
                    parts[mode].append(analyse(trace, plan))
        for mode in modes:
            result[mode] = summarise(parts[mode])
            say(f"{mode}: {json.dumps(result[mode]['summary'])}")
    if "stock" in result and "ours" in result:
        result["ratios_stock_over_ours"] = ratios(result["stock"], result["ours"])
    result["load_avg_after"] = os.getloadavg()
    shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a short run: 1 -> 2 -> 1, shorter holds")
    ap.add_argument(
        "--broker", choices=("apache", "lite"), default="apache", help="lite: our worker only, on the embedded broker"
    )
    ap.add_argument("--modes", default=None, help="comma-separated: stock, ours (default both; lite: ours)")
    ap.add_argument("--sequence", default=None, help="parallelism sequence of a round (default 1,2,3,2,1)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per mode, alternating order (default 2, quick 1)")
    ap.add_argument("--rate", type=float, default=100.0, help="msg/s (default 100)")
    ap.add_argument("--service-ms", type=float, default=2.0)
    ap.add_argument("--hold", type=float, default=None, help="seconds between updates (default 20, quick 15)")
    ap.add_argument("--warm-pool", type=int, default=0, help="our worker's standbys per function (default 0)")
    ap.add_argument("--trace-dir", default=None, help="also write each round's raw outputs there (JSON)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/update_downtime[_quick|_lite].json)")
    args = ap.parse_args()
    sequence = tuple(int(p) for p in (args.sequence or ("1,2,1" if args.quick else "1,2,3,2,1")).split(","))
    hold = args.hold or (15.0 if args.quick else 20.0)
    update_window, quiet_window = min(10.0, hold / 2), min(8.0, hold / 2 - 1)
    # the first quiet window must not reach back into the start (the backlog of the instances' first seconds)
    plan = Plan(
        sequence=sequence,
        rate=args.rate,
        service_ms=args.service_ms,
        warmup_s=quiet_window + 5.0,
        hold_s=hold,
        update_window_s=update_window,
        quiet_window_s=quiet_window,
        warm_pool=args.warm_pool,
        rounds=args.rounds or (1 if args.quick else 2),
    )
    modes = (args.modes or ("ours" if args.broker == "lite" else "stock,ours")).split(",")
    if args.broker == "lite" and "stock" in modes:
        ap.error("stock mode needs Apache Pulsar's functions worker (--broker apache)")
    started = time.monotonic()
    result = run(plan, modes, args.broker, Path(args.trace_dir) if args.trace_dir else None)
    result["wall_s"] = round(time.monotonic() - started, 1)
    suffix = "_lite" if args.broker == "lite" else "_quick" if args.quick else ""
    out = Path(args.out) if args.out else RESULTS / f"update_downtime{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=1)
    out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
