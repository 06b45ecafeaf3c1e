"""Arrival processes for the simulator: a rate schedule turned into Poisson arrival times, or a trace.

Every workload is a typed dataclass with `duration_s`, `rate_at(t)` (messages/s, vectorized) and
`arrival_times(rng)`. Rate schedules become non-homogeneous Poisson arrivals by thinning, so one
code path serves steps, sines, bursts and ramps alike.

The presets are sized for the `paper-image` app (recognition: 0.25 s mean service, so one instance
serves 4 msg/s): rates in msg/s, λ/μ of the slow function in brackets.

- `paper`: six 10-minute constant-rate intervals stepping up and down as in the paper's Fig. 4:
  4, 8, 14, 10, 6, 12 msg/s [1, 2, 3.5, 2.5, 1.5, 3]. The paper prints no rates; this is our
  reading of the shape, with the peak chosen so that a backlog-driven policy tops out at about
  7 instances in all, as the paper's threshold run did.
- `sine`: 8 ± 6 msg/s, 20-minute period, one hour.
- `burst`: 4 msg/s stable load with Sponge's spikes: 5x (20 msg/s) for 60 s at t=600 s and
  10x (40 msg/s) for 60 s at t=1200 s, 30 minutes in all.
- `ramp`: linear 2 -> 16 msg/s over 30 minutes and back down over 30 minutes.
- `trace:FILE`: a CSV of `time,rate` rows (piecewise-constant rate from each time on; the last row
  ends the trace) or of single `timestamp` rows (exact arrival times, shifted to start at 0).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from pulsar_autoscale.errors import ConfigError


class Workload(Protocol):
    @property
    def duration_s(self) -> float: ...

    def rate_at(self, t: np.ndarray) -> np.ndarray: ...

    def arrival_times(self, rng: np.random.Generator) -> np.ndarray: ...


class _RateSchedule:
    """Poisson arrivals for any rate function, by thinning a homogeneous process at the peak rate."""

    if TYPE_CHECKING:  # a field of some subclasses, a property of others

        @property
        def duration_s(self) -> float: ...

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @property
    def peak_rate(self) -> float:
        grid = np.linspace(0.0, self.duration_s, 20001)
        return float(self.rate_at(grid).max())

    def arrival_times(self, rng: np.random.Generator) -> np.ndarray:
        peak = self.peak_rate
        if peak <= 0:
            return np.empty(0)
        n = rng.poisson(peak * self.duration_s)
        t = np.sort(rng.uniform(0.0, self.duration_s, n))
        keep = rng.uniform(0.0, peak, n) < self.rate_at(t)
        return t[keep]


@dataclass(frozen=True)
class StepWorkload(_RateSchedule):
    """Constant-rate intervals: ((duration_s, rate), ...)."""

    steps: tuple[tuple[float, float], ...]

    @property
    def duration_s(self) -> float:
        return float(sum(d for d, _ in self.steps))

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        edges = np.cumsum([d for d, _ in self.steps])
        rates = np.array([r for _, r in self.steps] + [0.0])
        return rates[np.searchsorted(edges, np.asarray(t, dtype=float), side="right")]


@dataclass(frozen=True)
class SineWorkload(_RateSchedule):
    base: float
    amplitude: float
    period_s: float
    duration_s: float

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        return np.maximum(self.base + self.amplitude * np.sin(2 * np.pi * np.asarray(t) / self.period_s), 0.0)


@dataclass(frozen=True)
class BurstWorkload(_RateSchedule):
    """A stable rate with spikes: ((start_s, length_s, factor), ...)."""

    base: float
    bursts: tuple[tuple[float, float, float], ...]
    duration_s: float

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=float)
        rate = np.full(t.shape, self.base)
        for start, length, factor in self.bursts:
            rate[(t >= start) & (t < start + length)] = self.base * factor
        return rate


@dataclass(frozen=True)
class RampWorkload(_RateSchedule):
    """Linear from `low` to `high` over `up_s`, then back to `low` over `down_s`."""

    low: float
    high: float
    up_s: float
    down_s: float

    @property
    def duration_s(self) -> float:
        return self.up_s + self.down_s

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        return np.interp(t, [0.0, self.up_s, self.duration_s], [self.low, self.high, self.low])


@dataclass(frozen=True)
class TimestampTrace:
    """Exact arrival times from a trace; the same for every seed."""

    times: tuple[float, ...]

    @property
    def duration_s(self) -> float:
        return float(self.times[-1]) if self.times else 0.0

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        """Arrivals per second in the surrounding second (for plots and efficiency only)."""
        times = np.asarray(self.times)
        t = np.asarray(t, dtype=float)
        return (np.searchsorted(times, t + 0.5) - np.searchsorted(times, t - 0.5)).astype(float)

    def arrival_times(self, rng: np.random.Generator) -> np.ndarray:
        return np.asarray(self.times, dtype=float)


PRESETS: dict[str, Workload] = {
    "paper": StepWorkload(tuple((600.0, r) for r in (4.0, 8.0, 14.0, 10.0, 6.0, 12.0))),
    # The live demo's default load (`pulsar-autoscale demo`): 48 s intervals, for simulator validation.
    "demo": StepWorkload(tuple((48.0, r) for r in (4.0, 12.0, 28.0, 12.0, 4.0))),
    "sine": SineWorkload(base=8.0, amplitude=6.0, period_s=1200.0, duration_s=3600.0),
    "burst": BurstWorkload(base=4.0, bursts=((600.0, 60.0, 5.0), (1200.0, 60.0, 10.0)), duration_s=1800.0),
    "ramp": RampWorkload(low=2.0, high=16.0, up_s=1800.0, down_s=1800.0),
}


def load_workload(spec: str) -> Workload:
    """A preset name or `trace:FILE`."""
    if spec.startswith("trace:"):
        return load_trace(Path(spec[len("trace:") :]))
    try:
        return PRESETS[spec]
    except KeyError:
        raise ConfigError(f"unknown workload {spec!r}: use one of {', '.join(PRESETS)} or trace:FILE") from None


def load_trace(path: Path) -> Workload:
    try:
        with path.open(newline="") as fh:
            rows = [r for r in csv.reader(fh) if r and not r[0].lstrip().startswith("#")]
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc.strerror}") from exc
    try:
        float(rows[0][0])
    except (IndexError, ValueError):
        rows = rows[1:]  # a header row
    if not rows:
        raise ConfigError(f"trace {path} has no rows: expected `time,rate` or `timestamp` lines")
    try:
        values = [[float(x) for x in r] for r in rows]
    except ValueError as exc:
        raise ConfigError(f"trace {path}: {exc}; expected numbers in `time,rate` or `timestamp` rows") from exc
    if all(len(v) == 1 for v in values):
        stamps = np.sort([v[0] for v in values])
        return TimestampTrace(tuple(float(x) for x in stamps - stamps[0]))
    if any(len(v) != 2 for v in values):
        raise ConfigError(f"trace {path}: every row needs the same shape, `time,rate` or `timestamp`")
    times = [v[0] for v in values]
    if any(b <= a for a, b in zip(times, times[1:])) or any(v[1] < 0 for v in values):
        raise ConfigError(f"trace {path}: times must increase and rates be >= 0")
    steps = tuple((b - a, v[1]) for a, b, v in zip(times, times[1:], values))
    if times[0] > 0:
        steps = ((times[0], 0.0),) + steps
    return StepWorkload(steps)
