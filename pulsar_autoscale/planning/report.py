"""The plan as people read it: a terminal summary, plan.json, controller.yaml and a report with plots
(each MST's bisection trace; MST against budget with every fitted family and the measured points)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from pulsar_autoscale.planning.mst import MstResult
from pulsar_autoscale.planning.plan import CapacityModel, Plan, controller_snippet


def plan_text(plan: Plan, model: CapacityModel) -> str:
    b = plan.band
    lines = [f"capacity plan for {plan.target_rate:.1f} msg/s (+{plan.headroom:.0%} headroom)"]
    if plan.refused:
        lines.append(f"  REFUSED: {plan.refused}")
    lines += [
        f"  budget      {plan.budget} instances on {plan.workers} workers ({plan.cpu_cores:.2f} CPU cores at the target)",
        f"  predicted   MST {plan.predicted_mst:.1f} msg/s, band [{b.low:.1f}, {b.high:.1f}] (+/-{b.relative:.1%}), "
        f"{b.extrapolation:.1f}x the largest measured budget",
        f"  model       {plan.model.family}: {plan.model.formula()}, held-out error {plan.model.heldout_error:.1%} "
        f"(max {plan.model.heldout_max:.1%})",
        f"  limited by  {plan.limited_by}",
        *(
            [
                f"  no headroom {plan.bare.budget} instances on {plan.bare.workers} workers cover the target alone "
                f"(predicted MST {plan.bare.predicted_mst:.1f} msg/s, "
                f"{plan.bare.predicted_mst / plan.target_rate - 1:+.1%} over it)"
            ]
            if plan.bare
            else []
        ),
        *(
            [
                f"  per worker  one interpreter lock: each hold {model.profile.workers.handoff:+.1%} per other thread "
                f"(fitted to the probe's one-worker MSTs, rms {model.profile.workers.fit_error:.1%}); "
                f"{model.profile.workers.workers(sum(plan.parallelism.values()))} workers planned"
            ]
            if model.profile.workers
            else []
        ),
        f"  measured    {len(model.points)} budgets {[p.budget for p in model.points]}, {plan.runs} runs, "
        f"{plan.testbed_s / 60:.1f} testbed minutes",
        "  parallelism",
    ]
    width = max(len(f) for f in plan.parallelism)
    for fn, k in plan.parallelism.items():
        lines.append(f"    {fn:<{width}}  {k}" + (f"  ({plan.drains[fn]})" if fn in plan.drains else ""))
    return "\n".join(lines)


def mst_text(res: MstResult) -> str:
    lines = [
        f"MST {res.mst:.1f} msg/s of {dict(res.config.parallelism)} in {res.runs} runs, "
        f"{res.testbed_s / 60:.1f} testbed minutes (start {res.start_rate:.1f}/s)"
        + (" (bounded by the producer)" if res.producer_bound else "")
    ]
    for s in res.steps:
        mark = "pass" if s.passed else ("invalid" if not s.valid else "FAIL")
        lines.append(f"  {s.rate:10.2f}/s  {mark:<7} {s.reason}")
    return "\n".join(lines)


def mst_json(res: MstResult) -> dict:
    return {
        "mst": res.mst,
        "parallelism": dict(res.config.parallelism),
        "start_rate": res.start_rate,
        "runs": res.runs,
        "testbed_s": res.testbed_s,
        "producer_bound": res.producer_bound,
        "steps": [s.__dict__ for s in res.steps],
    }


def plot_bisections(results: Sequence[tuple[str, MstResult]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(len(results), 1)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (title, res) in zip(axes.flat, results):
        xs = np.arange(1, len(res.steps) + 1)
        ax.plot(xs, [s.rate for s in res.steps], color="grey", lw=0.8)
        for x, s in zip(xs, res.steps):
            ax.plot(x, s.rate, "o" if s.passed else "x", color="green" if s.passed else ("orange" if not s.valid else "red"))
        ax.axhline(res.mst, color="blue", ls="--", lw=0.8)
        ax.set_title(f"{title}: MST {res.mst:.0f}/s", fontsize="small")
        ax.set_xlabel("run")
        ax.set_ylabel("injected msg/s")
    for ax in list(axes.flat)[len(results) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_model(model: CapacityModel, path: Path, plan: Plan | None = None, checks: Sequence[tuple[int, float]] = ()) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = np.array([p.budget for p in model.points], dtype=float)
    ys = np.array([p.measured.mst for p in model.points])
    top = max([xs.max() * 4] + [plan.budget * 1.1 if plan else 0] + [b * 1.05 for b, _ in checks])
    grid = np.linspace(xs.min(), top, 300)
    fig, ax = plt.subplots(figsize=(8, 5))
    for c in model.candidates:
        chosen = c.family == model.fit.family
        ax.plot(
            grid,
            c.predict(grid),
            lw=2.2 if chosen else 0.9,
            alpha=1 if chosen else 0.6,
            label=f"{c.family} (held-out {c.heldout_error:.1%})" + (" chosen" if chosen else ""),
        )
    ax.plot(xs, ys, "ko", label="measured MST")
    if checks:
        ax.plot([b for b, _ in checks], [m for _, m in checks], "k^", mfc="none", label="measured (held out)")
    if plan:
        ax.axhline(plan.target_rate * (1 + plan.headroom), color="red", ls=":", lw=1, label="target + headroom")
        ax.errorbar(
            [plan.budget],
            [plan.predicted_mst],
            yerr=[[plan.predicted_mst - plan.band.low], [plan.band.high - plan.predicted_mst]],
            fmt="rs",
            capsize=4,
            label="plan",
        )
    ax.axvline(xs.max(), color="grey", ls="--", lw=0.8)
    ax.set_xlabel("budget (instances)")
    ax.set_ylabel("MST (source msg/s)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_plan(out: Path, plan: Plan, model: CapacityModel, extra: dict | None = None) -> dict[str, str]:
    """plan.json, controller.yaml, plots and report.md under `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    data = {"plan": plan.to_json(), "capacity_model": model.to_json(), "profile": model.profile.to_json(), **(extra or {})}
    (out / "plan.json").write_text(json.dumps(data, indent=2, default=str))
    (out / "controller.yaml").write_text(controller_snippet(plan))
    traces = [(f"budget {p.budget}", p.measured) for p in model.points] + [("all at 1", model.profile.baseline)]
    bis = plot_bisections(traces, out / "bisections.png")
    fit = plot_model(model, out / "model.png", plan)
    report = [
        "# Capacity plan",
        "",
        "```",
        plan_text(plan, model),
        "```",
        "",
        "## MST against budget",
        "",
        f"![model]({fit.name})",
        "",
        "| family | formula | held-out mean | held-out max |",
        "|---|---|---|---|",
    ]
    for c in model.candidates:
        report.append(f"| {c.family} | `{c.formula()}` | {c.heldout_error:.1%} | {c.heldout_max:.1%} |")
    report += [
        "",
        "## Bisections",
        "",
        f"![bisections]({bis.name})",
        "",
        "## controller.yaml",
        "",
        "```yaml",
        controller_snippet(plan).rstrip(),
        "```",
        "",
    ]
    (out / "report.md").write_text("\n".join(report))
    return {
        k: str(out / v)
        for k, v in (
            ("json", "plan.json"),
            ("controller", "controller.yaml"),
            ("report", "report.md"),
            ("model_plot", "model.png"),
            ("bisection_plot", "bisections.png"),
        )
    }
