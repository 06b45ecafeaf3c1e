"""Time of one MAPE iteration without I/O (graph build, snapshot construction, policy, Plan step)
for synthetic layered DAGs of 50, 500 and 5,000 functions, for every built-in policy.

    .venv/bin/python bench/controller_scale.py [--quick] [--sizes 50,500,5000] [--repeats 7]

The DAG has DEPTH layers (an application is wide rather than deep: its paths must be able to meet
the queueing policy's R_max of 1 s); each function reads the output of one or two functions of
the layer before, so there is fan-out and fan-in. Snapshots are built from two counter readings
with `window_snapshot`, as the Monitor and the simulator do. Prints one JSON object with the
median milliseconds per size and policy; the target is under 200 ms at 500 functions.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from pulsar_autoscale.controller.autoscaler import Autoscaler
from pulsar_autoscale.controller.planner import PlanConfig, Planner
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies import available_policies, load_policy
from pulsar_autoscale.snapshot import FunctionCounters, Snapshot, window_snapshot

DEPTH = 10
WINDOW_S = 30.0
TARGET_MS_AT_500 = 200.0


def synthetic_app(n: int, rng: random.Random) -> tuple[list[FunctionNode], dict[str, tuple[FunctionCounters, ...]]]:
    """Nodes, and per function two counter readings WINDOW_S apart plus its backlog."""
    width = max(1, n // DEPTH)
    nodes, readings = [], {}
    for i in range(n):
        layer, pos = divmod(i, width)
        if layer == 0:
            inputs = ("persistent://bench/app/source",)
        else:
            ups = sorted({(layer - 1) * width + pos, (layer - 1) * width + rng.randrange(width)})
            inputs = tuple(f"persistent://bench/app/t{u}" for u in ups)
        name = f"bench/app/f{i}"
        nodes.append(FunctionNode(name, inputs, f"persistent://bench/app/t{i}"))
        lam, service_s = rng.uniform(1, 60), rng.uniform(0.02, 0.2)
        done = lam * WINDOW_S
        prev = FunctionCounters(time=0.0, arrived=0.0)
        cur = FunctionCounters(
            time=WINDOW_S,
            arrived=done,
            received=done,
            processed=done,
            outputs=done,
            busy_s=done * service_s,
            busy_sq_s2=done * service_s**2 * 1.5,
            interarrival_n=done,
            interarrival_s=WINDOW_S,
            interarrival_sq_s2=WINDOW_S**2 / done * 2,
        )
        readings[name] = (prev, cur, rng.uniform(0, 500))
    return nodes, readings


def one_iteration(autoscaler: Autoscaler, nodes, readings, current) -> tuple[float, str | None]:
    start = time.perf_counter()
    graph = AppGraph.build(nodes)
    functions = {
        name: window_snapshot(name, current[name], prev, cur, backlog) for name, (prev, cur, backlog) in readings.items()
    }
    result = autoscaler.step(graph, Snapshot(WINDOW_S, WINDOW_S, functions), current, now=WINDOW_S)
    return (time.perf_counter() - start) * 1000, result.error


def policies() -> list[tuple[str, dict]]:
    """Every registered policy with default parameters, and queueing at both levels."""
    out = []
    for name in available_policies():
        out.append((name, {}))
        if name == "queueing":
            out.append((name, {"level": "path"}))
    return out


def run(sizes: list[int], repeats: int) -> dict:
    rows = []
    for n in sizes:
        nodes, readings = synthetic_app(n, random.Random(n))
        current = {name: 2 for name in readings}
        for name, params in policies():
            label = name + "".join(f":{v}" for v in params.values())
            try:
                policy = load_policy(name, params)
            except ConfigError as exc:  # a plugin still being written must not stop the bench
                rows.append({"functions": n, "policy": label, "error": str(exc)})
                continue
            samples, error = [], None
            for _ in range(repeats):
                ms, error = one_iteration(Autoscaler(policy, Planner(PlanConfig(cooldown_s=60))), nodes, readings, current)
                samples.append(ms)
            rows.append(
                {
                    "functions": n,
                    "policy": label,
                    "median_ms": round(statistics.median(samples), 2),
                    "max_ms": round(max(samples), 2),
                    "repeats": repeats,
                    "error": error,
                }
            )
    baseline = {r["functions"]: r["median_ms"] for r in rows if r["policy"] == "threshold" and "median_ms" in r}
    for r in rows:  # threshold does least work: its time is mostly graph, snapshot and Plan step
        if "median_ms" in r and r["functions"] in baseline:
            r["x_threshold"] = round(r["median_ms"] / baseline[r["functions"]], 2)
    at_500 = [r for r in rows if r["functions"] == 500 and "median_ms" in r]
    return {
        "bench": "controller_scale",
        "depth": DEPTH,
        "target_ms_at_500": TARGET_MS_AT_500,
        "rows": rows,
        "slowest_ms_at_500": max((r["median_ms"] for r in at_500), default=None),
        "target_met": bool(at_500) and all(r["median_ms"] < TARGET_MS_AT_500 and not r["error"] for r in at_500),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="50,500,5000")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="one repeat per size and policy")
    args = ap.parse_args()
    result = run([int(n) for n in args.sizes.split(",")], 1 if args.quick else args.repeats)
    print(json.dumps(result, indent=2))
    raise SystemExit(0 if result["target_met"] else 1)


if __name__ == "__main__":
    main()
