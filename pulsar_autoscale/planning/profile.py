"""Per-function profiles: the input rate each function sustains at parallelism 1, 2, 4, ..., its busy
time and CPU per message, and a fitted curve to extrapolate it.

Each point is a real MST measurement of a deployment where that function is the bottleneck (the
others get twice what a linear estimate says they need; if another function still falls behind,
it gets more and the point is measured again). So the point includes what a busy-time estimate
misses: lock contention, a hot key group, emission stalls, per-message cost that grows with rate.

Keyed functions: the hot instance decides. The profile keeps the key-group histogram; the curve is
fitted to the hot instance's own rate (capacity x its share), and capacity at k instances is that rate
over the share the hot instance would own at k (the worker's contiguous key-group blocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence, cast

import numpy as np

from pulsar_autoscale.planning.allocate import Allocation, allocation_path, best_within, bounded_path
from pulsar_autoscale.planning.extrapolate import Fit, select
from pulsar_autoscale.planning.mst import MstResult, MstSettings, bottleneck, measure_mst
from pulsar_autoscale.planning.simbed import block_shares
from pulsar_autoscale.planning.testbed import RunResult, Testbed, TestConfig
from pulsar_autoscale.planning.workers import ProbePoint, WorkerCeiling, probe_workers

CURVE_FAMILIES = ("linear", "log", "sqrt", "power", "rate-cost")


@dataclass(frozen=True)
class ProfilePoint:
    parallelism: int
    capacity: float  # input messages/s the function sustained (MST x its gain)
    source_mst: float  # the deployment's MST, source messages/s
    true_rate: float | None  # per instance, messages per busy second, at the highest passing run
    cpu_per_msg_s: float | None  # CPU seconds per message
    hot_share: float  # the busiest instance's share of the input
    runs: int
    testbed_s: float
    own: bool = True  # this function fell behind first (False: another did; the point is only a lower bound)


@dataclass(frozen=True)
class FunctionProfile:
    name: str
    gain: float  # messages reaching it per source message
    points: tuple[ProfilePoint, ...]
    key_group_weights: tuple[float, ...] | None = None
    fit: Fit | None = None  # the chosen curve (of hot-instance rate, if keyed)
    candidates: tuple[Fit, ...] = ()

    def hot_share(self, k: int) -> float:
        if self.key_group_weights:
            return float(block_shares(np.asarray(self.key_group_weights), k).max())
        return 1.0 / k

    def capacity(self, k: int) -> float:
        """Input messages/s at parallelism k, from the fitted curve; never decreasing in k."""
        return max(self._raw(j) for j in _checkpoints(k))

    def _raw(self, k: int) -> float:
        """Measured points are used as measured (interpolated between); past the last one the fitted
        curve continues from it (anchored: the fit gives the shape, the measurement the level)."""
        own = [p for p in self.points if p.own] or list(self.points)
        xs = np.array([p.parallelism for p in own], dtype=float)
        ys = np.array([self._hot_rate(p) for p in own])
        if k <= xs[-1]:
            y = float(np.interp(k, xs, ys))
        else:
            y = ys[-1] + (float(self.fit.predict(k)) - float(self.fit.predict(xs[-1])) if self.fit else 0.0)
        y = max(y, 0.0)
        return y / self.hot_share(k) if self.key_group_weights else y

    def _hot_rate(self, p: ProfilePoint) -> float:
        return p.capacity * (self.hot_share(p.parallelism) if self.key_group_weights else 1.0)

    def to_json(self) -> dict:
        return {
            "gain": self.gain,
            "keyed": self.key_group_weights is not None,
            "points": [p.__dict__ for p in self.points],
            "curve": self.fit.to_json() if self.fit else None,
            "candidates": [c.to_json() for c in self.candidates],
        }


def _checkpoints(k: int) -> list[int]:
    """k and a few smaller parallelisms: the capacity curve is the running max (monotone)."""
    return sorted({k, max(1, k - 1), max(1, k // 2), 1})


@dataclass(frozen=True)
class AppProfile:
    testbed: str
    baseline: MstResult  # every function at parallelism 1
    functions: Mapping[str, FunctionProfile]
    runs: int
    testbed_s: float
    workers: WorkerCeiling | None = None  # a per-worker ceiling the probe found (None: none binds)
    probe: tuple[ProbePoint, ...] = ()
    bursts: Mapping[str, float] = field(default_factory=dict)  # function: the window whose bursts reach it (s)

    def curves(self) -> dict[str, Callable[[int], float]]:
        return {n: fp.capacity for n, fp in self.functions.items()}

    def path(self, budget: int, bounds: Mapping[str, tuple[int, int]] | None = None) -> list[Allocation]:
        """Allocations for every instance count up to `budget` (see allocate)."""
        workers = self.workers
        if workers is None:
            return allocation_path(self.curves(), self.gains(), budget, bounds)
        gains = self.gains()
        return bounded_path(self.curves(), gains, budget, lambda k: workers.rate(k, gains)[0], bounds)

    def allocation(
        self, budget: int, bounds: Mapping[str, tuple[int, int]] | None = None, path: list[Allocation] | None = None
    ) -> Allocation:
        """The allocation for `budget`: greedy over the curves, or with a per-worker ceiling the best
        allocation of at most `budget` instances (`path`: a precomputed path at least that long)."""
        if self.workers is None:
            return self.path(budget, bounds)[-1]
        return best_within(path if path is not None and bounds is None else self.path(budget, bounds), budget)

    def gains(self) -> dict[str, float]:
        return {n: fp.gain for n, fp in self.functions.items()}

    def to_json(self) -> dict:
        return {
            "testbed": self.testbed,
            "runs": self.runs,
            "testbed_s": self.testbed_s,
            "baseline_mst": self.baseline.mst,
            "functions": {n: fp.to_json() for n, fp in self.functions.items()},
            "worker_ceiling": self.workers.to_json() if self.workers else None,
            "probe": [{**p.__dict__, "bound": p.bound} for p in self.probe],
            "bursts": dict(self.bursts),
        }


def gains_of(run: RunResult) -> dict[str, float]:
    """Messages reaching each function per source message, from one run."""
    inj = max(run.injected_rate, 1e-12)
    return {n: fm.arrival_rate / inj for n, fm in run.functions.items()}


def measure_point(
    testbed: Testbed,
    fn: str,
    k: int,
    others: dict[str, int],
    gain: float,
    settings: MstSettings,
    retries: int = 2,
    spread: bool = False,
) -> tuple[ProfilePoint, dict[str, int]]:
    """MST with `fn` at k and the others at `others`; if another function fell behind, double it and
    measure again (the point must be this function's). `spread`: one instance per worker (the
    function's own scaling, without a worker's shared lock)."""
    runs, spent = 0, 0.0
    par = dict(others)
    for attempt in range(retries + 1):
        par[fn] = k
        res = measure_mst(testbed, TestConfig(dict(par), sum(par.values()) if spread else None), settings)
        runs += res.runs
        spent += res.testbed_s
        b = bottleneck(res.failing) if res.failing is not None else fn
        if b in (fn, None) or attempt == retries:
            break
        par[b] = par[b] * 2
    last = res.last
    fm = last.functions[fn] if last is not None else None
    processed = sum(i.processed for i in fm.instances) if fm else 0.0
    hot = max((i.arrived for i in fm.instances), default=0.0) / max(sum(i.arrived for i in fm.instances), 1e-12) if fm else 1.0
    point = ProfilePoint(
        parallelism=k,
        capacity=res.mst * gain,
        source_mst=res.mst,
        true_rate=fm.true_rate if fm else None,
        cpu_per_msg_s=(fm.cpu_s / processed) if fm and processed > 0 else None,
        hot_share=hot,
        runs=runs,
        testbed_s=spent,
        own=b in (fn, None),
    )
    return point, par


def ladder(max_parallelism: int) -> list[int]:
    out, k = [], 1
    while k <= max_parallelism:
        out.append(k)
        k *= 2
    return out


def profile_app(
    testbed: Testbed, max_parallelism: int = 8, settings: MstSettings = MstSettings(), headroom: float = 2.0, probe: bool = True
) -> AppProfile:
    """Baseline MST (all at 1); where the testbed places instances on workers of `slots_per_worker`,
    the worker probe (workers.py); then each function at 1, 2, 4, ... up to max_parallelism, one
    instance per worker if the probe found a per-worker ceiling."""
    fns = testbed.functions()
    base = measure_mst(testbed, TestConfig({f: 1 for f in fns}), settings)
    runs, spent = base.runs, base.testbed_s
    ref = cast(RunResult, base.last or base.failing)  # measure_mst runs at least once: one of them is set
    gains = gains_of(ref)
    tr = {f: (ref.functions[f].true_rate or 1.0) for f in fns}
    ceiling: WorkerCeiling | None = None
    probed: tuple[ProbePoint, ...] = ()
    slots = getattr(testbed, "slots_per_worker", None)
    if probe and slots and slots >= len(fns):
        ceiling, probed = probe_workers(testbed, int(slots), gains, tr, settings)
        runs += sum(p.runs for p in probed)
        spent += sum(p.testbed_s for p in probed)
    profiles = {}
    for f in fns:
        points = []
        counts = None
        for k in ladder(max_parallelism):
            need = headroom * k * tr[f] / max(gains[f], 1e-12)  # source rate f might reach at k
            others = {o: max(1, math.ceil(need * gains[o] / tr[o])) for o in fns if o != f}
            p, _ = measure_point(testbed, f, k, others, gains[f], settings, spread=ceiling is not None)
            points.append(p)
            runs += p.runs
            spent += p.testbed_s
        last_counts = [r for r in [base.last] if r is not None and r.functions[f].key_group_counts]
        if last_counts:
            counts = np.asarray(last_counts[0].functions[f].key_group_counts, dtype=float)
        profiles[f] = fit_profile(f, gains[f], points, counts)
    bursts = {f: w for f in fns if (w := max((testbed.window_s(u) for u in testbed.upstream(f)), default=0.0)) > 0}
    return AppProfile(testbed.name, base, profiles, runs, spent, ceiling, probed, bursts)


def fit_profile(
    name: str, gain: float, points: Sequence[ProfilePoint], key_group_counts: np.ndarray | None = None
) -> FunctionProfile:
    """Choose the curve family by held-out error; keyed functions are fitted on the hot instance."""
    weights = None
    if key_group_counts is not None and key_group_counts.sum() > 0:
        weights = tuple(float(v) for v in key_group_counts / key_group_counts.sum())
    proto = FunctionProfile(name, gain, tuple(points), weights)
    own = [p for p in points if p.own] or list(points)
    xs = [p.parallelism for p in own]
    ys = [proto._hot_rate(p) for p in own]
    families = ("linear",) if weights else CURVE_FAMILIES  # a hot instance's own rate: flat or linear
    if len(own) == 1:
        best = select(xs, ys, ("linear",))[0]
        return FunctionProfile(name, gain, tuple(points), weights, best, (best,))
    best, cands = select(xs, ys, families)
    return FunctionProfile(name, gain, tuple(points), weights, best, tuple(cands))
