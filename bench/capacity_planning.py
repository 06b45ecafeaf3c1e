"""The capacity planner's accuracy table: five simulated apps (linear control, interpreter-bound,
Zipf-keyed, windowed, fan-in), budgets 2-22x the largest measured one held out, against the
baselines 'linear from one instance' and 'DS2 one-shot', over several seeds; and the sustain check
(pulsar_autoscale.planning.sustain): a plan made on the small testbed for 2x and 3x what it sustains,
run in simulation for 10 minutes at 100% (sustained, p99 under the SLO) and 115% (falls behind),
its instances against the exhaustive minimum.

Prints one JSON object and writes it to bench/results/capacity_planning.json.
Usage: python bench/capacity_planning.py [--seeds 0,1,2,3,4] [--apps linear,interpreter,...] [--slo-p99 2] [--no-sustain]
       [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pulsar_autoscale.planning.simbed import APPS
from pulsar_autoscale.planning.sustain import FACTORS, SLO_P99_S, format_sustain, sustain
from pulsar_autoscale.planning.validate import format_pooled, format_table, pooled, validate


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--apps", default=",".join(APPS), help="simulated apps, comma-separated (default: all five)")
    p.add_argument("--slo-p99", type=float, default=SLO_P99_S, help="the sustain check's p99 SLO, seconds")
    p.add_argument("--factors", default=",".join(f"{f:g}" for f in FACTORS), help="targets, x the small testbed's MST")
    p.add_argument("--no-sustain", action="store_true", help="only the accuracy table")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "capacity_planning.json"))
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    apps = [a for a in args.apps.split(",") if a]
    unknown = sorted(set(apps) - set(APPS))
    if unknown:
        p.error(f"--apps: unknown {', '.join(unknown)}; the simulated apps are {', '.join(APPS)}")
    started = time.perf_counter()
    runs = {}
    for seed in seeds:
        runs[seed] = validate(apps, seed=seed)
        print(format_table(runs[seed]), file=sys.stderr)
    out = {
        "seeds": runs,
        "summary": {
            s: {k: r[k] for k in ("median_error", "max_error", "passed", "baselines_worse_on_every_nonlinear_app")}
            | {"per_app": r["per_app"]}
            for s, r in runs.items()
        },
    }
    out["summary"]["pooled"] = pooled(list(runs.values()))
    print(format_pooled(out["summary"]["pooled"]), file=sys.stderr)
    if not args.no_sustain:
        sus = sustain(apps, seeds=seeds, factors=[float(f) for f in args.factors.split(",")], slo_p99_s=args.slo_p99)
        print(format_sustain(sus), file=sys.stderr)
        out["sustain"] = sus
        out["summary"]["sustain_passed"] = sus["passed"]
    out["wall_s"] = round(time.perf_counter() - started, 2)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(json.dumps(out["summary"] | {"wall_s": out["wall_s"]}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
