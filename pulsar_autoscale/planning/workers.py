"""A per-worker ceiling: the interpreter lock (or the cores) that every instance on a worker shares.

One thread-runtime worker has one interpreter lock, so its instances together get at most about one
core of Python, less as more threads hand the lock around. Adding instances on the same worker stops
helping once the lock saturates; adding workers does. Per-function profiles cannot see this (each
function's scaling is measured with the others around it, on whatever workers the instances filled),
so the planner measures it on its own and models capacity per worker:

- the probe: for t = (number of functions) .. slots instances, a balanced allocation's MST on ONE
  worker and ACROSS t workers (one instance each). Where one worker sustains clearly less than t
  workers, a per-worker resource bound it, and that run measures the worker's ceiling at t threads:
  ceiling(t) = MST x (CPU per source message held under the lock, from the run's own readings).
  Runs where one worker kept up are lower bounds. 1/ceiling(t) = a + b t is fitted on the bound
  points (b >= 0: the hand-off cost grows with threads); the fit is only used for t <= slots, which
  the probe measured, so the thread count is never extrapolated; the worker count is, linearly
  (each worker has its own lock);
- the model: instances placed round-robin over ceil(instances / slots) workers in function order
  (how the worker's scheduler assigns them), each worker's load is the sum of its instances' CPU per
  source message, and the app sustains min over workers of ceiling(threads there) / load.

No ceiling is found (None) where one worker kept up at every t: the planner then works as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from pulsar_autoscale.planning.mst import MstSettings, measure_mst
from pulsar_autoscale.planning.testbed import RunResult, Testbed, TestConfig

BOUND_MARGIN = 0.05  # one worker more than this share below t workers: the worker bound it


@dataclass(frozen=True)
class ProbePoint:
    threads: int
    parallelism: dict[str, int]
    one_worker: float  # MST, every instance on one worker
    across: float  # MST, one instance per worker
    demand: float  # CPU seconds per source message on that worker (all its instances)
    runs: int
    testbed_s: float

    @property
    def bound(self) -> bool:
        return self.one_worker < self.across * (1 - BOUND_MARGIN)

    @property
    def ceiling(self) -> float:
        """CPU seconds per second the worker gave at its MST (a lower bound where it was not bound)."""
        return self.one_worker * self.demand


@dataclass(frozen=True)
class WorkerCeiling:
    slots: int  # instances per worker: workers = ceil(instances / slots)
    order: tuple[str, ...]  # the functions in placement order
    cpu_per_msg: Mapping[str, float]  # CPU seconds per message of the function's input
    a: float  # 1 / ceiling(t) = a + b t
    b: float
    points: tuple[ProbePoint, ...] = field(default=())

    def ceiling(self, threads: int) -> float:
        """A bound point's ceiling as measured; elsewhere the fit, and at least what a worker that kept
        up gave (a lower bound)."""
        bound = [p.ceiling for p in self.points if p.threads == threads and p.bound]
        if bound:
            return max(bound)
        seen = [p.ceiling for p in self.points if p.threads == threads]
        return max([1.0 / (self.a + self.b * threads)] + seen)

    def workers(self, instances: int) -> int:
        return max(1, math.ceil(instances / self.slots))

    def rate(self, parallelism: Mapping[str, int], gains: Mapping[str, float]) -> tuple[float, int]:
        """Source messages/s the workers' ceilings allow `parallelism`, and the binding worker."""
        n = sum(parallelism[f] for f in self.order)
        w = self.workers(n)
        load = np.zeros(w)
        threads = np.zeros(w, dtype=int)
        i = 0
        for f in self.order:
            k = parallelism[f]
            idx = (np.arange(i, i + k)) % w
            np.add.at(load, idx, self.cpu_per_msg[f] * gains[f] / k)
            np.add.at(threads, idx, 1)
            i += k
        caps = np.array([self.ceiling(int(t)) if t else math.inf for t in threads])
        with np.errstate(divide="ignore"):
            per = np.where(load > 0, caps / np.maximum(load, 1e-300), math.inf)
        j = int(np.argmin(per))
        return float(per[j]), j

    def to_json(self) -> dict:
        return {
            "slots": self.slots,
            "cpu_per_msg": dict(self.cpu_per_msg),
            "inverse_ceiling": [self.a, self.b],
            "ceiling_by_threads": {t: self.ceiling(t) for t in range(1, self.slots + 1)},
            "probe": [{**p.__dict__, "bound": p.bound, "ceiling": p.ceiling} for p in self.points],
        }


def balanced(threads: int, gains: Mapping[str, float], rates: Mapping[str, float], order: Sequence[str]) -> dict[str, int]:
    """`threads` instances spread so each function's linear capacity (instances x rate) covers its
    share of the load as evenly as possible: one each, then the next to the least covered."""
    k = {f: 1 for f in order}
    for _ in range(threads - len(order)):
        f = min(order, key=lambda g: k[g] * rates[g] / max(gains[g], 1e-12))
        k[f] += 1
    return k


def cpu_per_message(run: RunResult) -> dict[str, float] | None:
    """Each function's CPU per message from one run's readings (None where a testbed has none)."""
    out = {}
    for name, fm in run.functions.items():
        processed = sum(i.processed for i in fm.instances)
        if processed <= 0 or fm.cpu_s <= 0:
            return None
        out[name] = fm.cpu_s / processed
    return out


def fit_inverse(points: Sequence[ProbePoint]) -> tuple[float, float]:
    """1/ceiling = a + b t over the bound points, b >= 0 (one point: flat)."""
    bound = [p for p in points if p.bound]
    t = np.array([p.threads for p in bound], dtype=float)
    inv = np.array([1.0 / p.ceiling for p in bound])
    if len(bound) >= 2 and np.ptp(t) > 0:
        b, a = np.polyfit(t, inv, 1)
        if b >= 0:
            return float(a), float(b)
    return float(inv.mean()), 0.0


def probe_workers(
    testbed: Testbed, slots: int, gains: Mapping[str, float], rates: Mapping[str, float], settings: MstSettings = MstSettings()
) -> tuple[WorkerCeiling | None, tuple[ProbePoint, ...]]:
    """One worker against t workers for t = functions .. slots; the ceiling if a worker bound any."""
    order = testbed.functions()
    points: list[ProbePoint] = []
    cpu: list[dict[str, float]] = []
    for t in range(len(order), slots + 1):
        par = balanced(t, gains, rates, order)
        one = measure_mst(testbed, TestConfig(dict(par), workers=1), settings)
        across = measure_mst(testbed, TestConfig(dict(par), workers=t), settings)
        ref = one.last or one.failing
        per_msg = cpu_per_message(ref) if ref is not None else None
        if per_msg is None:
            return None, tuple(points)
        cpu.append(per_msg)
        demand = sum(per_msg[f] * gains[f] for f in order)
        points.append(ProbePoint(t, par, one.mst, across.mst, demand, one.runs + across.runs, one.testbed_s + across.testbed_s))
    if not any(p.bound for p in points):
        return None, tuple(points)
    per_msg = {f: float(np.median([c[f] for c in cpu])) for f in order}
    # each point's ceiling in the same units as the model's load (the median CPU per message)
    points = [
        ProbePoint(
            p.threads, p.parallelism, p.one_worker, p.across, sum(per_msg[f] * gains[f] for f in order), p.runs, p.testbed_s
        )
        for p in points
    ]
    a, b = fit_inverse(points)
    return WorkerCeiling(slots, tuple(order), per_msg, a, b, tuple(points)), tuple(points)
