"""`hpa-cpu`: Function Mesh's default, the Kubernetes HPA on CPU, here the busy share of instances.

HPA's algorithm (kubernetes.io, "Horizontal Pod Autoscaling"): desired = ceil(current * metric /
target), skipped while metric / target is within the 10% tolerance; a scale-down goes only to
the highest recommendation of the last 300 s (scale-down stabilization); scale-up is not
stabilized. Busy share is capped at 100%, so one period can grow a saturated function by at
most 1 / target = 1.25x: that is why HPA on CPU is slow to catch a step.
The helpers `hpa_desired` and `stabilize` are HPA's rules; `keda` (an HPA on an external
metric) and `flink-ds2` reuse them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.snapshot import Snapshot

from .base import Policy, Proposal

History = tuple[tuple[float, int], ...]  # (snapshot time, recommendation)


@dataclass(frozen=True)
class HpaCpuConfig:
    target_utilization: float = 0.8
    tolerance: float = 0.1
    stabilization_s: float = 300.0


def hpa_desired(current: int, ratio: float, tolerance: float) -> int:
    """HPA: ceil(current * metric / target), unless the ratio is within the tolerance."""
    if abs(ratio - 1.0) <= tolerance:
        return current
    return max(1, math.ceil(current * ratio - 1e-9))


def stabilize(history: History, now: float, window_s: float, current: int, desired: int) -> tuple[int, History]:
    """Scale-down stabilization: go down only to the highest recommendation within the window.

    An empty history (the first period) counts as the current parallelism, so a scale-down
    waits a full window from the start as well.
    """
    history = tuple((t, r) for t, r in history or ((now, current),) if now - t < window_s) + ((now, desired),)
    if desired < current:
        return min(current, max(r for _, r in history)), history
    return desired, history


class HpaCpuPolicy(Policy):
    name = "hpa-cpu"
    Config = HpaCpuConfig

    def decide(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], state: Any) -> Proposal:
        c = self.config
        histories: dict[str, History] = dict(state or {})
        targets, reasons = {}, {}
        for fn, k in current.items():
            fs = snapshot.functions.get(fn)
            if fs is None or fs.utilization is None:
                targets[fn], reasons[fn] = k, "utilization unknown: keep"
                continue
            desired = hpa_desired(k, fs.utilization / c.target_utilization, c.tolerance)
            targets[fn], histories[fn] = stabilize(histories.get(fn, ()), snapshot.time, c.stabilization_s, k, desired)
            reasons[fn] = (
                f"busy {fs.utilization:.0%} vs target {c.target_utilization:.0%}: desired {desired}, stabilized {targets[fn]}"
            )
        return Proposal(targets, reasons, histories)
