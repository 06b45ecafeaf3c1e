"""`keda`: KEDA's Pulsar scaler, an HPA on the subscription backlog (msgBacklog).

desired = ceil(msgBacklog / msgBacklogThreshold) (threshold 10: an AverageValue target, i.e.
metric / (threshold * current) against HPA's 10% tolerance); the metric is polled every
`polling_s` (KEDA's pollingInterval, 30 s) and between polls the last recommendation stands;
scale-down goes through HPA's 300 s stabilization window. KEDA's cooldownPeriod (300 s) only
delays scaling to zero, which a function (at least one instance) never does, so HPA's window
is the 300 s that applies. Polling uses snapshot.time and keeps its timer in the state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.snapshot import Snapshot

from .base import Policy, Proposal
from .hpa_cpu import History, hpa_desired, stabilize


@dataclass(frozen=True)
class KedaConfig:
    msg_backlog_threshold: float = 10.0
    polling_s: float = 30.0
    stabilization_s: float = 300.0
    tolerance: float = 0.1


@dataclass(frozen=True)
class KedaState:
    last_poll: float | None = None
    desired: Mapping[str, int] = field(default_factory=dict)
    histories: Mapping[str, History] = field(default_factory=dict)


class KedaPolicy(Policy):
    name = "keda"
    Config = KedaConfig

    def decide(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], state: Any) -> Proposal:
        c = self.config
        state = state or KedaState()
        polled = state.last_poll is None or snapshot.time - state.last_poll >= c.polling_s - 1e-9
        desired = dict(state.desired)
        histories = dict(state.histories)
        targets, reasons = {}, {}
        for fn, k in current.items():
            fs = snapshot.functions.get(fn)
            if polled and fs is not None and fs.backlog is not None:
                desired[fn] = hpa_desired(k, fs.backlog / (c.msg_backlog_threshold * k), c.tolerance)
            if fn not in desired:
                targets[fn], reasons[fn] = k, "backlog unknown: keep"
                continue
            targets[fn], histories[fn] = stabilize(histories.get(fn, ()), snapshot.time, c.stabilization_s, k, desired[fn])
            backlog = "?" if fs is None or fs.backlog is None else f"{fs.backlog:.0f}"
            reasons[fn] = (
                f"backlog {backlog} / threshold {c.msg_backlog_threshold:g}: desired {desired[fn]}, "
                f"stabilized {targets[fn]}{'' if polled else ' (between polls)'}"
            )
        return Proposal(targets, reasons, KedaState(snapshot.time if polled else state.last_poll, desired, histories))
