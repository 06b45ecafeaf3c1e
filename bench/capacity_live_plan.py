"""A whole capacity plan made live, then checked live: the demo's image application (resize-store,
resize-recognize, recognize) on a broker (the embedded pulsar-lite, or Apache Pulsar standalone with --broker apache)
and one worker of this machine. `plan make --testbed live`'s
code (profile each function, measure MST at small budgets, fit, plan for the target rate), then the planned
deployment is run at 100% of the target for --sustain-s (it must keep up: processed >= 99% of injected, no
backlog growing, p99 under --slo-p99) and at 115% (it must fall behind: the plan is not padded beyond its
headroom). Prints JSON and writes it to --out.

A throughput measurement on a shared machine is a benchmark, not a test: run it on a quiet machine.

    python3 bench/capacity_live_plan.py --target-rate 40 [--broker apache] [--sustain-s 600] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from brokers import add_broker_option, open_broker  # bench/ is the script's directory
from report import emit

from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.planning.liveapps import images_app
from pulsar_autoscale.planning.livebed import LiveTestbed
from pulsar_autoscale.planning.mst import MstSettings, judge
from pulsar_autoscale.planning.plan import Cluster, build_model, default_budgets, plan_for_rate
from pulsar_autoscale.planning.profile import profile_app
from pulsar_autoscale.planning.sustain import OVERLOAD
from pulsar_autoscale.planning.testbed import Phases, TestConfig


def _run_json(run, verdict: tuple[bool, str]) -> dict:
    return {
        "target_rate": run.target_rate,
        "injected_rate": round(run.injected_rate, 2),
        "processed_rate": round(run.processed_rate, 2),
        "p99_s": run.p99_s,
        "observe_s": run.observe_s,
        "passed": verdict[0],
        "reason": verdict[1],
    }


def baselines(out: dict) -> list[dict]:
    """Each measured budget's MST against what the two baselines predict for the same allocation:
    linear from one instance (each function's capacity at parallelism 1, times k) and DS2 one-shot
    (each function's true rate per busy second in its parallelism-1 run, times k)."""
    fns = out["profile"]["functions"]
    model = out["plan"]["model"]

    def rate(parallelism: dict, key: str) -> float:
        return min(fns[f]["points"][0][key] * k / fns[f]["gain"] for f, k in parallelism.items())

    rows = []
    for p in out["measured_points"]:
        lin, ds2 = rate(p["parallelism"], "capacity"), rate(p["parallelism"], "true_rate")
        # the model's fit at this budget (a saved result without it: the profile family's factor)
        fitted = p.get("predicted", model["params"][0] * p["profile_rate"] if model["family"] == "profile" else None)
        rows.append(
            {
                "budget": p["budget"],
                "measured": p["mst"],
                "planner": None if fitted is None else round(fitted, 2),
                "planner_error": None if fitted is None else round(abs(fitted - p["mst"]) / p["mst"], 4),
                "linear": round(lin, 2),
                "linear_error": round(abs(lin - p["mst"]) / p["mst"], 4),
                "ds2": round(ds2, 2),
                "ds2_error": round(abs(ds2 - p["mst"]) / p["mst"], 4),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-rate", type=float, default=40.0, help="source images/s to plan for")
    ap.add_argument("--max-parallelism", type=int, default=4, help="profile each function up to this")
    ap.add_argument("--largest-budget", type=int, default=12, help="largest budget (instances) measured")
    ap.add_argument("--max-rate", type=float, default=200.0, help="the warm-up's rate (above any capacity)")
    ap.add_argument("--slo-p99", type=float, default=5.0, help="p99 (s) the sustained run must stay under")
    ap.add_argument("--sustain-s", type=float, default=600.0, help="each check's observation (100%% and 115%%)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    ap.add_argument(
        "--baselines-of", default=None, metavar="FILE", help="add the baselines to a saved result (no run) and print it"
    )
    add_broker_option(ap)
    args = ap.parse_args()
    if args.baselines_of:
        saved = json.loads(Path(args.baselines_of).read_text())
        emit(saved | {"baselines": baselines(saved)}, args.out)
        return
    if args.broker == "both":
        ap.error("--broker both: run the plan once per broker (it takes most of an hour)")
    settings = MstSettings(warmup_s=10.0, phases=Phases(cooldown_s=3.0, ramp_s=5.0, observe_s=15.0), step=0.02, bracket=0.1)
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_broker(args.broker) as broker,
        WorkerServer(broker.service_url, data_dir=str(Path(tmp, "worker")), metrics_url=broker.metrics_url) as w,
    ):
        tb = LiveTestbed(images_app(), w.url, broker.service_url, broker.metrics_url, max_rate=args.max_rate)
        try:
            profile = profile_app(tb, args.max_parallelism, settings)
            print(f"profiled in {time.perf_counter() - started:.0f} s ({profile.runs} runs)", flush=True)
            model = build_model(tb, profile, default_budgets(len(tb.functions()), args.largest_budget), settings)
            plan = plan_for_rate(model, args.target_rate, 0.10, Cluster(), started)
            planning_s = time.perf_counter() - started
            print(
                f"planned in {planning_s:.0f} s: {plan.parallelism}, predicted MST {plan.predicted_mst:.1f}/s "
                f"{'(refused: ' + plan.refused + ')' if plan.refused else ''}",
                flush=True,
            )
            checks = {}
            if not plan.refused:
                cfg = TestConfig(dict(plan.parallelism))
                phases = Phases(cooldown_s=5.0, ramp_s=30.0, observe_s=args.sustain_s)
                slo = MstSettings(slo_p99_s=args.slo_p99, phases=phases)
                for label, rate in (("100%", args.target_rate), (f"{OVERLOAD:.0%}", args.target_rate * OVERLOAD)):
                    run = tb.run(rate, cfg, phases)
                    checks[label] = _run_json(run, judge(run, slo))
                    print(f"{label} of the target: {checks[label]}", flush=True)
        finally:
            tb.close()
    out = {
        "app": "images",
        "broker": args.broker,
        "target_rate": args.target_rate,
        "plan": plan.to_json(),
        "measured_points": [
            {
                "budget": p.budget,
                "parallelism": p.parallelism,
                "profile_rate": round(p.profile_rate, 2),
                "predicted": round(model.predict(p.budget), 2),
                "mst": round(p.measured.mst, 2),
                "start_rate": round(p.measured.start_rate, 2),
                "runs": p.measured.runs,
                "testbed_s": round(p.measured.testbed_s, 1),
                "steps": [[round(s.rate, 2), s.passed, s.reason] for s in p.measured.steps],
            }
            for p in model.points
        ],
        "profile": profile.to_json(),
        "profile_runs": profile.runs,
        "planning_wall_s": round(planning_s, 1),
        "checks": checks,
        "sustained": bool(checks) and checks["100%"]["passed"],
        "overload_failed": bool(checks) and not checks[f"{OVERLOAD:.0%}"]["passed"],
        "total_wall_s": round(time.perf_counter() - started, 1),
    }
    emit(out | {"baselines": baselines(out)}, args.out)


if __name__ == "__main__":
    main()
