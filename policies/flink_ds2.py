"""`flink-ds2`: the Flink Kubernetes operator's autoscaler, DS2 plus the operator's guard rails.

Per function, in DS2's topological pass (`ds2.target_rates`): target data rate = the rate it must
sustain + backlog / catch-up duration (the operator's job.autoscaler.catch-up.duration; we take
300 s, the operator's default is 30 min). Utilization = target rate / (k * true processing rate).
Inside the bounds [target - boundary, target + boundary] = [0.4, 1.0] nothing changes; outside,
k = ceil(target rate / (true rate per instance * target utilization 0.7)). A scale-down applies
only when every recommendation of the last `scale_down_interval_s` (job.autoscaler.scale-down.interval;
300 s here, operator default 1 h) was lower, through HPA's `stabilize`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.snapshot import Snapshot

from .base import Policy, Proposal
from .ds2 import target_rates
from .hpa_cpu import History, stabilize


@dataclass(frozen=True)
class FlinkDS2Config:
    target_utilization: float = 0.7
    boundary: float = 0.3
    catch_up_s: float = 300.0
    scale_down_interval_s: float = 300.0


class FlinkDS2Policy(Policy):
    name = "flink-ds2"
    Config = FlinkDS2Config

    def decide(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], state: Any) -> Proposal:
        c = self.config
        histories: dict[str, History] = dict(state or {})
        rates = target_rates(graph, snapshot)
        targets, reasons = {}, {}
        for fn, k in current.items():
            fs = snapshot.functions.get(fn)
            rate = rates.get(fn)
            if rate is None or fs is None or not fs.true_processing_rate:
                targets[fn], reasons[fn] = k, "target or true processing rate unknown: keep"
                continue
            target_rate = rate + (fs.backlog or 0.0) / c.catch_up_s
            utilization = target_rate / (k * fs.true_processing_rate)
            low, high = c.target_utilization - c.boundary, c.target_utilization + c.boundary
            desired = k
            if not low <= utilization <= high:
                desired = max(1, math.ceil(target_rate / (fs.true_processing_rate * c.target_utilization) - 1e-9))
            targets[fn], histories[fn] = stabilize(histories.get(fn, ()), snapshot.time, c.scale_down_interval_s, k, desired)
            reasons[fn] = (
                f"target rate {target_rate:.2f}/s, utilization {utilization:.2f} vs "
                f"[{low:.2f}, {high:.2f}]: desired {desired}, after scale-down interval {targets[fn]}"
            )
        return Proposal(targets, reasons, histories)
