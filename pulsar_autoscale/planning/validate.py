"""The planner checked where it matters: budgets 2-22x the largest it measured, on simulated apps that
do not scale linearly, against two baselines.

- planner: profile, measure small budgets, the model chosen by held-out error, predict;
- linear from one instance: each function's measured capacity at parallelism 1, times k;
- DS2 one-shot: one run with every function at 1, true rates (per busy second) times k.

Each predicts the MST of its own allocation at the budget, and that allocation's MST is then
measured on the testbed with the same bisection: error = |predicted - measured| / measured.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Sequence, cast

import numpy as np

from pulsar_autoscale.planning.allocate import allocate
from pulsar_autoscale.planning.mst import MstSettings, measure_mst
from pulsar_autoscale.planning.plan import CapacityModel, build_model, default_budgets, predict
from pulsar_autoscale.planning.profile import profile_app
from pulsar_autoscale.planning.simbed import APPS, SimTestbed
from pulsar_autoscale.planning.testbed import RunResult, Testbed, TestConfig

RATIOS = (2, 4, 8, 16, 22)
TARGET_MEDIAN, TARGET_MAX = 0.05, 0.08


@dataclass(frozen=True)
class Row:
    app: str
    budget: int
    ratio: float
    predicted: float
    measured: float
    error: float
    model: str
    band_low: float
    band_high: float
    linear_predicted: float
    linear_measured: float
    linear_error: float
    ds2_predicted: float
    ds2_measured: float
    ds2_error: float


def linear_curves(model: CapacityModel) -> dict:
    caps = {n: fp.points[0].capacity for n, fp in model.profile.functions.items()}
    return {n: (lambda k, c=c: c * k) for n, c in caps.items()}


def ds2_curves(model: CapacityModel) -> dict:
    # measure_mst runs at least once: one of them is set
    run = cast(RunResult, model.profile.baseline.last or model.profile.baseline.failing)
    rates = {n: (fm.true_rate or 0.0) for n, fm in run.functions.items()}
    return {n: (lambda k, r=r: r * k) for n, r in rates.items()}


def _measure(testbed: Testbed, parallelism: dict, settings: MstSettings, cache: dict) -> float:
    key = tuple(sorted(parallelism.items()))
    if key not in cache:
        cache[key] = measure_mst(testbed, TestConfig(dict(parallelism)), settings).mst
    return cache[key]


def validate_app(
    name: str,
    seed: int = 0,
    largest: int = 16,
    profile_parallelism: int = 8,
    ratios: Sequence[float] = RATIOS,
    settings: MstSettings = MstSettings(),
) -> tuple[list[Row], CapacityModel]:
    testbed = SimTestbed(APPS[name], seed=seed)
    profile = profile_app(testbed, profile_parallelism, settings)
    budgets = default_budgets(len(testbed.functions()), largest)
    model = build_model(testbed, profile, budgets, settings)
    gains = profile.gains()
    lin, ds2 = linear_curves(model), ds2_curves(model)
    held_out = SimTestbed(APPS[name], seed=seed + 1000)  # fresh noise for the checks
    cache: dict = {}
    rows = []
    for ratio in ratios:
        b = int(round(largest * ratio))
        p = predict(model, b)
        measured = _measure(held_out, p.allocation.parallelism, settings, cache)
        la = allocate(lin, gains, b)
        da = allocate(ds2, gains, b)
        lm = _measure(held_out, la.parallelism, settings, cache)
        dm = _measure(held_out, da.parallelism, settings, cache)
        rows.append(
            Row(
                name,
                b,
                ratio,
                p.mst,
                measured,
                abs(p.mst - measured) / measured,
                model.fit.family,
                p.band.low,
                p.band.high,
                la.rate,
                lm,
                abs(la.rate - lm) / lm,
                da.rate,
                dm,
                abs(da.rate - dm) / dm,
            )
        )
    return rows, model


def validate(
    apps: Sequence[str] = tuple(APPS),
    seed: int = 0,
    largest: int = 16,
    profile_parallelism: int = 8,
    ratios: Sequence[float] = RATIOS,
) -> dict:
    started = time.perf_counter()
    rows: list[Row] = []
    models = {}
    for name in apps:
        r, model = validate_app(name, seed, largest, profile_parallelism, ratios)
        rows += r
        models[name] = {
            "model": model.fit.to_json(),
            "runs": model.runs,
            "testbed_s": model.testbed_s,
            "measured_budgets": [p.budget for p in model.points],
            "candidates": [c.to_json() for c in model.candidates],
        }
    return {
        "rows": [asdict(r) for r in rows],
        "models": models,
        **summarize([asdict(r) for r in rows]),
        "targets": {"median": TARGET_MEDIAN, "max": TARGET_MAX},
        "seed": seed,
        "largest_measured_budget": largest,
        "ratios": list(ratios),
        "wall_s": round(time.perf_counter() - started, 2),
    }


def summarize(rows: Sequence[dict]) -> dict:
    """Median and max error over `rows`, each app's largest error against each baseline's, and whether
    that passes: the targets met and the baselines worse on every app but the linear control."""
    per_app = {}
    for name in dict.fromkeys(r["app"] for r in rows):
        mine = [r for r in rows if r["app"] == name]
        mx = {f"{k}max_error": max(r[f"{k}error"] for r in mine) for k in ("", "linear_", "ds2_")}
        per_app[name] = mx | {
            "baselines_worse": mx["linear_max_error"] > mx["max_error"] and mx["ds2_max_error"] > mx["max_error"]
        }
    errors = [r["error"] for r in rows]
    median, mx_all = float(np.median(errors)), float(max(errors))
    nonlinear_ok = all(v["baselines_worse"] for k, v in per_app.items() if k != "linear")
    return {
        "per_app": per_app,
        "median_error": median,
        "max_error": mx_all,
        "passed": median <= TARGET_MEDIAN and mx_all <= TARGET_MAX and nonlinear_ok,
        "baselines_worse_on_every_nonlinear_app": nonlinear_ok,
    }


def pooled(results: Sequence[dict]) -> dict:
    """The accuracy table over several seeds as one: every seed's held-out budgets together. Per seed, a
    baseline can come within the planner's error on an app that is nearly linear at the held-out budgets;
    the pooled table says whether it does over all of them."""
    return summarize([row for r in results for row in r["rows"]]) | {"seeds": [r["seed"] for r in results]}


def format_pooled(result: dict) -> str:
    lines = [f"over seeds {result['seeds']}: {'app':<12}{'max err':>9}{'linear':>9}{'ds2':>9}"]
    for name, v in result["per_app"].items():
        lines.append(
            f"{'':<{len(str(result['seeds'])) + 12}}{name:<12}{v['max_error']:>9.1%}"
            f"{v['linear_max_error']:>9.1%}{v['ds2_max_error']:>9.1%}"
            + ("" if v["baselines_worse"] or name == "linear" else "  (a baseline within the planner's error)")
        )
    lines.append(
        f"median error {result['median_error']:.2%}, max {result['max_error']:.2%}; baselines worse on every "
        f"non-linear app: {result['baselines_worse_on_every_nonlinear_app']}; "
        f"{'PASSED' if result['passed'] else 'FAILED'}"
    )
    return "\n".join(lines)


def format_table(result: dict) -> str:
    head = (
        f"{'app':<12}{'budget':>7}{'x':>5}{'predicted':>11}{'measured':>10}{'error':>8}  {'model':<8}"
        f"{'linear err':>11}{'ds2 err':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        lines.append(
            f"{r['app']:<12}{r['budget']:>7}{r['ratio']:>5g}{r['predicted']:>11.1f}{r['measured']:>10.1f}"
            f"{r['error']:>8.1%}  {r['model']:<8}{r['linear_error']:>11.1%}{r['ds2_error']:>9.1%}"
        )
    lines.append(
        f"median error {result['median_error']:.2%} (target <= {TARGET_MEDIAN:.0%}), max "
        f"{result['max_error']:.2%} (target <= {TARGET_MAX:.0%}); baselines worse on every non-linear "
        f"app: {result['baselines_worse_on_every_nonlinear_app']}; "
        f"{'PASSED' if result['passed'] else 'FAILED'} in {result['wall_s']} s"
    )
    return "\n".join(lines)
