"""What the Monitor hands to a policy: one typed record per function, measured over a window.

A figure that could not be measured is None ("unknown"), never a made-up zero:
a policy must be able to tell "no arrivals" from "no data".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class FunctionSnapshot:
    """Figures for one function (fully qualified name tenant/namespace/name) over the window."""

    name: str
    parallelism: int  # instances configured now
    arrival_rate: float | None = None  # lambda: messages/s arriving on all inputs
    backlog: float | None = None  # Q: messages waiting on the function's subscription (all inputs)
    service_rate: float | None = None  # mu: messages/s one instance completes while busy (1 / mean service time)
    ca2: float | None = None  # squared coefficient of variation of inter-arrival times
    cs2: float | None = None  # squared coefficient of variation of service times
    processing_rate: float | None = None  # observed messages/s processed by all instances
    output_rate: float | None = None  # observed messages/s emitted by all instances
    true_processing_rate: float | None = None  # DS2: per instance, messages processed per busy second
    true_output_rate: float | None = None  # DS2: per instance, messages emitted per busy second
    utilization: float | None = None  # busy share of instance time, 0..1 (averaged over instances)
    running: int | None = None  # instances actually running (may lag parallelism)
    age_s: float | None = None  # how old the freshest figure is, seconds


CHECKS = ("period", "fast")


@dataclass(frozen=True)
class Snapshot:
    """All functions at one MAPE period. `time` is the monitor's clock (wall or simulated), seconds.

    `check` says which check asks: "period" (the regular period, every figure over `window_s`) or
    "fast" (controller.fast: a scale-out-only check every few seconds on the consumers' own
    counters over a short window; arrival rate and backlog measured at the consumer).
    """

    time: float
    window_s: float
    functions: Mapping[str, FunctionSnapshot] = field(default_factory=dict)
    check: str = "period"

    def __getitem__(self, name: str) -> FunctionSnapshot:
        return self.functions[name]


@dataclass(frozen=True)
class FunctionCounters:
    """Cumulative counts for one function since it started (drained instances included).

    The live Monitor reads them from the worker and the broker; the simulator keeps
    them itself. Both turn two readings into a FunctionSnapshot with `window_snapshot`,
    so a policy sees the same figures in both.
    """

    time: float  # when read, seconds (same clock as Snapshot.time)
    arrived: float | None  # messages published to the inputs (broker in-counter); None if unknown
    received: float = 0.0
    processed: float = 0.0
    outputs: float = 0.0
    busy_s: float = 0.0  # sum of processing times
    busy_sq_s2: float = 0.0  # sum of squared processing times
    interarrival_n: float = 0.0  # number of inter-arrival gaps observed
    interarrival_s: float = 0.0  # sum of gaps
    interarrival_sq_s2: float = 0.0
    wait_s: float = 0.0  # sum over received messages of receive time - publish time
    newest_publish_s: float | None = None  # newest publish time among received messages (None: none yet)


@dataclass(frozen=True)
class InputReading:
    """A function's input topics at one time as a stock broker's topic stats report them, summed
    over the inputs (stock mode reads no consumer counters of its own)."""

    time: float
    rate_in: float  # msgRateIn: the broker's rate over its last stats interval (60 s by default)
    in_counter: float  # msgInCounter: messages published since the topics were loaded
    backlog: float | None  # msgBacklog of the function's subscription (None: not subscribed on some input)


def _scv(n: float, total: float, total_sq: float) -> float | None:
    """Squared coefficient of variation from count, sum and sum of squares."""
    if n < 2 or total <= 0:
        return None
    mean = total / n
    var = max(total_sq / n - mean * mean, 0.0)
    return var / (mean * mean)


def window_snapshot(
    name: str,
    parallelism: int,
    prev: FunctionCounters | None,
    cur: FunctionCounters,
    backlog: float | None,
    running: int | None = None,
    age_s: float | None = None,
) -> FunctionSnapshot:
    """Rates and variabilities over the window between two counter readings."""
    if prev is None or cur.time <= prev.time:
        return FunctionSnapshot(name=name, parallelism=parallelism, backlog=backlog, running=running, age_s=age_s)
    dt = cur.time - prev.time
    processed = cur.processed - prev.processed
    outputs = cur.outputs - prev.outputs
    busy = cur.busy_s - prev.busy_s
    arrival_rate = None
    if cur.arrived is not None and prev.arrived is not None:
        arrival_rate = max(cur.arrived - prev.arrived, 0.0) / dt
    instances = running if running else parallelism
    mean_service = busy / processed if processed > 0 else None
    return FunctionSnapshot(
        name=name,
        parallelism=parallelism,
        arrival_rate=arrival_rate,
        backlog=backlog,
        service_rate=(1.0 / mean_service) if mean_service else None,
        ca2=_scv(
            cur.interarrival_n - prev.interarrival_n,
            cur.interarrival_s - prev.interarrival_s,
            cur.interarrival_sq_s2 - prev.interarrival_sq_s2,
        ),
        cs2=_scv(processed, busy, cur.busy_sq_s2 - prev.busy_sq_s2),
        processing_rate=processed / dt,
        output_rate=outputs / dt,
        true_processing_rate=(processed / busy) if busy > 0 else None,
        true_output_rate=(outputs / busy) if busy > 0 else None,
        utilization=min(busy / (dt * instances), 1.0) if instances else None,
        running=running,
        age_s=age_s,
    )
