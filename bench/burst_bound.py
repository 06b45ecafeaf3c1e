"""Is the `burst` target (p99 at most half of queueing's) reachable? A bound, by simulation.

Runs queueing, predictive and `react-max` (bench/policies/react_max.py: straight to the cap on the
first period that sees the burst, the fastest answer a policy can give, with 0, 1 or 2 instances
of capacity bought in advance on the bottleneck) on paper-image under `burst`, at the paper's 30 s
period and at 10 s, 3 seeds each: what p99 each amount of instance-seconds buys. Prints one JSON object.
Usage: python bench/burst_bound.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from pulsar_autoscale.sim.apps import load_app
from pulsar_autoscale.sim.cli import build_autoscaler
from pulsar_autoscale.sim.engine import SimConfig, simulate
from pulsar_autoscale.sim.workloads import load_workload

REACT_MAX = str(Path(__file__).resolve().parent / "policies" / "react_max.py")
POLICIES = {
    "queueing": ("queueing", {}),
    "predictive": ("predictive", {}),  # label -> (policy, params)
    "react-max": (REACT_MAX, {}),
    "react-max +1 spare": (REACT_MAX, {"spare": 1}),
    "react-max +2 spare": (REACT_MAX, {"spare": 2}),
}
PERIODS = (30.0, 10.0)
SEEDS = (0, 1, 2)
METRICS = ("mean_rt_s", "p99_rt_s", "avg_instances", "instance_seconds")


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # --help, and no stray options
    started = time.perf_counter()
    out = []
    for period in PERIODS:
        means = {}
        for label, (policy, params) in POLICIES.items():
            runs = [
                simulate(
                    load_app("paper-image"),
                    load_workload("burst"),
                    build_autoscaler(policy, params, 15),
                    SimConfig(period_s=period, seed=seed),
                ).summary()
                for seed in SEEDS
            ]
            means[label] = {m: round(float(np.mean([r[m] for r in runs])), 3) for m in METRICS}
            print(f"period {period:g} s {label}: {means[label]}", file=sys.stderr)
        q = means["queueing"]
        out.append(
            {
                "period_s": period,
                "means": means,
                "target_p99_s": round(q["p99_rt_s"] / 2, 3),
                "target_max_instance_seconds": round(1.2 * q["instance_seconds"], 1),
            }
        )
    json.dump(
        {
            "app": "paper-image",
            "workload": "burst",
            "seeds": list(SEEDS),
            "periods": out,
            "wall_s": round(time.perf_counter() - started, 1),
        },
        sys.stdout,
        indent=1,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
