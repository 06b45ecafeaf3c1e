"""Threshold policy (paper Sec. 4.1) on the backlog Q_f of each function's input:

    [0, T_in]        low load   -> scale in by one instance (never below one)
    (T_in, T_out]    in range   -> keep
    (T_out, inf)     overload   -> scale out by one instance

The paper's other exception, no scale-out at the maximum parallelism, is the Plan step's bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.snapshot import Snapshot

from .base import Policy, Proposal


@dataclass(frozen=True)
class ThresholdConfig:
    t_in: float = 50.0  # messages: at or below -> scale in
    t_out: float = 150.0  # messages: above -> scale out
    step: int = 1  # instances per decision (paper: 1)


class ThresholdPolicy(Policy):
    name = "threshold"
    Config = ThresholdConfig

    def decide(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], state: Any) -> Proposal:
        c = self.config
        targets, reasons = {}, {}
        for fn, k in current.items():
            fs = snapshot.functions.get(fn)
            q = fs.backlog if fs is not None else None
            if q is None:
                targets[fn], reasons[fn] = k, "backlog unknown: keep"
            elif q > c.t_out:
                targets[fn], reasons[fn] = k + c.step, f"backlog {q:.0f} > T_out {c.t_out:g}: scale out"
            elif q <= c.t_in and k > 1:
                targets[fn], reasons[fn] = max(k - c.step, 1), f"backlog {q:.0f} <= T_in {c.t_in:g}: scale in"
            else:
                targets[fn], reasons[fn] = k, f"backlog {q:.0f}, T_in {c.t_in:g}, T_out {c.t_out:g}: keep"
        return Proposal(targets, reasons, state)
