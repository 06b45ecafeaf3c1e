"""Every policy on paper-image under paper, sine and burst, 3 seeds, restart-free and stock (3 s restart).

Prints one JSON object (every run, and means per policy/workload/mode), writes a PNG of one run
per policy and workload into --out, and the markdown table into bench/results/sim_policies.md.
Runs on at most 2 worker processes. Usage: python bench/sim_policies.py [--out reports/sim]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from pulsar_autoscale.sim.apps import load_app
from pulsar_autoscale.sim.cli import build_autoscaler, plot
from pulsar_autoscale.sim.engine import SimConfig, simulate
from pulsar_autoscale.sim.workloads import load_workload

POLICIES = {  # label -> (policy, params)
    "threshold": ("threshold", {}),
    "queueing-function": ("queueing", {"level": "function"}),
    "queueing-path": ("queueing", {"level": "path"}),
    "ds2": ("ds2", {}),
    "keda": ("keda", {}),
    "hpa-cpu": ("hpa-cpu", {}),
    "flink-ds2": ("flink-ds2", {}),
    "predictive": ("predictive", {}),
}
WORKLOADS = ("paper", "sine", "burst")
SEEDS = (0, 1, 2)
RESTART_S = 3.0
APP = "paper-image"
PAPER = {  # the paper's own figures (Sec. 5.2), paper workload, restart-free runtime
    "threshold": "23 s mean, 74 s peak, 3.5 instances",
    "queueing-path": "1.03 s mean, < 3 s peak, ~5 instances",
    "ds2": "2.7 s mean, 26 s peaks, 4.5 instances",
}
METRICS = (
    "mean_rt_s",
    "p99_rt_s",
    "max_rt_s",
    "slo_violation_share",
    "avg_instances",
    "instance_seconds",
    "efficiency",
    "scaling_actions",
    "lost",
)


def one(job: tuple) -> dict:
    label, workload, seed, restart_s, plot_dir = job
    policy, params = POLICIES[label]
    started = time.perf_counter()
    result = simulate(
        load_app(APP), load_workload(workload), build_autoscaler(policy, params, 15), SimConfig(seed=seed, restart_s=restart_s)
    )
    row = {
        "policy": label,
        "workload": workload,
        "seed": seed,
        "restart_s": restart_s,
        **result.summary(),
        "wall_s": round(time.perf_counter() - started, 3),
    }
    if plot_dir:
        row["plot"] = str(plot(result, Path(plot_dir), f"{APP} {workload} {label}"))
    return row


def summarize(rows: list[dict]) -> dict:
    out: dict = {}
    for r in rows:
        out.setdefault((r["workload"], r["restart_s"], r["policy"]), []).append(r)
    return {k: {m: float(np.mean([r[m] for r in rs])) for m in METRICS} for k, rs in out.items()}


def dominates(a: dict, b: dict, slo_s: float = 2.0) -> bool:
    """The dominance rule: p99 no worse at no more instance-seconds, or the SLO met where b misses it."""
    cheaper_and_better = a["p99_rt_s"] <= b["p99_rt_s"] and a["instance_seconds"] <= b["instance_seconds"]
    return cheaper_and_better or (a["p99_rt_s"] <= slo_s < b["p99_rt_s"])


def markdown(means: dict, command: str, wall: dict) -> str:
    lines = [
        "# Policies in the simulator: paper-image, 3 seeds each",
        "",
        f"Produced by `{command}` ({wall['total_s']:.0f} s wall on 2 workers; one run of the one-hour "
        f"`paper` workload at max parallelism 15 takes {wall['paper_run_s']:.2f} s on average).",
        "",
        "Means over seeds 0, 1, 2. Response time = last sink completion - source publish (the recognition "
        "path). efficiency = sum over periods of max(1, ceil(lambda/mu)) per function x period / "
        "instance-seconds (> 1: fewer instances than the arrival rate needs, a backlog grows). "
        "Period 30 s, instance start 1 s, max parallelism 15.",
        "",
    ]
    for restart in (0.0, RESTART_S):
        lines += [
            f"## {'restart-free (our runtime)' if restart == 0 else f'stock Pulsar: every update restarts all instances ({RESTART_S:g} s)'}",
            "",
        ]
        lines += [
            "| workload | policy | mean s | p99 s | max s | >1 s share | avg inst | inst-s | efficiency | actions | lost | paper |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for w in WORKLOADS:
            for label in POLICIES:
                m = means[(w, restart, label)]
                paper = PAPER.get(label, "") if w == "paper" and restart == 0 else ""
                lines.append(
                    f"| {w} | {label} | {m['mean_rt_s']:.2f} | {m['p99_rt_s']:.2f} | {m['max_rt_s']:.1f} | "
                    f"{m['slo_violation_share']:.3f} | {m['avg_instances']:.2f} | {m['instance_seconds']:.0f} | "
                    f"{m['efficiency']:.2f} | {m['scaling_actions']:.0f} | {m['lost']:.0f} | {paper} |"
                )
        lines.append("")
    lines += [
        "## What the restart costs (stock minus restart-free, mean over seeds)",
        "",
        "| workload | policy | extra mean s | extra p99 s | extra inst-s |",
        "|---|---|---|---|---|",
    ]
    for w in WORKLOADS:
        for label in POLICIES:
            a, b = means[(w, 0.0, label)], means[(w, RESTART_S, label)]
            lines.append(
                f"| {w} | {label} | {b['mean_rt_s'] - a['mean_rt_s']:+.2f} | {b['p99_rt_s'] - a['p99_rt_s']:+.2f} "
                f"| {b['instance_seconds'] - a['instance_seconds']:+.0f} |"
            )
    lines += [
        "",
        "## Does predictive dominate? (p99 no worse at no more instance-seconds, or p99 <= 2 s where the "
        "other misses it; restart-free)",
        "",
        "| workload | " + " | ".join(p for p in POLICIES if p != "predictive") + " |",
        "|---|" + "---|" * (len(POLICIES) - 1),
    ]
    for w in WORKLOADS:
        pred = means[(w, 0.0, "predictive")]
        lines.append(
            f"| {w} | "
            + " | ".join("yes" if dominates(pred, means[(w, 0.0, p)]) else "no" for p in POLICIES if p != "predictive")
            + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="reports/sim", help="directory for the PNG plots")
    ap.add_argument("--table", default="bench/results/sim_policies.md")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    jobs = [
        (label, w, seed, restart, args.out if seed == 0 and restart == 0 else None)
        for restart in (0.0, RESTART_S)
        for w in WORKLOADS
        for label in POLICIES
        for seed in SEEDS
    ]
    started = time.perf_counter()
    with Pool(min(max(args.workers, 1), 2)) as pool:
        rows = pool.map(one, jobs, chunksize=1)
    total = time.perf_counter() - started
    means = summarize(rows)
    paper_runs = [r["wall_s"] for r in rows if r["workload"] == "paper" and "plot" not in r]
    wall = {"total_s": total, "paper_run_s": float(np.mean(paper_runs))}
    command = "python bench/sim_policies.py " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.table).parent.mkdir(parents=True, exist_ok=True)
    Path(args.table).write_text(markdown(means, command.strip(), wall))
    json.dump(
        {
            "runs": rows,
            "wall": wall,
            "means": [{"workload": w, "restart_s": r, "policy": p, **m} for (w, r, p), m in means.items()],
        },
        sys.stdout,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
