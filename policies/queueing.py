"""Queueing-theory policy (paper Sec. 4.2): each function is a GI/G/k station whose mean response
time is estimated with the Allen-Cunneen approximation; the policy looks for the fewest instances
that keep response time within R_max.

    T_q ~ (c_a^2 + c_s^2) / (2k) * P_k / (mu (1 - rho)),   rho = lambda / (k mu)        (1)
    P_k ~ (rho^k + rho) / 2 if rho >= 0.7, else rho^sqrt(k + 1)                          (2)
    T = 1/mu + T_q   (3);   T_path = sum of T over the path's functions                  (4)

rho >= 1 is an unstable station: T is infinite, so the function scales out.

level = "function" (Sec. 4.2.1): R_max bounds each function's T; the greedy search raises k from
min_parallelism until T <= R_max, or stops at max_parallelism.

level = "path" (Sec. 4.2.2): R_max bounds each source-to-sink path's T_path (eq. 4). R_max is
*not* split into per-function budgets: the heuristic decides where instances go, so a slow
function takes most of a path's budget and a fast one keeps one instance. Per path:
  - T_path > R_max: the function with the largest T on it gets one more instance, unless it
    is at max_parallelism: then that path gets nothing, as in the paper (an unstable function
    at the maximum would otherwise drag every faster function on its path to the maximum).
    The paper takes this one step per period; we repeat it within the period until no path
    exceeds R_max (or its slowest function is at the maximum), so one decision suffices after
    a load step. An unstable function (rho >= 1, T = inf) is the slowest on all its paths, so
    the rule would add to it until it is stable: it goes to its smallest stable k at once.
  - alpha * R_max <= T_path <= R_max: no action.
  - T_path < alpha * R_max: the function with the smallest T on it among those above
    min_parallelism gives back one instance (one step per period, as in the paper), unless a
    path through it would then exceed R_max: a scale-in never creates a violation that the next
    period's scale-out would undo.
  Default alpha = 0.5: a path keeps its instances until its estimated response time falls below
  half of R_max, a band wide enough that the estimation noise of one 30 s window does not flap
  between scale-in and scale-out.
Paths are not enumerated (their number is exponential with fan-in): each function stands for
the slowest path through it, found by dynamic programming over the DAG in O(V + E).

Unknown lambda or mu: keep the current parallelism (and the function counts as T = 0 on its
paths). Unknown c_a^2 or c_s^2: default_scv (1.0, i.e. Poisson arrivals, exponential service); the
reason shows the values used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot

from .base import Policy, Proposal

LEVELS = ("function", "path")


@dataclass(frozen=True)
class QueueingConfig:
    level: str = "function"  # "function" or "path"
    r_max_s: float = 1.0  # paper: 1 s per path
    alpha: float = 0.5  # path level: scale in below alpha * R_max
    min_parallelism: int = 1
    max_parallelism: int = 15  # paper: 15
    default_scv: float = 1.0  # c_a^2 / c_s^2 when unmeasured

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ConfigError(f"queueing level {self.level!r} is unknown: use one of {', '.join(LEVELS)}")
        if self.r_max_s <= 0:
            raise ConfigError(f"queueing r_max_s must be > 0 seconds, got {self.r_max_s}")
        if not 0 < self.alpha < 1:
            raise ConfigError(f"queueing alpha must be in (0, 1), got {self.alpha}")
        if not 1 <= self.min_parallelism <= self.max_parallelism:
            raise ConfigError(
                f"queueing needs 1 <= min_parallelism <= max_parallelism, got {self.min_parallelism} and {self.max_parallelism}"
            )


def p_wait(rho: float, k: int) -> float:
    """P_k, the probability that an arrival waits (paper eq. 2)."""
    if rho >= 0.7:
        return (rho**k + rho) / 2.0
    return rho ** math.sqrt(k + 1)


def response_time(lam: float, mu: float, k: int, ca2: float, cs2: float) -> float:
    """Mean response time of a GI/G/k station (paper eq. 1-3); inf when rho >= 1."""
    rho = lam / (k * mu)
    if rho >= 1.0:
        return math.inf
    tq = (ca2 + cs2) / (2.0 * k) * p_wait(rho, k) / (mu * (1.0 - rho))
    return 1.0 / mu + tq


@dataclass(frozen=True)
class Station:
    """One function as a GI/G/k station: lambda and mu in messages/s, mu per instance."""

    lam: float
    mu: float
    ca2: float
    cs2: float

    def t(self, k: int) -> float:
        return response_time(self.lam, self.mu, k, self.ca2, self.cs2)

    def describe(self) -> str:
        return f"lambda {self.lam:.2f}/s mu {self.mu:.2f}/s ca2 {self.ca2:.2f} cs2 {self.cs2:.2f}"


def station(fs: FunctionSnapshot | None, default_scv: float) -> Station | None:
    """The station for a function, or None if lambda or mu is unknown."""
    if fs is None or fs.arrival_rate is None or not fs.service_rate:
        return None
    return Station(
        fs.arrival_rate, fs.service_rate, default_scv if fs.ca2 is None else fs.ca2, default_scv if fs.cs2 is None else fs.cs2
    )


def min_parallelism_for(s: Station, r_max: float, k_min: int, k_max: int) -> int:
    """The smallest k in k_min..k_max with T <= r_max, else k_max (paper 4.2.1, greedy). Starts
    at the smallest stable k: every k with rho >= 1 has T = inf."""
    for k in range(max(k_min, math.floor(s.lam / s.mu) + 1), k_max + 1):
        if s.t(k) <= r_max:
            return k
    return k_max


@dataclass(frozen=True)
class PathTime:
    """The slowest source-to-sink path through a function: its T_path and the function with the
    highest score on it (None if no function on it has a score)."""

    time: float
    pick: str | None


def slowest_paths(graph: AppGraph, times: Mapping[str, float], score: Mapping[str, float]) -> dict[str, PathTime]:
    """For every function, the slowest path through it (eq. 4) and the scored function with the
    highest score on that path. Dynamic programming in topological order, O(V + E); plain loops
    because this runs a few times per decision on DAGs of thousands of functions."""

    def better(a: str | None, b: str | None) -> str | None:
        return a if b is None or (a is not None and score[a] >= score[b]) else b

    def longest(order, neighbours) -> tuple[dict[str, float], dict[str, str | None]]:
        """Slowest path that ends (or starts) at each function, the function included."""
        length: dict[str, float] = {}
        pick: dict[str, str | None] = {}
        for fn in order:
            prev = None
            for n in neighbours(fn):
                if prev is None or length[n] > length[prev]:
                    prev = n
            own = fn if fn in score else None
            if prev is None:
                length[fn], pick[fn] = times[fn], own
            else:
                length[fn], pick[fn] = length[prev] + times[fn], better(pick[prev], own)
        return length, pick

    order = graph.topological_order()
    into, into_pick = longest(order, graph.upstream)
    out_of, out_pick = longest(reversed(order), graph.downstream)
    through = {}
    for fn in order:
        tail = None
        for d in graph.downstream(fn):
            if tail is None or out_of[d] > out_of[tail]:
                tail = d
        if tail is None:
            through[fn] = PathTime(into[fn], into_pick[fn])
        else:
            through[fn] = PathTime(into[fn] + out_of[tail], better(into_pick[fn], out_pick[tail]))
    return through


class QueueingPolicy(Policy):
    name = "queueing"
    Config = QueueingConfig

    def decide(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], state: Any) -> Proposal:
        stations = {fn: station(snapshot.functions.get(fn), self.config.default_scv) for fn in current}
        if self.config.level == "function":
            return self._function_level(stations, current, state)
        return self._path_level(graph, stations, current, state)

    def _function_level(self, stations: dict[str, Station | None], current: Mapping[str, int], state: Any) -> Proposal:
        c = self.config
        targets, reasons = {}, {}
        for fn, k in current.items():
            s = stations[fn]
            if s is None:
                targets[fn], reasons[fn] = k, "arrival or service rate unknown: keep"
                continue
            targets[fn] = min_parallelism_for(s, c.r_max_s, c.min_parallelism, c.max_parallelism)
            reasons[fn] = f"{s.describe()}: T({targets[fn]}) {_fmt(s.t(targets[fn]))} vs R_max {c.r_max_s:g}s"
        return Proposal(targets, reasons, state)

    def _path_level(
        self, graph: AppGraph, stations: dict[str, Station | None], current: Mapping[str, int], state: Any
    ) -> Proposal:
        c = self.config
        k = dict(current)
        known = {fn for fn, s in stations.items() if s is not None and fn in graph}
        known_stations: dict[str, Station] = {fn: s for fn, s in stations.items() if s is not None}
        times = {fn: known_stations[fn].t(k[fn]) if fn in known else 0.0 for fn in graph.topological_order()}

        def resize(fn: str, delta: int) -> None:
            k[fn] += delta
            times[fn] = known_stations[fn].t(k[fn])

        for fn in known:  # unstable: the paper's rule would pick it period after period until stable
            stable = min(math.floor(known_stations[fn].lam / known_stations[fn].mu) + 1, c.max_parallelism)
            if k[fn] < stable:
                resize(fn, stable - k[fn])
        while True:  # scale out: on every path above R_max, its slowest function, unless at the maximum
            through = slowest_paths(graph, times, {f: times[f] for f in known})
            picks = {
                p.pick for p in through.values() if p.time > c.r_max_s and p.pick is not None and k[p.pick] < c.max_parallelism
            }
            if not picks:
                break
            for fn in picks:
                resize(fn, +1)

        # scale in: on every path below alpha * R_max, its fastest shrinkable function, all at once;
        # then undo those with a path through them above R_max (undoing only makes paths faster)
        shrinkable = {f: -times[f] for f in known if k[f] > c.min_parallelism}
        shrunk = {
            p.pick
            for p in slowest_paths(graph, times, shrinkable).values()
            if p.time < c.alpha * c.r_max_s and p.pick is not None
        }
        for fn in shrunk:
            resize(fn, -1)
        through = slowest_paths(graph, times, {})
        undone = {fn for fn in shrunk if through[fn].time > c.r_max_s}
        if undone:
            for fn in undone:
                resize(fn, +1)
            through = slowest_paths(graph, times, {})

        reasons = {fn: "arrival or service rate unknown (or not in the app graph): keep" for fn in current if fn not in known}
        for fn in known:
            action = (
                "scale out: a path through it exceeded R_max; "
                if k[fn] > current[fn]
                else "scale in: a path through it was below alpha * R_max; "
                if k[fn] < current[fn]
                else ""
            )
            reasons[fn] = (
                f"{action}{known_stations[fn].describe()}: T({k[fn]}) {_fmt(times[fn])}, slowest path "
                f"through it {_fmt(through[fn].time)} (R_max {c.r_max_s:g}s, alpha {c.alpha:g})"
            )
        return Proposal(k, reasons, state)


def _fmt(seconds: float) -> str:
    return "unstable" if math.isinf(seconds) else f"{seconds:.3f}s"
