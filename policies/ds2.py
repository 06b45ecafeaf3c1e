"""DS2 (Kalavri et al., OSDI'18; paper Sec. 4.3): size each function for the rate its upstream
would send if it kept up, from *true* rates measured per unit of useful (busy) time.

One pass over the DAG in topological order. The target input rate of a function is
  - fed only by source topics: the observed arrival rate (nothing upstream can be lagging);
  - fed by functions: the sum over its upstream functions of their target input rate times
    their selectivity (true output rate / true processing rate);
  - fed by both: that sum plus the source topics' share of the observed arrivals, i.e. the
    arrival rate minus what the upstream functions were observed to emit.
Parallelism = ceil(target input rate / (true processing rate per instance * target_utilization)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot

from .base import Policy, Proposal


@dataclass(frozen=True)
class DS2Config:
    target_utilization: float = 1.0  # DS2 sizes for exactly the true rate; < 1 adds headroom


def selectivity(fs: FunctionSnapshot) -> float:
    """Outputs per processed message, from true rates (observed rates if the true ones are missing).
    With neither (nothing processed in the window) assume 1: one output per input, the common
    case for Pulsar functions, rather than letting one idle window blind everything downstream."""
    if fs.true_output_rate is not None and fs.true_processing_rate:
        return fs.true_output_rate / fs.true_processing_rate
    if fs.output_rate is not None and fs.processing_rate:
        return fs.output_rate / fs.processing_rate
    return 1.0


def target_rates(graph: AppGraph, snapshot: Snapshot) -> dict[str, float | None]:
    """Input rate each function must sustain if everything upstream keeps up; None if unknown."""
    rates: dict[str, float | None] = {}
    for fn in graph.topological_order():
        fs = snapshot.functions.get(fn)
        observed = fs.arrival_rate if fs is not None else None
        ups = graph.upstream(fn)
        if not ups:
            rates[fn] = observed
            continue
        sent = [_sent(rates[u], snapshot.functions.get(u)) for u in ups]
        if any(r is None for r in sent):
            rates[fn] = None
        elif graph.is_source(fn):
            emitted = [snapshot.functions[u].output_rate if u in snapshot.functions else None for u in ups]
            if observed is None or any(e is None for e in emitted):
                rates[fn] = None
            else:
                rates[fn] = sum(r for r in sent if r is not None) + max(observed - sum(e for e in emitted if e is not None), 0.0)
        else:
            rates[fn] = sum(r for r in sent if r is not None)
    return rates


def _sent(rate: float | None, fs: FunctionSnapshot | None) -> float | None:
    """What an upstream function emits at its target input rate."""
    if rate is None or fs is None:
        return None
    return rate * selectivity(fs)


class DS2Policy(Policy):
    name = "ds2"
    Config = DS2Config

    def decide(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], state: Any) -> Proposal:
        rates = target_rates(graph, snapshot)
        targets, reasons = {}, {}
        for fn, k in current.items():
            fs = snapshot.functions.get(fn)
            rate = rates.get(fn)
            true_rate = fs.true_processing_rate if fs is not None else None
            if rate is None or not true_rate:
                targets[fn] = k
                reasons[fn] = (
                    f"keep: target rate {_fmt(rate)}, true processing rate {_fmt(true_rate)} "
                    f"per instance (unknown figures upstream or here)"
                )
                continue
            capacity = true_rate * self.config.target_utilization
            targets[fn] = max(1, math.ceil(rate / capacity - 1e-9))
            reasons[fn] = (
                f"target rate {rate:.2f}/s / true rate {true_rate:.2f}/s per instance"
                f" / utilization {self.config.target_utilization:g} = {rate / capacity:.2f}"
            )
        return Proposal(targets, reasons, state)


def _fmt(rate: float | None) -> str:
    return "unknown" if rate is None else f"{rate:.2f}/s"
