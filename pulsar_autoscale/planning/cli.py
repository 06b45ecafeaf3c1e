"""`pulsar-autoscale plan mst|profile|make|validate`: capacity planning on a simulated or live testbed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import cast

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.planning.extrapolate import Fit
from pulsar_autoscale.planning.mst import MstSettings, measure_mst
from pulsar_autoscale.planning.plan import Cluster, build_model, default_budgets, plan_for_rate
from pulsar_autoscale.planning.profile import profile_app
from pulsar_autoscale.planning.report import mst_json, mst_text, plan_text, write_plan
from pulsar_autoscale.planning.simbed import APPS, SimTestbed, load_app
from pulsar_autoscale.planning.testbed import Phases, TestConfig

# Phases per testbed: a simulated run costs nothing, a live one its wall time (an MST in minutes).
DEFAULTS: dict[str, dict[str, float | None]] = {
    "sim": {
        "warmup": MstSettings.warmup_s,
        "ramp": Phases.ramp_s,
        "observe": Phases.observe_s,
        "cooldown": Phases.cooldown_s,
        "step": MstSettings.step,
        "bracket": None,
    },
    "live": {"warmup": 10.0, "ramp": 5.0, "observe": 15.0, "cooldown": 3.0, "step": 0.02, "bracket": 0.1},
}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--app",
        default="linear",
        help=f"simulated app ({', '.join(APPS)}); live: sleepy, sleepy-chain, sleepy:MS, images (the demo) or an app YAML",
    )
    p.add_argument(
        "--testbed",
        default="sim",
        choices=("sim", "live"),
        help="sim: the simulated testbed; live: a worker and broker (--admin-url, --service-url, --metrics-url)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--slo-p99",
        type=float,
        default=None,
        metavar="S",
        help="p99 response time under S seconds: mst and profile measure SLO capacities "
        "(each test checks it); make sizes a function fed by a window's bursts to drain one within S",
    )
    for name, what in (
        ("warmup", "warm-up"),
        ("ramp", "ramp-up per run"),
        ("observe", "observation per run; a multiple of any window a function uses"),
        ("cooldown", "cooldown per run"),
    ):
        p.add_argument(
            f"--{name}",
            type=float,
            default=None,
            metavar="S",
            help=f"{what} (default sim {DEFAULTS['sim'][name]:g}, live {DEFAULTS['live'][name]:g})",
        )
    p.add_argument(
        "--step",
        type=float,
        default=None,
        metavar="F",
        help="stop when the next rate is within F of the last (default sim 0.01, live 0.02)",
    )
    p.add_argument(
        "--bracket",
        type=float,
        default=None,
        metavar="F",
        help="before a pass and a fail are known, move by F (default live 0.1; sim x1.5 / halve)",
    )
    p.add_argument("--admin-url", default=None, help="live: the worker's (or workers') Functions admin URL")
    p.add_argument("--service-url", default=None, help="live: the broker's service URL (pulsar://...)")
    p.add_argument("--metrics-url", default=None, help="live: the broker's Prometheus /metrics URL")
    p.add_argument(
        "--max-rate",
        type=float,
        default=1000.0,
        metavar="R",
        help="live: the warm-up's rate (above the app's capacity; the backlog is capped)",
    )
    p.add_argument("--producers", type=int, default=1, help="live: producer processes")
    p.add_argument(
        "--min-messages",
        type=int,
        default=200,
        metavar="N",
        help="live: extend each observation (up to 4x --observe) until every function received N messages",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="plan_command", required=True)
    p = sub.add_parser("mst", help="measure one deployment's maximum sustainable throughput by bisection")
    _common(p)
    p.add_argument("--parallelism", default="", metavar="F=K,...", help="per function (default 1 each)")
    p.add_argument("--start", choices=("warmup", "ds2"), default="warmup", help="the bisection's first rate")
    p = sub.add_parser("profile", help="each function's capacity at parallelism 1, 2, 4, ...")
    _common(p)
    p.add_argument("--max-parallelism", type=int, default=8)
    p = sub.add_parser("make", help="profile, measure small budgets, fit, and plan for a target rate")
    _common(p)
    p.add_argument("--target-rate", type=float, required=True, metavar="R", help="source messages/s to plan for")
    p.add_argument("--headroom", type=float, default=0.10)
    p.add_argument("--max-parallelism", type=int, default=8, help="profile each function up to this")
    p.add_argument("--largest-budget", type=int, default=16, help="largest budget (instances) measured")
    p.add_argument("--cores-per-worker", type=float, default=Cluster.cores_per_worker)
    p.add_argument("--instances-per-worker", type=int, default=Cluster.instances_per_worker)
    p.add_argument(
        "--runtime",
        choices=("thread", "process"),
        default=Cluster.runtime,
        help="production workers' runtime (thread: one interpreter lock each)",
    )
    p.add_argument("--out", metavar="DIR", help="write plan.json, controller.yaml, report.md and plots here")
    p = sub.add_parser("validate", help="the simulated accuracy table against the baselines")
    p.add_argument("--apps", default=",".join(APPS), help="comma-separated simulated apps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--largest-budget", type=int, default=16)
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")


def settings_of(args: argparse.Namespace) -> MstSettings:
    defaults = DEFAULTS[getattr(args, "testbed", "sim")]
    for name in ("warmup", "ramp", "observe", "cooldown", "step", "bracket"):
        if getattr(args, name, None) is None:
            setattr(args, name, defaults[name])
    for name in ("warmup", "ramp", "observe", "cooldown"):
        if getattr(args, name) < 0 or (name == "observe" and args.observe <= 0):
            raise ConfigError(f"--{name} must be {'> 0' if name == 'observe' else '>= 0'} seconds")
    return MstSettings(
        warmup_s=args.warmup,
        phases=Phases(args.cooldown, args.ramp, args.observe),
        slo_p99_s=args.slo_p99,
        start=getattr(args, "start", "warmup"),
        step=args.step,
        bracket=args.bracket or None,
    )


def testbed_of(args: argparse.Namespace):
    if getattr(args, "testbed", "sim") == "live":
        from pulsar_autoscale.planning.liveapps import load_live_app
        from pulsar_autoscale.planning.livebed import LiveTestbed

        missing = [f"--{n.replace('_', '-')}" for n in ("admin_url", "service_url", "metrics_url") if not getattr(args, n)]
        if missing:
            raise ConfigError(f"--testbed live needs {', '.join(missing)}")
        if args.min_messages < 0:
            raise ConfigError(f"--min-messages must be >= 0 (got {args.min_messages})")
        return LiveTestbed(
            load_live_app(args.app),
            args.admin_url,
            args.service_url,
            args.metrics_url,
            max_rate=args.max_rate,
            producers=args.producers,
            min_messages=args.min_messages,
        )
    return SimTestbed(load_app(args.app), seed=args.seed)


def parse_parallelism(text: str, functions: tuple[str, ...]) -> dict[str, int]:
    par = {f: 1 for f in functions}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, k = item.partition("=")
        if not sep or name not in par:
            raise ConfigError(f"--parallelism {item!r}: use F=K with F one of {', '.join(functions)}")
        try:
            par[name] = int(k)
        except ValueError:
            raise ConfigError(f"--parallelism {item!r}: K must be an integer") from None
        if par[name] < 1:
            raise ConfigError(f"--parallelism {item!r}: K must be >= 1")
    return par


def _emit(args, data: dict, text: str) -> None:
    if args.json:
        json.dump(data, sys.stdout, default=str)
        print()
    else:
        print(text)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.plan_command == "validate":
        from pulsar_autoscale.planning.validate import format_table, validate

        apps = [a.strip() for a in args.apps.split(",") if a.strip()]
        for a in apps:
            load_app(a)
        result = validate(apps, seed=args.seed, largest=args.largest_budget)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(result, indent=2))
        _emit(args, result, format_table(result))
        return 0 if result["passed"] else 1
    settings = settings_of(args)
    testbed = testbed_of(args)
    try:
        if args.plan_command == "mst":
            res = measure_mst(testbed, TestConfig(parse_parallelism(args.parallelism, testbed.functions())), settings)
            _emit(args, {**mst_json(res), "wall_s": round(time.perf_counter() - started, 3)}, mst_text(res))
            return 0
        if args.plan_command == "profile":
            prof = profile_app(testbed, args.max_parallelism, settings)
            lines = [f"profile of {testbed.name}: {prof.runs} runs, {prof.testbed_s / 60:.1f} testbed minutes"]
            for name, fp in prof.functions.items():
                pts = ", ".join(f"{p.parallelism}: {p.capacity:.1f}/s{'' if p.own else '*'}" for p in fp.points)
                fit = cast(Fit, fp.fit)  # profile_app fits a curve to every function
                lines.append(
                    f"  {name}: gain {fp.gain:.3f}; {pts}; curve {fit.family} {fit.formula()}"
                    + ("; keyed" if fp.key_group_weights else "")
                )
            lines.append("  (* another function fell behind first: a lower bound, not fitted)")
            _emit(args, {**prof.to_json(), "wall_s": round(time.perf_counter() - started, 3)}, "\n".join(lines))
            return 0
        # make: throughput capacities (an SLO failure does not say which function caused it, so SLO
        # capacities of the profile's runs cannot be composed); the SLO sizes the plan (burst_drain)
        throughput = replace(settings, slo_p99_s=None)
        prof = profile_app(testbed, args.max_parallelism, throughput)
        budgets = default_budgets(len(testbed.functions()), args.largest_budget)
        model = build_model(testbed, prof, budgets, throughput)
        cluster = Cluster(args.cores_per_worker, args.instances_per_worker, args.runtime)
        plan = plan_for_rate(model, args.target_rate, args.headroom, cluster, started, args.slo_p99)
        files = write_plan(Path(args.out), plan, model) if args.out else {}
        text = plan_text(plan, model) + ("\n  files: " + ", ".join(files.values()) if files else "")
        _emit(args, {"plan": plan.to_json(), "capacity_model": model.to_json(), "files": files}, text)
        return 3 if plan.refused else 0
    finally:
        close = getattr(testbed, "close", None)
        if close:
            close()
