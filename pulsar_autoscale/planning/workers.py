"""The interpreter lock that every instance on a thread-runtime worker shares, in the capacity model.

One thread-runtime worker has one interpreter lock, so its instances together get at most about one
core of Python, less as more threads hand the lock around, and each thread waits for the lock while
the others hold it: a thread that carries many messages spends much of each one waiting, so two
splits of the same instance count over the same workers can sustain different rates. Per-function
profiles cannot see this (each function's scaling is measured with one instance per worker), so the
planner measures the lock on its own and models it per worker:

- the probe: for t = (number of functions) .. slots instances, a balanced allocation's MST on ONE
  worker and ACROSS t workers (one instance each). Where one worker sustains clearly less than t
  workers, the lock bound it. The runs measure each function's lock hold per message (CPU per
  message) and, one instance per worker, its time per message with no lock wait (busy time per
  message); the hand-off cost is fitted so that the model reproduces the one-worker MSTs;
- the model: instances placed round-robin over ceil(instances / slots) workers in function order
  (how the worker's scheduler assigns them). On a worker with t threads each hold grows by the
  hand-off, (1 + handoff (t - 1)). At source rate r a thread of f carries x = r gain_f / k_f messages/s;
  the worker keeps up while the lock is held less than all the time (the sum of x hold < 1) and every
  thread is busy less than all the time: x (service + wait) < 1, the wait an M/G/1 queue's for the
  others' holds (Pollaczek-Khinchine: the residual of the others' holds over the share of time they
  leave the lock free). For each thread that is a quadratic in r; the app sustains the smallest root
  over all threads and workers.

No lock model is found (None) where one worker kept up at every t: the planner then works as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from pulsar_autoscale.planning.mst import MstSettings, measure_mst
from pulsar_autoscale.planning.testbed import RunResult, Testbed, TestConfig

BOUND_MARGIN = 0.05  # one worker more than this share below t workers: the worker bound it
HANDOFFS = np.arange(0.0, 0.5, 0.0025)  # hand-off costs the fit tries, per other thread on a worker


@dataclass(frozen=True)
class ProbePoint:
    threads: int
    parallelism: dict[str, int]
    one_worker: float  # MST, every instance on one worker
    across: float  # MST, one instance per worker
    runs: int
    testbed_s: float

    @property
    def bound(self) -> bool:
        return self.one_worker < self.across * (1 - BOUND_MARGIN)


@dataclass(frozen=True)
class WorkerCeiling:
    """Each worker's interpreter lock: what it allows an allocation (`rate`)."""

    slots: int  # instances per worker: workers = ceil(instances / slots)
    order: tuple[str, ...]  # the functions in placement order
    cpu_per_msg: Mapping[str, float]  # seconds a message of the function's input holds the lock
    service_s: Mapping[str, float]  # seconds a message takes in process() on a worker of its own (no lock wait)
    handoff: float  # each hold grows by this share per other thread on the worker
    points: tuple[ProbePoint, ...] = field(default=())
    fit_error: float = 0.0  # rms relative error of the model on the probe's one-worker MSTs

    def workers(self, instances: int) -> int:
        return max(1, math.ceil(instances / self.slots))

    def rate(self, parallelism: Mapping[str, int], gains: Mapping[str, float], workers: int | None = None) -> tuple[float, int]:
        """Source messages/s the workers' locks allow `parallelism` (on `workers`, or the placement rule's
        count), and the binding worker."""
        fns = [f for f in self.order for _ in range(parallelism[f])]
        w = workers or self.workers(len(fns))
        on = np.arange(len(fns)) % w
        per_msg = np.array([gains[f] / parallelism[f] for f in fns])  # x = r * per_msg
        threads = np.bincount(on, minlength=w)
        hold = np.array([self.cpu_per_msg[f] for f in fns]) * (1 + self.handoff * (threads[on] - 1))
        service = np.array([self.service_s[f] for f in fns])
        held = per_msg * hold  # the lock's busy share per unit of r
        lock = np.bincount(on, weights=held, minlength=w)
        residual = np.bincount(on, weights=held * hold / 2, minlength=w)
        others, others_residual = lock[on] - held, residual[on] - held * hold / 2
        # busy(r) = r p s + r^2 p R / (1 - r A) = 1, times (1 - r A): (p R - p s A) r^2 + (p s + A) r - 1 = 0
        qa = per_msg * (others_residual - service * others)
        qb = per_msg * service + others
        root = 2.0 / (qb + np.sqrt(np.maximum(qb * qb + 4.0 * qa, 0.0)))
        per_worker = np.where(lock > 0, 1.0 / np.maximum(lock, 1e-300), math.inf)
        np.minimum.at(per_worker, on, root)
        j = int(np.argmin(per_worker))
        return float(per_worker[j]), j

    def to_json(self) -> dict:
        return {
            "slots": self.slots,
            "cpu_per_msg": dict(self.cpu_per_msg),
            "service_s": dict(self.service_s),
            "handoff": self.handoff,
            "fit_error": self.fit_error,
            "probe": [{**p.__dict__, "bound": p.bound} for p in self.points],
        }


def balanced(threads: int, gains: Mapping[str, float], rates: Mapping[str, float], order: Sequence[str]) -> dict[str, int]:
    """`threads` instances spread so each function's linear capacity (instances x rate) covers its
    share of the load as evenly as possible: one each, then the next to the least covered."""
    k = {f: 1 for f in order}
    for _ in range(threads - len(order)):
        f = min(order, key=lambda g: k[g] * rates[g] / max(gains[g], 1e-12))
        k[f] += 1
    return k


def per_message(run: RunResult, measure: str) -> dict[str, float] | None:
    """Each function's seconds of `measure` ("cpu_s": the lock's hold; "busy_s": time in process()) per
    message from one run's readings (None where a testbed has none)."""
    out = {}
    for name, fm in run.functions.items():
        processed = sum(i.processed for i in fm.instances)
        seconds = sum(getattr(i, measure) for i in fm.instances)
        if processed <= 0 or seconds <= 0:
            return None
        out[name] = seconds / processed
    return out


def fit_handoff(points: Sequence[ProbePoint], model: WorkerCeiling, gains: Mapping[str, float]) -> tuple[float, float]:
    """The hand-off cost whose model best reproduces the probe's one-worker MSTs, and its rms relative error."""
    best = (math.inf, 0.0)
    for c in HANDOFFS:
        trial = replace(model, handoff=float(c), points=())
        err = sum((trial.rate(p.parallelism, gains, workers=1)[0] / p.one_worker - 1) ** 2 for p in points)
        if err < best[0]:
            best = (err, float(c))
    return best[1], math.sqrt(best[0] / len(points))


def probe_workers(
    testbed: Testbed, slots: int, gains: Mapping[str, float], rates: Mapping[str, float], settings: MstSettings = MstSettings()
) -> tuple[WorkerCeiling | None, tuple[ProbePoint, ...]]:
    """One worker against t workers for t = functions .. slots; the lock model if a worker bound any."""
    order = testbed.functions()
    points: list[ProbePoint] = []
    cpu: list[dict[str, float]] = []
    service: list[dict[str, float]] = []
    for t in range(len(order), slots + 1):
        par = balanced(t, gains, rates, order)
        one = measure_mst(testbed, TestConfig(dict(par), workers=1), settings)
        across = measure_mst(testbed, TestConfig(dict(par), workers=t), settings)
        ref, alone = one.last or one.failing, across.last or across.failing
        per_msg = per_message(ref, "cpu_s") if ref is not None else None
        busy = per_message(alone, "busy_s") if alone is not None else None
        if per_msg is None or busy is None:
            return None, tuple(points)
        cpu.append(per_msg)
        service.append(busy)
        points.append(ProbePoint(t, par, one.mst, across.mst, one.runs + across.runs, one.testbed_s + across.testbed_s))
    if not any(p.bound for p in points):
        return None, tuple(points)
    median = lambda runs: {f: float(np.median([r[f] for r in runs])) for f in order}  # noqa: E731
    model = WorkerCeiling(slots, tuple(order), median(cpu), median(service), 0.0, tuple(points))
    handoff, error = fit_handoff(points, model, gains)
    return WorkerCeiling(slots, tuple(order), model.cpu_per_msg, model.service_s, handoff, tuple(points), error), tuple(points)
