"""From profiles to a plan: MST against budget, a model chosen by held-out error, and the inversion
for a target rate.

1. Allocate each measured budget greedily over the per-function curves (and the per-worker ceiling
   the profile's worker probe found, if any) and measure its MST (real runs: the curves alone never
   see how functions interfere on shared workers).
2. Fit MST against budget with every family (linear, log, sqrt, power, profile) and keep the one
   that best predicts the upper half of the budgets from the lower half.
3. For a target rate: the smallest budget whose predicted MST covers the rate plus headroom, its
   allocation, an error band, and the workers that allocation needs (from measured CPU per message).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.planning.allocate import Allocation, fewest
from pulsar_autoscale.planning.extrapolate import FAMILIES, MAX_EXTRAPOLATION, Band, Fit, band, invert, select
from pulsar_autoscale.planning.mst import MstResult, MstSettings, measure_mst
from pulsar_autoscale.planning.profile import AppProfile
from pulsar_autoscale.planning.testbed import Testbed, TestConfig

MODEL_FAMILIES = FAMILIES + ("profile",)


@dataclass(frozen=True)
class BudgetPoint:
    budget: int
    parallelism: dict[str, int]
    profile_rate: float  # what the per-function curves say the allocation sustains
    measured: MstResult
    reused: bool = False  # the profile's baseline measured this deployment already (its runs are counted there)


@dataclass(frozen=True)
class CapacityModel:
    profile: AppProfile
    points: tuple[BudgetPoint, ...]
    fit: Fit
    candidates: tuple[Fit, ...]
    max_budget: int  # the profile shape is tabulated up to here
    path: tuple[Allocation, ...] = ()  # with a per-worker ceiling: the allocation path up to max_budget

    def allocation(self, budget: int, bounds: Mapping[str, tuple[int, int]] | None = None) -> Allocation:
        path = list(self.path) if self.path and budget <= self.path[-1].used else None
        return self.profile.allocation(budget, bounds, path)

    def predict(self, budget: int) -> float:
        return float(self.fit.predict(budget))

    @property
    def runs(self) -> int:
        return self.profile.runs + sum(p.measured.runs for p in self.points if not p.reused)

    @property
    def testbed_s(self) -> float:
        return self.profile.testbed_s + sum(p.measured.testbed_s for p in self.points if not p.reused)

    def to_json(self) -> dict:
        return {
            "model": self.fit.to_json(),
            "candidates": [c.to_json() for c in self.candidates],
            "measured": [
                {
                    "budget": p.budget,
                    "parallelism": p.parallelism,
                    "mst": p.measured.mst,
                    "profile_rate": p.profile_rate,
                    "runs": p.measured.runs,
                    "testbed_s": p.measured.testbed_s,
                }
                for p in self.points
            ],
            "runs": self.runs,
            "testbed_s": self.testbed_s,
            "per_worker_ceiling": self.profile.workers is not None,
        }


def default_budgets(n_functions: int, largest: int) -> list[int]:
    """Budgets to measure: from one instance per function to `largest`, roughly geometric, at least 4."""
    largest = max(largest, n_functions + 3)
    xs = np.unique(np.round(np.geomspace(n_functions, largest, 6)).astype(int))
    return [int(x) for x in xs]


def profile_shape(
    profile: AppProfile, max_budget: int, path: Sequence[Allocation] | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """Budget -> the allocation's rate by the per-function curves (and the per-worker ceiling, if any:
    the best rate of at most that many instances); a budget below the minimum: the minimum's rate."""
    path = list(path) if path is not None else profile.path(max_budget)
    first = path[0].used
    rates = np.array([a.rate for a in path])
    if profile.workers is not None:
        rates = np.maximum.accumulate(rates)

    def shape(x) -> np.ndarray:
        b = np.clip(np.floor(np.asarray(x, dtype=float)).astype(int) - first, 0, len(rates) - 1)
        return rates[b]

    return shape


def build_model(
    testbed: Testbed,
    profile: AppProfile,
    budgets: Sequence[int],
    settings: MstSettings = MstSettings(),
    families: Sequence[str] = MODEL_FAMILIES,
) -> CapacityModel:
    max_budget = int(max(budgets) * MAX_EXTRAPOLATION) + 1
    path = profile.path(max_budget) if profile.workers is not None else None
    shape = profile_shape(profile, max_budget, path)
    points = []
    for b in budgets:
        alloc = profile.allocation(b, path=path)
        config = TestConfig(alloc.parallelism)
        if config == profile.baseline.config:  # one instance each: a live MST costs minutes, measure it once
            points.append(BudgetPoint(b, alloc.parallelism, alloc.rate, profile.baseline, reused=True))
            continue
        res = measure_mst(testbed, config, settings)
        points.append(BudgetPoint(b, alloc.parallelism, alloc.rate, res))
    xs = [p.budget for p in points]
    ys = [p.measured.mst for p in points]
    best, cands = select(xs, ys, families, shape)
    return CapacityModel(profile, tuple(points), best, tuple(cands), max_budget, tuple(path or ()))


@dataclass(frozen=True)
class Prediction:
    budget: int
    mst: float
    band: Band
    allocation: Allocation


def predict(model: CapacityModel, budget: int) -> Prediction:
    mst = model.predict(budget)
    return Prediction(budget, mst, band(model.fit, budget, mst), model.allocation(budget))


@dataclass(frozen=True)
class Cluster:
    """The production workers, for the worker count."""

    cores_per_worker: float = 4.0
    instances_per_worker: int = 8
    runtime: str = "thread"  # thread: one interpreter lock, so about one core of Python per worker
    target_cpu: float = 0.7  # plan CPU to this share of what a worker offers

    @property
    def usable_cores(self) -> float:
        return (1.0 if self.runtime == "thread" else self.cores_per_worker) * self.target_cpu


@dataclass(frozen=True)
class BarePlan:
    """What the target needs without the headroom: the headroom's price, in instances and workers. Where
    capacity comes a worker at a time (a per-worker ceiling), a headroom a fraction of a percent short of
    what was asked can cost a whole worker; the operator sees both and chooses."""

    budget: int
    workers: int
    predicted_mst: float


@dataclass(frozen=True)
class Plan:
    target_rate: float
    headroom: float
    budget: int
    parallelism: dict[str, int]
    workers: int
    cpu_cores: float
    predicted_mst: float
    band: Band
    model: Fit
    limited_by: str
    runs: int
    testbed_s: float
    wall_s: float
    refused: str | None = None
    drains: dict[str, str] = field(default_factory=dict)  # function: why the SLO raised its parallelism
    bare: BarePlan | None = None  # the smallest deployment predicted to cover the target with no headroom

    def to_json(self) -> dict:
        return {
            "target_rate": self.target_rate,
            "headroom": self.headroom,
            "budget": self.budget,
            "parallelism": self.parallelism,
            "workers": self.workers,
            "cpu_cores": round(self.cpu_cores, 3),
            "predicted_mst": self.predicted_mst,
            "band": {
                "low": self.band.low,
                "high": self.band.high,
                "relative": self.band.relative,
                "extrapolation": self.band.extrapolation,
                "trusted": self.band.trusted,
                "note": self.band.note,
            },
            "model": self.model.to_json(),
            "limited_by": self.limited_by,
            "runs": self.runs,
            "testbed_s": self.testbed_s,
            "wall_s": self.wall_s,
            "refused": self.refused,
            "drains": self.drains,
            "without_headroom": None if self.bare is None else self.bare.__dict__,
        }


def cpu_per_source_msg(profile: AppProfile) -> float:
    """CPU seconds a source message costs over all functions (measured CPU per message x gain)."""
    total = 0.0
    for fp in profile.functions.values():
        cpus = [p.cpu_per_msg_s for p in fp.points if p.cpu_per_msg_s is not None]
        total += (float(np.median(cpus)) if cpus else 0.0) * fp.gain
    return total


BURST_LIMIT = 1 << 20  # instances: beyond this a burst is not drained by adding more


def burst_drain(profile: AppProfile, rate: float, slo_p99_s: float) -> tuple[dict[str, int], dict[str, str]]:
    """The parallelism each function fed by a window's bursts needs to drain one burst within the SLO.

    A windowed function emits what it gathered over its window at once: its next function receives
    rate x gain x window messages in one burst and drains them at its capacity, so the last of them waits
    burst / capacity: nearly the whole window in a deployment sized for the mean rate (utilization near 1),
    and in the p99, since every message of the burst waits. Sized at the planned rate (target + headroom),
    so the headroom is left for the path's other waits. Returns the parallelism and a note per function; a
    curve that never reaches the capacity raises ConfigError."""
    need_k, notes = {}, {}
    for f, window in profile.bursts.items():
        fp = profile.functions[f]
        capacity = rate * fp.gain * window / slo_p99_s
        if capacity <= fp.capacity(1):
            continue
        k = _fewest_reaching(fp.capacity, capacity)
        if k is None:  # a curve that stopped rising (a hot key group) keeps its last capacity from there on
            raise ConfigError(
                f"{f} cannot drain the {window:g} s window's burst of {rate * fp.gain * window:.0f} "
                f"messages within {slo_p99_s:g} s: its capacity stops rising at "
                f"{fp.capacity(BURST_LIMIT):.1f}/s"
            )
        need_k[f] = k
        notes[f] = (
            f"{k} instances drain a {window:g} s window's burst ({rate * fp.gain * window:.0f} messages) "
            f"within the {slo_p99_s:g} s SLO"
        )
    return need_k, notes


def _fewest_reaching(curve: Callable[[int], float], capacity: float) -> int | None:
    """The fewest instances whose capacity is at least `capacity`; None where the curve stops rising first."""
    return fewest(lambda k: curve(k) >= capacity, BURST_LIMIT, hopeless=lambda k: curve(2 * k) <= curve(k) * (1 + 1e-9))


def plan_for_rate(
    model: CapacityModel,
    target_rate: float,
    headroom: float = 0.10,
    cluster: Cluster = Cluster(),
    started: float | None = None,
    slo_p99_s: float | None = None,
) -> Plan:
    """The smallest budget whose predicted MST is at least target x (1 + headroom); with an SLO, each
    function fed by a window's bursts also gets what drains one within it (`burst_drain`)."""
    if target_rate <= 0:
        raise ConfigError(f"--target-rate must be > 0, got {target_rate}")
    need = target_rate * (1 + headroom)
    found = _smallest_budget(model, need)
    refused = None
    if found is None:
        budget = model.max_budget
        refused = (
            f"no budget up to {model.max_budget} instances ({MAX_EXTRAPOLATION:.0f}x the largest measured) "
            f"reaches {need:.1f}/s by the {model.fit.family} model"
        )
    else:
        budget = found
    pred = predict(model, budget)
    if refused is None and not pred.band.trusted:
        refused = pred.band.note
    parallelism, used = dict(pred.allocation.parallelism), pred.allocation.used
    drains: dict[str, str] = {}
    if slo_p99_s is not None and refused is None:
        try:
            used, drains = _drain_bursts(model.profile, need, slo_p99_s, parallelism, used)
        except ConfigError as exc:
            refused = str(exc)
    cpu_per_msg = cpu_per_source_msg(model.profile)
    cores = cpu_per_msg * need
    workers = _workers(model, used, cores, cluster)
    bare = None
    if refused is None and headroom > 0:
        b = _smallest_budget(model, target_rate)
        if b is not None:
            alloc = model.allocation(b)
            bare_used = alloc.used
            if slo_p99_s is not None:  # where it drains at target + headroom, it drains at the target
                bare_used, _ = _drain_bursts(model.profile, target_rate, slo_p99_s, dict(alloc.parallelism), bare_used)
            bare = BarePlan(max(b, bare_used), _workers(model, bare_used, cpu_per_msg * target_rate, cluster), model.predict(b))
    wall = time.perf_counter() - started if started is not None else 0.0
    return Plan(
        target_rate,
        headroom,
        max(budget, used),
        parallelism,
        workers,
        cores,
        pred.mst,
        pred.band,
        model.fit,
        pred.allocation.limited_by,
        model.runs,
        model.testbed_s,
        wall,
        refused,
        drains,
        bare,
    )


def _drain_bursts(
    profile: AppProfile, rate: float, slo_p99_s: float, parallelism: dict[str, int], used: int
) -> tuple[int, dict[str, str]]:
    """Raise `parallelism` (in place) to what drains each window's burst at `rate` within the SLO: the
    instances used then, and why each raised function was raised. ConfigError where none can."""
    raise_to, notes = burst_drain(profile, rate, slo_p99_s)
    for f, k in raise_to.items():
        used += max(0, k - parallelism[f])
        parallelism[f] = max(k, parallelism[f])
    return used, notes


def _smallest_budget(model: CapacityModel, rate: float) -> int | None:
    """The fewest instances whose predicted MST is at least `rate` (None beyond the model's range)."""
    first = model.points[0].budget
    x = invert(model.fit, rate, x_lo=float(first), x_hi=float(model.max_budget))
    if x is None:
        return None
    budget = int(math.ceil(x - 1e-9))
    while model.predict(budget) < rate and budget < model.max_budget:
        budget += 1
    return budget


def _workers(model: CapacityModel, instances: int, cores: float, cluster: Cluster) -> int:
    if model.profile.workers is not None:
        # the model's own deployment: its prediction already holds each worker's ceiling
        return model.profile.workers.workers(instances)
    return max(math.ceil(instances / cluster.instances_per_worker), math.ceil(cores / cluster.usable_cores - 1e-9), 1)


def controller_snippet(plan: Plan, floor_share: float = 0.25) -> str:
    """controller.yaml `plan.bounds` from the plan: max = the planned parallelism (what the target rate
    needs, with headroom), min = a quarter of it (the autoscaler scales in under lighter load)."""
    lines = [
        f"# capacity plan: target {plan.target_rate:.1f} msg/s (+{plan.headroom:.0%} headroom), predicted MST "
        f"{plan.predicted_mst:.1f} msg/s [{plan.band.low:.1f}, {plan.band.high:.1f}]",
        "plan:",
        "  bounds:",
    ]
    for fn, k in sorted(plan.parallelism.items()):
        pattern = fn if "/" in fn else f"public/default/{fn}"
        lines.append(f"    - {{pattern: {pattern}, min: {max(1, math.floor(k * floor_share))}, max: {k}}}")
    return "\n".join(lines) + "\n"
