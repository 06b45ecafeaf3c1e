"""`pulsar-autoscale demo`: the whole story on the embedded broker, in one command.

The paper's image application (pulsar_autoscale/image_app.py: resize-store, resize-recognize, recognize): at
the peak rate recognize needs about 5-7 instances and resize 1-2, the paper's shape at a scale two cores can run.

Poisson arrivals step through constant-rate intervals; the controller (leader-elected, the
chosen policy) scales every function through the worker's REST API, restart-free. A live view
shows rate, backlog, instances, response time and the last decision per function; at the end
a report directory gets summary.json, timeseries.csv, decisions.jsonl and PNG plots.
`--broker apache` runs the same on an Apache Pulsar standalone (our worker and controller on it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pulsar

from pulsar_autoscale import image_app
from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.cli.demo_report import SINKS, Recorder, Sample, percentile, print_summary, summarize, write_report
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.image_app import NS, STAGES
from pulsar_autoscale.paths import user_data_dir
from pulsar_autoscale.pulsar_client import open_client

DEFAULT_SLO_S = 1.0  # the paper's R_max per path
SOURCE = f"persistent://{NS}/{image_app.SOURCE}"


def load_generator(client, rates: list[float], interval_s: float, rec: Recorder, stop: threading.Event, seed: int) -> None:
    """Poisson arrivals at a constant rate per interval (the paper's workload shape)."""
    rng = np.random.default_rng(seed)
    producer = client.create_producer(SOURCE, batching_enabled=False, block_if_queue_full=True)
    start = time.monotonic()
    next_t = start
    i = 0
    while not stop.is_set():
        k = int((next_t - start) // interval_s)
        if k >= len(rates):
            break
        next_t += rng.exponential(1.0 / rates[k])
        delay = next_t - time.monotonic()
        if delay > 0 and stop.wait(delay):
            break
        producer.send_async(str(i).encode(), None, event_timestamp=int(time.time() * 1000))
        i += 1
        rec.produced = i
    producer.flush()
    producer.close()


def sink_collector(client, rec: Recorder, stop: threading.Event) -> None:
    consumer = client.subscribe(
        list(SINKS), "demo-sink", consumer_type=pulsar.ConsumerType.Shared, initial_position=pulsar.InitialPosition.Earliest
    )
    while not stop.is_set():
        try:
            msg = consumer.receive(200)
        except pulsar.Timeout:
            continue
        now = time.time()
        topic = msg.topic_name()
        with rec.lock:
            seen = rec.received.setdefault(topic, {})
            seen[msg.data()] = seen.get(msg.data(), 0) + 1
            rec.rts.append((now, now - msg.event_timestamp() / 1000.0, topic))
        consumer.acknowledge(msg)
    consumer.close()


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="predictive", help="policy name or .py path (default predictive)")
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="policy parameter (repeatable)")
    p.add_argument("--duration", type=float, default=240.0, help="seconds of load (default 240; then drain)")
    p.add_argument("--rates", default="4,12,28,12,4", help="msg/s per constant-rate interval (default 4,12,28,12,4)")
    p.add_argument("--period", type=float, default=5.0, help="controller period in seconds (default 5)")
    p.add_argument("--window", type=float, default=10.0, help="metrics window in seconds (default 10)")
    p.add_argument(
        "--fast-period",
        type=float,
        default=1.0,
        metavar="S",
        help="fast scale-out check every S seconds on the consumers' counters (default 1; 0: off)",
    )
    p.add_argument("--fast-window", type=float, default=2.0, metavar="S", help="the fast check's window (default 2)")
    p.add_argument("--max-parallelism", type=int, default=8, help="per function (default 8)")
    p.add_argument(
        "--receiver-queue",
        type=int,
        default=10,
        help="messages each instance prefetches (default 10; 1 makes instances share one FIFO queue, the simulator's model)",
    )
    p.add_argument(
        "--report",
        default=None,
        help="report directory (default $XDG_DATA_HOME/pulsar-autoscale/demo/<policy>, ~/.local/share without XDG_DATA_HOME)",
    )
    p.add_argument(
        "--slo",
        type=float,
        default=None,
        metavar="S",
        help="response-time SLO the summary counts violations of (default: the policy's r_max_s "
        "parameter, else 1 s, the paper's)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-live", action="store_true", help="print a progress line every 10 s instead of a live view")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="run N workers as one cluster (docs/cluster.md); the live view shows instances per worker (default 1)",
    )
    p.add_argument(
        "--broker",
        choices=("lite", "apache"),
        default="lite",
        help="lite: the embedded pulsar-lite (default); apache: an Apache Pulsar standalone (needs java, "
        "and mvn for the first fetch: docs/apache-pulsar.md), our worker and controller on it",
    )


def open_broker(kind: str):
    """The demo's broker. Apache runs without its own functions worker: our worker runs the functions, and
    two cores have no room for an idle second one."""
    if kind == "apache":
        from pulsar_autoscale.broker.apache import ApacheStandalone

        return ApacheStandalone(functions_worker=False)
    return EmbeddedBroker(data_dir=None)


def parse_params(items: list[str]) -> dict:
    from pulsar_autoscale.errors import ConfigError

    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--param {item!r} must be KEY=VALUE")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


def run(args: argparse.Namespace) -> int:
    from pulsar_autoscale.errors import ConfigError
    from pulsar_autoscale.functions.api.server import WorkerServer
    from pulsar_autoscale.functions.cluster.member import ClusterSettings

    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        raise ConfigError(f"--rates {args.rates!r} must be comma-separated numbers") from None
    if not rates or min(rates) <= 0 or args.duration <= 0:
        raise ConfigError("--rates must be positive and --duration > 0")
    if args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    report = Path(args.report) if args.report else user_data_dir("demo", Path(args.policy).stem)
    report.mkdir(parents=True, exist_ok=True)
    logging.getLogger().setLevel(logging.WARNING)
    interval = args.duration / len(rates)
    fast = f"fast check every {args.fast_period:g}s" if args.fast_period > 0 else "no fast path"
    print(
        f"demo: {getattr(args, 'broker', 'lite')} broker, policy {args.policy}, rates {rates} msg/s for {interval:.0f}s each, period {args.period}s, {fast}; "
        f"report -> {report}",
        flush=True,
    )
    with open_broker(getattr(args, "broker", "lite")) as broker, contextlib.ExitStack() as stack:
        cluster = ClusterSettings(f"demo{os.getpid()}") if args.workers > 1 else None
        workers = [
            stack.enter_context(
                WorkerServer(
                    broker.service_url, metrics_url=broker.metrics_url, worker_id=f"w{i}" if cluster else None, cluster=cluster
                )
            )
            for i in range(args.workers)
        ]
        worker = workers[0]
        admin = FunctionsAdmin([w.url for w in workers])
        for s in STAGES:
            admin.create({**s.config(), "parallelism": 1, "receiverQueueSize": args.receiver_queue})
        wait_running(admin, [s.name for s in STAGES])
        config = ControllerConfig(
            service_url=broker.service_url,
            admin_url=tuple(w.url for w in workers),
            metrics_url=broker.metrics_url,
            policy=args.policy,
            policy_params=parse_params(args.param),
            period_s=args.period,
            window_s=args.window,
            plan={"max_parallelism": args.max_parallelism},
            fast={
                "enabled": args.fast_period > 0,
                "period_s": args.fast_period or 1.0,
                "window_s": max(args.fast_window, args.fast_period),
            },
            decision_log=str(report / "decisions.jsonl"),
            http_port=0,
            identity="demo-controller",
        )
        (report / "decisions.jsonl").unlink(missing_ok=True)
        controller = Controller(config).start()
        client = open_client(broker.service_url, pulsar.LoggerLevel.Error)
        rec = Recorder()
        stop_load, stop_sink = threading.Event(), threading.Event()
        sink = threading.Thread(target=sink_collector, args=(client, rec, stop_sink), daemon=True)
        sink.start()
        load = threading.Thread(target=load_generator, args=(client, rates, interval, rec, stop_load, args.seed), daemon=True)
        t0 = time.time()
        load.start()
        try:
            watch(admin if cluster else worker, controller, rec, rates, interval, t0, load, args.no_live)
            drain(rec, t0)
        except KeyboardInterrupt:
            stop_load.set()
            print("interrupted: writing the report of what ran", file=sys.stderr)
        stop_load.set()
        controller.stop()
        stop_sink.set()
        sink.join(5)
        client.close()
    summary = {"broker": getattr(args, "broker", "lite"), **summarize(rec, config, rates, interval, t0, slo_s(args))}
    write_report(report, rec, summary)
    print_summary(summary, report)
    return 0 if summary["lost"] == 0 else 1


def wait_running(admin: FunctionsAdmin, names: list[str], timeout_s: float = 30.0) -> None:
    """A function's subscription starts at the latest message (as in Pulsar): load starts once all have one."""
    from pulsar_autoscale.errors import PulsarAutoscaleError

    deadline = time.monotonic() + timeout_s
    while not all(admin.status("public", "default", n)["numRunning"] >= 1 for n in names):
        if time.monotonic() > deadline:
            raise PulsarAutoscaleError(f"demo functions did not start within {timeout_s:.0f}s")
        time.sleep(0.1)


def sample(worker, controller, rec: Recorder, rate: float, now: float) -> Sample:
    """`worker`: the one WorkerServer, or (--workers N) the cluster's FunctionsAdmin."""
    instances, backlog, per_worker = {}, {}, {}
    obs = controller.last_observation
    for s in STAGES:
        fqfn = f"{NS}/{s.name}"
        if isinstance(worker, FunctionsAdmin):
            running = [
                i["status"]["workerId"] for i in worker.status("public", "default", s.name)["instances"] if i["status"]["running"]
            ]
            instances[s.name] = len(running)
            per_worker[s.name] = {w: running.count(w) for w in sorted(set(running))}
        else:
            _, figs, _ = worker.worker.instance_figures(fqfn)
            instances[s.name] = sum(1 for f in figs.values() if f.running)
        fs = obs.snapshot.functions.get(fqfn) if obs else None
        backlog[s.name] = fs.backlog if fs else None
    rts = rec.window_rts(now - 10)
    return Sample(now, rate, instances, backlog, percentile(rts, 50), percentile(rts, 99), per_worker)


def watch(worker, controller, rec, rates, interval, t0, load, plain: bool) -> None:
    from rich.live import Live

    with (
        Live(render(controller, rec, None, 0), refresh_per_second=2, transient=False, auto_refresh=not plain)
        if not plain
        else _NoLive() as live
    ):
        last_print = 0.0
        seen: set = set()
        while load.is_alive():
            now = time.time()
            k = min(int((now - t0) // interval), len(rates) - 1)
            s = sample(worker, controller, rec, rates[k], now)
            rec.samples.append(s)
            if plain:
                for it in list(controller.history):
                    for d in it.decisions:
                        if d.get("new") != d.get("old") and (d["time"], d["function"]) not in seen:
                            seen.add((d["time"], d["function"]))
                            print(f"  {d['function'].rsplit('/', 1)[-1]}: {short_decision(d, t0)}", flush=True)
                if now - last_print >= 10:
                    last_print = now
                    print(progress_line(s, now - t0), flush=True)
            else:
                live.update(render(controller, rec, s, now - t0, t0))
            load.join(1.0)


class _NoLive:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def progress_line(s: Sample, elapsed: float) -> str:
    inst = " ".join(
        f"{k}={v}" + (f"({' '.join(f'{w}:{n}' for w, n in s.per_worker[k].items())})" if k in s.per_worker else "")
        for k, v in s.instances.items()
    )
    p99 = f"{s.rt_p99:.2f}s" if s.rt_p99 is not None else "-"
    return f"[{elapsed:5.0f}s] rate {s.target_rate:g}/s  instances {inst}  p99 {p99}"


def short_decision(d: dict, t0: float) -> str:
    """A decision in a few characters (the full reason is in decisions.jsonl): kind, change, when."""
    return f"{d.get('kind', 'period')} {d['old']}->{d['new']} @{d['time'] - t0:.0f}s"


def render(controller, rec: Recorder, s: Sample | None, elapsed: float, t0: float = 0.0):
    """The live table; it fits 80 columns."""
    from rich.table import Table

    table = Table(title=f"demo t={elapsed:.0f}s produced={rec.produced} policy={controller.config.policy}", width=80)
    columns: tuple[tuple[str, int], ...] = (
        ("function", 16),
        ("arrival/s", 9),
        ("backlog", 7),
        ("inst", 4),
        ("util", 4),
        ("last decision", 18),
    )
    if s is not None and s.per_worker:  # --workers N: instances per worker, at the expense of the decision column
        columns = columns[:4] + (("per worker", 16),) + columns[4:5] + (("last decision", 10),)
    for col, width in columns:
        table.add_column(col, max_width=width, no_wrap=True, overflow="ellipsis")
    obs = controller.last_observation
    last = {}
    for it in controller.history:
        for d in it.decisions:
            if d.get("new") != d.get("old"):
                last[d["function"]] = short_decision(d, t0)
    for st in STAGES:
        fqfn = f"{NS}/{st.name}"
        fs = obs.snapshot.functions.get(fqfn) if obs else None
        fmt = lambda v, p=1: "?" if v is None else f"{v:.{p}f}"
        spread = (
            (" ".join(f"{w}:{n}" for w, n in s.per_worker.get(st.name, {}).items()) or "-",)
            if s is not None and s.per_worker
            else ()
        )
        table.add_row(
            st.name,
            fmt(fs.arrival_rate if fs else None),
            fmt(fs.backlog if fs else None, 0),
            str(s.instances[st.name]) if s else "1",
            *spread,
            fmt(fs.utilization if fs else None, 2),
            last.get(fqfn, "-"),
        )
    if s is not None:
        table.caption = (
            f"target rate {s.target_rate:g} msg/s   response time (last 10 s): p50 "
            f"{'-' if s.rt_p50 is None else f'{s.rt_p50:.2f}s'}  p99 "
            f"{'-' if s.rt_p99 is None else f'{s.rt_p99:.2f}s'}"
        )
    return table


def drain(rec: Recorder, t0: float, timeout_s: float = 90.0) -> None:
    deadline = time.time() + timeout_s
    print("load finished; draining backlogs...", flush=True)
    while time.time() < deadline:
        with rec.lock:
            done = all(len(seen) >= rec.produced for seen in rec.received.values())
        if done:
            return
        time.sleep(0.5)
    print(f"drain did not finish within {timeout_s:.0f}s", file=sys.stderr)


def slo_s(args: argparse.Namespace) -> float:
    """--slo, else the response time the policy aims at (its r_max_s), else the paper's 1 s."""
    from pulsar_autoscale.errors import ConfigError

    slo = args.slo if args.slo is not None else parse_params(args.param).get("r_max_s", DEFAULT_SLO_S)
    if not isinstance(slo, (int, float)) or slo <= 0:
        raise ConfigError(f"the SLO must be a positive number of seconds, got {slo!r}")
    return float(slo)
