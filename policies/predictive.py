"""Predictive policy: forecast the arrival rate, size for the p99 (not only the mean) response time,
add the capacity to drain the current backlog before a deadline, and scale in only when it holds.

1. Rate each function must sustain: DS2's target rate (what arrives if everything upstream keeps
   up), forecast one period ahead with Holt's linear trend (level + horizon * trend). A step up
   is not predictable, so the forecast never goes below the rate just observed.
2. Queueing sizing (paper eq. 1-3, Allen-Cunneen) for that rate: the smallest k whose mean
   response time is within `r_max_s` and whose p99 estimate is within its share of `p99_s`.
   The p99 estimate is the waiting-time quantile of the heavy-traffic exponential tail,
   P(W > t) = P_k exp(-t k mu (1 - rho) 2 / (c_a^2 + c_s^2)) (its mean is Allen-Cunneen's T_q),
   plus the mean service time, and at least a normal service-time quantile 1/mu (1 + z sqrt(c_s^2))
   (adding both quantiles would size for a message that waits and is slow, far rarer than 1%:
   measured, that overshoots by one instance). Each path's p99 budget is split
   among its functions in proportion to their mean service times; a function takes the
   tightest share over the paths through it.
3. Backlog drain (Sponge, sec. 4.3): capacity for forecast + excess backlog / `drain_s`, so a
   backlog left by an unforeseen step is gone within the deadline; what an upstream function
   drains arrives downstream too, so downstream capacity includes it.
4. Hysteresis: the model's k (the sustained capacity) goes up at once and down only after
   `scale_in_periods` consecutive periods all asked for less, then to the highest of those asks.
   Drain capacity is transient: it goes as soon as the backlog has, so it is not held.

All memory (Holt level and trend, held k, pending scale-in asks) travels in Proposal.state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, Mapping

from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.snapshot import Snapshot

from .base import Policy, Proposal
from .ds2 import selectivity, target_rates
from .queueing import Station, p_wait


@dataclass(frozen=True)
class PredictiveConfig:
    r_max_s: float = 1.0  # mean response time per path
    # p99 per path the sizing aims at: half the 2 s SLO, because no forecast sees a step up coming
    # and the tail after one is what misses (simulated on `paper`: aiming at 2.0 gave p99 3.24 s,
    # at 1.0 gave 1.25 s for 9% more instance-seconds)
    p99_s: float = 1.0
    quantile: float = 0.99
    drain_s: float = 10.0  # backlog deadline (Sponge's recovery deadline: its 10 s window)
    alpha: float = 0.5  # Holt level smoothing
    beta: float = 0.3  # Holt trend smoothing
    horizon_periods: float = 1.0  # forecast this many periods ahead
    scale_in_periods: int = 2  # consecutive lower asks before scaling in
    max_parallelism: int = 15
    default_scv: float = 1.0


@dataclass(frozen=True)
class FunctionState:
    level: float
    trend: float
    held: int = 0  # sustained (model) parallelism
    asks: tuple[int, ...] = ()  # recent lower model asks, while they keep coming


def holt(prev: FunctionState | None, observed: float, alpha: float, beta: float) -> FunctionState:
    """One step of Holt's linear trend (per-period units)."""
    if prev is None:
        return FunctionState(observed, 0.0)
    level = alpha * observed + (1 - alpha) * (prev.level + prev.trend)
    return replace(prev, level=level, trend=beta * (level - prev.level) + (1 - beta) * prev.trend)


def quantile_response_time(s: Station, k: int, q: float) -> float:
    """q-quantile of a GI/G/k station's response time (inf when unstable), see the module text."""
    rho = s.lam / (k * s.mu)
    if rho >= 1.0:
        return math.inf
    pk = p_wait(rho, k)
    service_q = (1 + NormalDist().inv_cdf(q) * math.sqrt(s.cs2)) / s.mu
    if pk <= 1 - q:
        return service_q
    waiting = math.log(pk / (1 - q)) * (s.ca2 + s.cs2) / (2 * k * s.mu * (1 - rho))
    return max(waiting + 1 / s.mu, service_q)


def p99_shares(graph: AppGraph, service_s: Mapping[str, float]) -> dict[str, float]:
    """Each function's share of its paths' budgets: its mean service time over the path's (tightest)."""
    shares: dict[str, float] = {}
    for path in graph.paths:
        if not all(fn in service_s for fn in path):
            continue
        total = sum(service_s[fn] for fn in path)
        for fn in path:
            shares[fn] = min(shares.get(fn, 1.0), service_s[fn] / total if total > 0 else 1.0)
    return shares


class PredictivePolicy(Policy):
    name = "predictive"
    Config = PredictiveConfig

    def decide(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], state: Any) -> Proposal:
        c = self.config
        old: Mapping[str, FunctionState] = state or {}
        new_state: dict[str, FunctionState] = {}
        rates = target_rates(graph, snapshot)
        service_s = {fn: 1 / fs.service_rate for fn, fs in snapshot.functions.items() if fs.service_rate}
        shares = p99_shares(graph, service_s)
        drained: dict[str, float] = {}  # msg/s each function will emit while draining its and upstream backlogs
        targets, reasons = {}, {}
        for fn in graph.topological_order():
            if fn not in current:
                continue
            k_now = current[fn]
            fs = snapshot.functions.get(fn)
            rate = rates.get(fn)
            if fs is None or rate is None or not fs.service_rate:
                targets[fn], reasons[fn] = k_now, "rate or service rate unknown: keep"
                if fn in old:
                    new_state[fn] = old[fn]
                continue
            h = holt(old.get(fn), rate, c.alpha, c.beta)
            forecast = max(rate, h.level + c.horizon_periods * h.trend)
            inflow = forecast + sum(drained.get(u, 0.0) for u in graph.upstream(fn))
            station = Station(inflow, fs.service_rate, _scv(fs.ca2, c), _scv(fs.cs2, c))
            p99_budget = c.p99_s * shares.get(fn, 1.0)
            mean_budget = c.r_max_s * shares.get(fn, 1.0)
            k_model = next(
                (
                    k
                    for k in range(1, c.max_parallelism + 1)
                    if station.t(k) <= mean_budget and quantile_response_time(station, k, c.quantile) <= p99_budget
                ),
                c.max_parallelism,
            )
            in_system = inflow * station.t(k_model) if k_model < c.max_parallelism else 0.0
            excess = max((fs.backlog or 0.0) - in_system, 0.0)
            drain_rate = excess / c.drain_s
            k_drain = math.ceil((inflow + drain_rate) / fs.service_rate - 1e-9)
            drained[fn] = (drain_rate + inflow - forecast) * selectivity(fs)
            held, asks, why = self._hysteresis(h.held or k_now, k_model, h.asks, c.scale_in_periods)
            new_state[fn] = replace(h, held=held, asks=asks)
            targets[fn] = min(max(held, k_drain, 1), c.max_parallelism)
            reasons[fn] = (
                f"rate {rate:.2f}/s forecast {forecast:.2f}/s inflow {inflow:.2f}/s mu {fs.service_rate:.2f}/s; "
                f"queueing k {k_model} (p99 budget {p99_budget:.2f}s), backlog {fs.backlog or 0:.0f} "
                f"drain k {k_drain}; {why}"
            )
        return Proposal(targets, reasons, new_state)

    @staticmethod
    def _hysteresis(held: int, ask: int, asks: tuple[int, ...], periods: int) -> tuple[int, tuple[int, ...], str]:
        if ask >= held:
            return ask, (), "model k up" if ask > held else "model k kept"
        asks = asks + (ask,)
        if len(asks) >= periods:
            return max(asks), (), f"model k down after {len(asks)} lower asks"
        return held, asks, f"lower model ask {ask} {len(asks)}/{periods}: held {held}"


def _scv(value: float | None, c: PredictiveConfig) -> float:
    return c.default_scv if value is None else value
