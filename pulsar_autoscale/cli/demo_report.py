"""What a demo run records (a Sample per interval; the Recorder: every output and its response time) and what
the end of the run makes of it: the summary (response times overall and per path, the share over the SLO,
average instances, scaling actions from the controller's decision log), the report directory's summary.json,
timeseries.csv and run.png, and the summary printed.
"""

from __future__ import annotations

import csv
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pulsar_autoscale import image_app
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.image_app import NS, STAGES

SINKS = {f"persistent://{NS}/{topic}": label for topic, label in image_app.PATHS.items()}


@dataclass
class Sample:
    t: float
    target_rate: float
    instances: dict[str, int]
    backlog: dict[str, float | None]
    rt_p50: float | None
    rt_p99: float | None
    per_worker: dict[str, dict[str, int]] = field(default_factory=dict)  # --workers N: function -> worker -> running


@dataclass
class Recorder:
    """Everything measured during the run; response time = sink receive time - source event time."""

    produced: int = 0
    received: dict[str, dict[bytes, int]] = field(default_factory=lambda: {t: {} for t in SINKS})
    rts: list[tuple[float, float, str]] = field(default_factory=list)  # (time, rt_s, sink topic)
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def window_rts(self, since: float) -> list[float]:
        with self.lock:
            return [rt for t, rt, _ in self.rts if t >= since]


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(rec: Recorder, config: ControllerConfig, rates, interval, t0, slo: float = 1.0) -> dict:
    rts = [rt for _, rt, _ in rec.rts]
    per_path = {}
    for topic, label in SINKS.items():
        path_rts = [rt for _, rt, t in rec.rts if t == topic]
        per_path[label] = {
            "mean_rt_s": _r(np.mean(path_rts)) if path_rts else None,
            "p95_rt_s": _r(percentile(path_rts, 95)),
            "p99_rt_s": _r(percentile(path_rts, 99)),
            "received": len(rec.received.get(topic, {})),
        }
    dt = [b.t - a.t for a, b in zip(rec.samples, rec.samples[1:])]
    inst_seconds = {s.name: sum(a.instances[s.name] * d for a, d in zip(rec.samples, dt)) for s in STAGES}
    total_time = sum(dt) or 1.0
    return {
        "policy": config.policy,
        "rates_msg_s": rates,
        "interval_s": interval,
        "period_s": config.period_s,
        "fast": config.fast,
        "produced": rec.produced,
        "lost": sum(max(rec.produced - len(seen), 0) for seen in rec.received.values()),
        "duplicates": sum(c - 1 for seen in rec.received.values() for c in seen.values()),
        "mean_rt_s": _r(np.mean(rts)) if rts else None,
        "p95_rt_s": _r(percentile(rts, 95)),
        "p99_rt_s": _r(percentile(rts, 99)),
        "max_rt_s": _r(max(rts)) if rts else None,
        "slo_s": slo,
        "slo_violation_share": _r(sum(1 for r in rts if r > slo) / len(rts)) if rts else None,
        "paths": per_path,
        "avg_instances": {k: _r(v / total_time) for k, v in inst_seconds.items()},
        "avg_instances_total": _r(sum(inst_seconds.values()) / total_time),
        "instance_seconds": _r(sum(inst_seconds.values())),
    }


def _r(x):
    return None if x is None else round(float(x), 4)


def write_report(report: Path, rec: Recorder, summary: dict) -> None:
    decisions = (
        [json.loads(line) for line in (report / "decisions.jsonl").read_text().splitlines()]
        if (report / "decisions.jsonl").exists()
        else []
    )
    summary["scaling_actions"] = sum(1 for d in decisions if d.get("applied"))  # from the controller's own log
    summary["fast_actions"] = sum(1 for d in decisions if d.get("applied") and d.get("kind") == "fast")
    load_s = summary["interval_s"] * len(summary["rates_msg_s"])
    summary["scaling_actions_per_hour"] = round(summary["scaling_actions"] * 3600 / load_s, 1)
    (report / "summary.json").write_text(json.dumps(summary, indent=2))
    with (report / "timeseries.csv").open("w", newline="") as f:
        w = csv.writer(f)
        names = [s.name for s in STAGES]
        w.writerow(
            ["t_s", "target_rate"]
            + [f"instances_{n}" for n in names]
            + [f"backlog_{n}" for n in names]
            + ["rt_p50_s", "rt_p99_s"]
        )
        t0 = rec.samples[0].t if rec.samples else 0
        for s in rec.samples:
            w.writerow(
                [round(s.t - t0, 2), s.target_rate]
                + [s.instances[n] for n in names]
                + [s.backlog[n] for n in names]
                + [s.rt_p50, s.rt_p99]
            )
    plot(report, rec, summary)


def plot(report: Path, rec: Recorder, summary: dict) -> None:
    """Three stacked panels in the style of the paper's Fig. 5-7: arrival rate, instances, response time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rec.samples:
        return
    t0 = rec.samples[0].t
    t = [s.t - t0 for s in rec.samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].step(t, [s.target_rate for s in rec.samples], where="post")
    axes[0].set_ylabel("arrival rate (msg/s)")
    for st in STAGES:
        axes[1].step(t, [s.instances[st.name] for s in rec.samples], where="post", label=st.name)
    axes[1].set_ylabel("instances")
    axes[1].legend(loc="upper left", fontsize=8)
    for topic, label in SINKS.items():
        pts = [(ts - t0, rt) for ts, rt, tp in rec.rts if tp == topic]
        if pts:
            axes[2].plot([p[0] for p in pts], [p[1] for p in pts], ".", markersize=2, label=label)
    axes[2].axhline(summary["slo_s"], color="red", linestyle="--", linewidth=0.8, label=f"SLO {summary['slo_s']:g} s")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("response time (s)")
    axes[2].set_xlabel("time (s)")
    axes[2].legend(loc="upper left", fontsize=8)
    fig.suptitle(
        f"policy {summary['policy']}: mean RT {summary['mean_rt_s']}s, p99 {summary['p99_rt_s']}s, "
        f"avg instances {summary['avg_instances_total']}"
    )
    fig.tight_layout()
    fig.savefig(report / "run.png", dpi=100)
    plt.close(fig)


def slo_line(summary: dict) -> str:
    """The run against its SLO, and what the scaling cost, in one line."""
    share = summary["slo_violation_share"]
    p99 = summary["p99_rt_s"]
    return (
        f"SLO {summary['slo_s']:g} s: p99 {'-' if p99 is None else f'{p99:.2f} s'} against it, "
        f"{'-' if share is None else f'{share:.1%}'} of responses over it (slo_violation_share "
        f"{share}); {summary['scaling_actions']} scaling actions ({summary['scaling_actions_per_hour']:g}/h, "
        f"{summary['fast_actions']} fast)"
    )


def print_summary(summary: dict, report: Path) -> None:
    print("\n=== summary ===")
    print(json.dumps({k: v for k, v in summary.items() if k != "paths"}, indent=2))
    for label, figs in summary["paths"].items():
        print(f"path {label}: {figs}")
    print(slo_line(summary))
    print(f"report: {report}/summary.json, timeseries.csv, decisions.jsonl, run.png")
