"""The capacity planner's accuracy table: five simulated apps (linear control, interpreter-bound,
Zipf-keyed, windowed, fan-in), budgets 2-22x the largest measured one held out, against the
baselines 'linear from one instance' and 'DS2 one-shot', over several seeds.

Prints one JSON object and writes it to bench/results/capacity_planning.json.
Usage: python bench/capacity_planning.py [--seeds 0,1,2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pulsar_autoscale.planning.validate import format_table, validate


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "capacity_planning.json"))
    args = p.parse_args()
    started = time.perf_counter()
    runs = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        runs[seed] = validate(seed=seed)
        print(format_table(runs[seed]), file=sys.stderr)
    out = {"seeds": runs, "wall_s": round(time.perf_counter() - started, 2),
           "summary": {s: {k: r[k] for k in ("median_error", "max_error", "passed",
                                              "baselines_worse_on_every_nonlinear_app")} | {"per_app": r["per_app"]}
                       for s, r in runs.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out["summary"] | {"wall_s": out["wall_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
