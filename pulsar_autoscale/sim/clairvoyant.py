"""The clairvoyant lower bound (`simulate --policy clairvoyant`, simulator only).

It knows the workload's rate schedule ahead of time; interval by interval (each stretch of
constant rate; a smooth workload is cut into `slot_s` slots at their highest rate), it chooses
the fewest instances per function for which the p99 of the response time of the messages
published in that interval stays within the SLO; it starts them `lead_s` (the start latency plus
a margin) before the interval begins and keeps them until the interval's messages are done
(its evaluated drain time after the interval ends), so a step down never strands a backlog.

"Fewest" is found per interval by `minimal_parallelism`: from each function's smallest stable k,
add one instance where it lowers the p99 most until the SLO holds, then take back every instance
whose removal keeps it; `evaluate` judges an allocation by simulating that interval from empty:
Poisson arrivals at the rate, the app's service-time draws, every function a FIFO G/G/k station,
a message done when every copy has left the DAG; the SLO must hold in each of `replications`
seeded runs (common random numbers, so two allocations see the same arrivals and draws), so the
bound meets it on a typical seed, not only on average. The test suite checks that
no allocation one instance cheaper in any interval meets the SLO under the same evaluation.

The bound is for the per-interval SLO: a policy could spend less by letting one short interval
miss while the run's p99 stays within the SLO. Apps with fan-in are refused (a message's copies
would meet again).

The policy itself is pure: it holds the schedule and looks up `snapshot.time`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

import numpy as np

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies.base import Policy, Proposal
from pulsar_autoscale.sim.apps import SimApp
from pulsar_autoscale.sim.workloads import BurstWorkload, StepWorkload, Workload
from pulsar_autoscale.snapshot import Snapshot

LEAD_MARGIN_S = 0.5  # start this much earlier than the start latency strictly needs


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    rate: float


@dataclass(frozen=True)
class ClairvoyantConfig:
    # (start, end, ((function, k), ...)): held from start - lead_s to end (drain included)
    schedule: tuple[tuple[float, float, tuple[tuple[str, int], ...]], ...] = ()
    lead_s: float = 1.0 + LEAD_MARGIN_S  # start instances this long before the rate steps up
    max_parallelism: int = 15


class ClairvoyantPolicy(Policy):
    name = "clairvoyant"
    Config = ClairvoyantConfig
    fast = False  # it needs no signal

    def _at(self, t: float) -> dict[str, int]:
        """The most instances any interval held at t asks for."""
        out: dict[str, int] = {}
        for start, end, alloc in self.config.schedule:
            if start - self.config.lead_s <= t + 1e-9 and t < end - 1e-9:
                for fn, k in alloc:
                    out[fn] = max(out.get(fn, 0), k)
        return out

    def check_times(self) -> list[float]:
        """When an interval's instances must start, and when they may go."""
        return sorted({t for start, end, _ in self.config.schedule for t in (start - self.config.lead_s, end)})

    def decide(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], state: Any) -> Proposal:
        want = self._at(snapshot.time)
        targets = {fn: min(want.get(fn, k), self.config.max_parallelism) for fn, k in current.items()}
        return Proposal(
            targets,
            {fn: f"clairvoyant: k {k} for the intervals held at t={snapshot.time:.0f}s" for fn, k in targets.items()},
            state,
        )


def intervals(workload: Workload, slot_s: float = 60.0) -> list[Interval]:
    """Constant-rate stretches of a step or burst workload; other workloads in slots at their peak."""
    if isinstance(workload, StepWorkload):
        out, t = [], 0.0
        for length, rate in workload.steps:
            out.append(Interval(t, t + length, rate))
            t += length
        return out
    if isinstance(workload, BurstWorkload):
        edges = sorted({0.0, workload.duration_s, *(b[0] for b in workload.bursts), *(b[0] + b[1] for b in workload.bursts)})
        edges = [e for e in edges if e <= workload.duration_s]
        return [Interval(a, b, float(workload.rate_at(np.array([a]))[0])) for a, b in zip(edges, edges[1:])]
    n = max(1, math.ceil(workload.duration_s / slot_s))
    out = []
    for i in range(n):
        a, b = i * slot_s, min((i + 1) * slot_s, workload.duration_s)
        out.append(Interval(a, b, float(workload.rate_at(np.linspace(a, b, 61)).max())))
    return out


def _tree(app: SimApp) -> tuple[AppGraph, dict[str, str | None]]:
    """The app graph and each function's one upstream function (None: fed by a source)."""
    graph = AppGraph.build(FunctionNode(f.name, f.inputs, f.output) for f in app.functions)
    parent = {}
    for f in app.functions:
        ups = list(graph.upstream(f.name))
        from_source = any(t in app.sources for t in f.inputs)
        if len(ups) + from_source != 1:
            raise ConfigError(f"clairvoyant: {f.name} has fan-in; only apps whose functions each read one upstream are supported")
        parent[f.name] = ups[0] if ups else None
    return graph, parent


def _station(arrivals: np.ndarray, service: np.ndarray, k: int) -> np.ndarray:
    """Departure time of each message at a FIFO station with k servers (arrivals in any order)."""
    order = np.argsort(arrivals, kind="stable")
    free = [0.0] * k
    out = np.empty_like(arrivals)
    for i in order.tolist():
        start = max(arrivals[i], heapq.heappop(free))
        out[i] = start + service[i]
        heapq.heappush(free, out[i])
    return out


def evaluate(app: SimApp, rate: float, length_s: float, k: Mapping[str, int], replications: int = 5, seed: int = 12345) -> float:
    """The highest p99 response time (s) over the replications of `app` at `rate` for `length_s` from
    empty, with parallelism `k`."""
    return _evaluate(app, rate, length_s, tuple(sorted(k.items())), replications, seed)[0]


def drain_time(
    app: SimApp, rate: float, length_s: float, k: Mapping[str, int], replications: int = 5, seed: int = 12345
) -> float:
    """How long after the interval its last message is done (the longest over the replications)."""
    return _evaluate(app, rate, length_s, tuple(sorted(k.items())), replications, seed)[1]


@lru_cache(maxsize=4096)
def _evaluate(app: SimApp, rate: float, length_s: float, k: tuple, replications: int, seed: int) -> tuple[float, float]:
    graph, parent = _tree(app)
    ks = dict(k)
    services = {f.name: f.service for f in app.functions}
    leaves = [fn for fn in graph.topological_order() if not graph.downstream(fn)]
    p99, drain = 0.0, 0.0
    for r in range(replications):
        rng = np.random.default_rng([seed, r])
        n = int(rng.poisson(rate * length_s))
        if n == 0:
            continue
        t = np.sort(rng.uniform(0.0, length_s, n))
        done: dict[str, np.ndarray] = {}
        for fn in graph.topological_order():
            draws = services[fn].draw(rng, n)
            up = parent[fn]
            arrivals = t if up is None else done[up]
            done[fn] = _station(arrivals, draws, ks[fn])
        finished = np.max([done[fn] for fn in leaves], axis=0)
        p99 = max(p99, float(np.percentile(finished - t, 99)))
        drain = max(drain, float(finished.max()) - length_s)
    return p99, drain


def minimal_parallelism(
    app: SimApp, rate: float, length_s: float, slo_s: float, k_max: int = 15, replications: int = 5
) -> dict[str, int]:
    """The fewest instances per function whose p99 over the interval meets `slo_s` (see the module text)."""
    k = {f.name: min(max(1, math.floor(rate * f.service.expected) + 1), k_max) for f in app.functions}

    def p99(alloc):
        return evaluate(app, rate, length_s, alloc, replications)

    while p99(k) > slo_s:
        options = [(p99({**k, fn: k[fn] + 1}), fn) for fn in k if k[fn] < k_max]
        if not options:
            break  # the SLO cannot be met within k_max: the bound runs at the maximum
        k[min(options)[1]] += 1
    for fn in sorted(k, key=lambda f: -k[f]):
        while k[fn] > 1 and p99({**k, fn: k[fn] - 1}) <= slo_s:
            k[fn] -= 1
    return k


def plan(
    app: SimApp, workload: Workload, slo_s: float, k_max: int = 15, replications: int = 5
) -> tuple[tuple[float, float, tuple[tuple[str, int], ...]], ...]:
    """The clairvoyant schedule: each interval's minimal allocation, from its start to its drain's end."""
    schedule = []
    for iv in intervals(workload):
        length = iv.end - iv.start
        k = minimal_parallelism(app, iv.rate, length, slo_s, k_max, replications)
        schedule.append((iv.start, iv.end + drain_time(app, iv.rate, length, k, replications), tuple(sorted(k.items()))))
    return tuple(schedule)


def clairvoyant_policy(app: SimApp, workload: Workload, slo_s: float, start_s: float, k_max: int = 15) -> ClairvoyantPolicy:
    return ClairvoyantPolicy(ClairvoyantConfig(plan(app, workload, slo_s, k_max), start_s + LEAD_MARGIN_S, k_max))
