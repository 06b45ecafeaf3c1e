"""`pulsar-autoscale simulate`: one app, one workload, one policy, through the live controller's code."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, cast

from pulsar_autoscale.configparse import parse_params
from pulsar_autoscale.controller.autoscaler import Autoscaler
from pulsar_autoscale.controller.fast import FastConfig
from pulsar_autoscale.controller.planner import PlanConfig, Planner, restart_aware
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.policies import Policy, load_policy
from pulsar_autoscale.sim.apps import APPS, SimApp, load_app
from pulsar_autoscale.sim.clairvoyant import clairvoyant_policy
from pulsar_autoscale.sim.engine import SimConfig, simulate
from pulsar_autoscale.sim.results import SimResult
from pulsar_autoscale.sim.workloads import PRESETS, Workload, load_workload


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--app", default="paper-image", help=f"one of {', '.join(APPS)}")
    p.add_argument("--workload", default="paper", help=f"one of {', '.join(PRESETS)}, or trace:FILE")
    p.add_argument(
        "--policy",
        default="queueing",
        help="policy entry-point name, path to a .py file, or clairvoyant (the lower bound: knows the workload's rates ahead)",
    )
    p.add_argument("--param", action="append", default=[], metavar="K=V", help="policy parameter (YAML value), repeatable")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--period", type=float, default=30.0, help="MAPE period and metrics window, seconds")
    p.add_argument("--max-parallelism", type=int, default=15)
    p.add_argument(
        "--restart-cost",
        type=float,
        default=0.0,
        metavar="S",
        help="stock Pulsar: every update stops all instances for S seconds (0: restart-free)",
    )
    p.add_argument(
        "--restart-aware",
        action="store_true",
        help="the controller's stock-mode Plan settings (longer cooldown and stabilization, "
        "scale-out headroom, minimum scale-in)",
    )
    p.add_argument(
        "--start-latency", type=float, default=SimConfig.start_s, metavar="S", help="seconds before a new instance serves"
    )
    p.add_argument(
        "--gauge-refresh",
        type=float,
        default=SimConfig.gauge_refresh_s,
        metavar="S",
        help="the broker's arrivals and backlog are gauges refreshed every S seconds, as "
        "pulsar-lite's (about 5); 0: exact counts",
    )
    p.add_argument(
        "--fast-period",
        type=float,
        default=0.0,
        metavar="S",
        help="fast path: a scale-out-only check every S seconds on the consumers' counters (0: off)",
    )
    p.add_argument("--fast-window", type=float, default=FastConfig.window_s, metavar="S", help="the fast check's window, seconds")
    p.add_argument(
        "--warm-pool", type=int, default=0, metavar="N", help="standby instances per function; a scale-out takes them first"
    )
    p.add_argument(
        "--warm-start", type=float, default=SimConfig.warm_start_s, metavar="S", help="a standby's start latency, seconds"
    )
    p.add_argument(
        "--standby-weight",
        type=float,
        default=SimConfig.standby_weight,
        metavar="W",
        help="a standby's cost as a share of a running instance, in instance-seconds",
    )
    p.add_argument(
        "--slo", type=float, default=2.0, metavar="S", help="p99 response-time SLO the clairvoyant bound meets, seconds"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="DIR", help="write a PNG of the run into DIR")


def build_autoscaler(
    policy: str,
    params: dict,
    max_parallelism: int,
    plan: dict | None = None,
    fast: FastConfig | None = None,
    period_s: float = 30.0,
    oracle: tuple[SimApp, Workload, float, float] | None = None,
) -> Autoscaler:
    """The policy (its own max_parallelism, where it has one, follows the Plan bound), the Plan step
    and the fast path. `clairvoyant` needs `oracle` = (app, workload, slo_s, start_s)."""
    if max_parallelism < 1:
        raise ConfigError(f"--max-parallelism must be >= 1, got {max_parallelism}")
    instance: Policy
    if policy == "clairvoyant":
        if oracle is None:
            raise ConfigError("clairvoyant runs in the simulator only: it must know the workload")
        instance = clairvoyant_policy(*oracle, k_max=max_parallelism)
    else:
        instance = load_policy(policy, params)
    config = instance.config
    if (
        dataclasses.is_dataclass(config)
        and "max_parallelism" not in params
        and any(f.name == "max_parallelism" for f in dataclasses.fields(config))
    ):
        # is_dataclass also admits a dataclass type; a policy's config is an instance of one
        instance = type(instance)(dataclasses.replace(cast(Any, config), max_parallelism=max_parallelism))
    fast = fast if fast is not None and policy != "clairvoyant" else FastConfig()
    plan = fast.stabilization({**(plan or {}), "max_parallelism": max_parallelism}, period_s)
    return Autoscaler(instance, Planner(PlanConfig(**plan)), fast)


def sim_config(args: argparse.Namespace) -> SimConfig:
    if args.period <= 0:
        raise ConfigError(f"--period must be > 0 seconds, got {args.period}")
    if min(args.restart_cost, args.start_latency, args.gauge_refresh, args.warm_start, args.fast_period) < 0:
        raise ConfigError("--restart-cost, --start-latency, --gauge-refresh, --warm-start and --fast-period must be >= 0 seconds")
    if args.warm_pool < 0 or args.standby_weight < 0:
        raise ConfigError("--warm-pool and --standby-weight must be >= 0")
    return SimConfig(
        period_s=args.period,
        start_s=args.start_latency,
        restart_s=args.restart_cost,
        gauge_refresh_s=args.gauge_refresh,
        warm_pool=args.warm_pool,
        warm_start_s=args.warm_start,
        standby_weight=args.standby_weight,
        seed=args.seed,
    )


def fast_config(args: argparse.Namespace) -> FastConfig:
    if not args.fast_period:
        return FastConfig()
    return FastConfig(enabled=True, period_s=args.fast_period, window_s=max(args.fast_window, args.fast_period))


def run(args: argparse.Namespace) -> int:
    app = load_app(args.app)
    workload = load_workload(args.workload)
    config = sim_config(args)
    plan = restart_aware({}, args.period) if args.restart_aware else None
    started = time.perf_counter()
    autoscaler = build_autoscaler(
        args.policy,
        parse_params(args.param),
        args.max_parallelism,
        plan,
        fast_config(args),
        args.period,
        (app, workload, args.slo, config.start_s),
    )
    result = simulate(app, workload, autoscaler, config)
    out = {
        "app": args.app,
        "workload": args.workload,
        "policy": args.policy,
        "seed": args.seed,
        "fast_period_s": args.fast_period,
        "warm_pool": args.warm_pool,
        **result.summary(),
        "wall_s": round(time.perf_counter() - started, 3),
    }
    if args.plot:
        out["plot"] = str(plot(result, Path(args.plot), f"{args.app} {args.workload} {args.policy} seed {args.seed}"))
    if args.json:
        json.dump(out, sys.stdout)
        print()
    else:
        for key, value in out.items():
            print(f"{key:>20}: {round(value, 4) if isinstance(value, float) else value}")
    if result.policy_errors:  # results of a policy that failed are not results: a script must notice
        checks = int(result.sim_time_s // args.period)
        print(
            f"error: policy {args.policy} failed {result.policy_errors} time(s) in {checks} periods (nothing was "
            f"applied those times); last: {autoscaler.last_error}",
            file=sys.stderr,
        )
        return 1
    return 0


def plot(result: SimResult, directory: Path, title: str) -> Path:
    """Arrival rate, response times and instances per function over time, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result.series
    directory.mkdir(parents=True, exist_ok=True)
    fig, (ax_rate, ax_rt, ax_k) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    ax_rate.step(s.time, s.arrival_rate, where="post")
    ax_rate.set_ylabel("source msg/s")
    ax_rt.plot(s.rt_time, s.rt, ",", alpha=0.5)
    ax_rt.axhline(1.0, color="red", lw=0.8, ls="--")
    ax_rt.set_yscale("symlog", linthresh=1.0)
    ax_rt.set_ylabel("response time s")
    for name, ks in s.parallelism.items():
        ax_k.step(s.time, ks, where="post", label=name.rsplit("/", 1)[-1])
    ax_k.set_ylabel("parallelism")
    ax_k.set_xlabel("time s")
    ax_k.legend(loc="upper left", fontsize="small")
    fig.suptitle(f"{title}: mean {result.mean_rt_s:.2f}s p99 {result.p99_rt_s:.2f}s avg instances {result.avg_instances:.2f}")
    path = directory / (title.replace(" ", "_").replace("/", "-").replace(":", "-") + ".png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
