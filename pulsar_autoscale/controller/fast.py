"""The fast path: a scale-out-only check every `period_s` (1 s) beside the regular period.

At the regular period a burst can be a whole period old before any policy sees it; the fast
check sees it within seconds because it reads what the consumers themselves count, not the
broker's gauges (pulsar-lite refreshes those every 5 s):

- arrival rate measured at the consumer: messages received over the window divided by how far
  the newest publish time among them moved (FIFO: while a function falls behind, it receives
  messages published in a shorter span than the window, so this is the rate they arrived at,
  not the rate it manages to take them);
- backlog by Little's law: that arrival rate times the mean publish-to-receive wait of the
  messages received in the window (the wait includes the receiver queue, so prefetch counts);
- service rate, c_s^2 and utilization from the same counters over the longer `service_window_s`:
  how long a message takes does not change with a burst, and over a 2 s window it is noisy in
  the very direction that trips the check (a run of slow messages is what makes a queue grow).

The policy is called with `Snapshot.check == "fast"` and these figures over `window_s`. What it
proposes goes through the same Plan step, the same epoch fencing and the decision log (`kind:
fast`), with two rules of its own, so that noise in a short window cannot cause flapping:

1. scale-out only, and only for a function that is falling behind: its consumer-measured
   arrival rate is at least `rho` of what its instances complete (lambda >= rho k mu) and its
   backlog would keep them all busy for `backlog_s` (Q >= backlog_s k mu). Both are needed: a
   short window's rate alone is noisy (one second at 14 msg/s is +-27%), a backlog alone
   also rises when a function is just slow; every other proposal keeps the current parallelism;
2. the policy's state is not kept: memory (a forecast, hysteresis counters) advances at the
   regular period only, in that period's units.

Stock Pulsar (`mode: stock`) has no consumer wait or publish-time counters, so there the arrival
rate and backlog come from the broker's topic stats of the function's inputs (`topic_snapshot`):
the arrival rate from msgInCounter over the window (msgRateIn, the broker's rate over its last
stats interval, 60 s by default, only for a first reading or after the counter restarted with a
topic reload), the backlog as its subscription's msgBacklog (counted by the broker at each
request); the service rate as above, from FunctionStats (avgProcessLatency x processed).

Scale-in stays with the regular period, after the Plan step's stabilization window, which the
fast path raises to at least one metrics window, and after a hold on each fast scale-out of one metrics
window plus one period (`stabilization`): a fast scale-out is not undone by a period whose window
still holds the time before the burst, only by one that sees that the load has fallen.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from pulsar_autoscale.admin.api import FunctionsApi, TopicFigures
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.policies.base import Proposal
from pulsar_autoscale.snapshot import FunctionCounters, FunctionSnapshot, InputReading, Snapshot, window_snapshot


@dataclass(frozen=True)
class FastConfig:
    enabled: bool = False
    period_s: float = 1.0  # how often the fast check runs
    window_s: float = 2.0  # arrival rate and backlog: the consumers' counters over this window
    service_window_s: float = 30.0  # service rate and c_s^2: over this longer window
    rho: float = 0.9  # act only where lambda >= rho k mu at the current parallelism k
    backlog_s: float = 1.0  # ... and the backlog holds at least this many seconds of work for k instances

    def __post_init__(self):
        if self.period_s <= 0 or self.window_s < self.period_s or self.service_window_s < self.window_s:
            raise ConfigError(
                f"fast.period_s must be > 0 and period_s <= window_s <= service_window_s, got "
                f"{self.period_s}, {self.window_s} and {self.service_window_s}"
            )
        if self.rho <= 0:
            raise ConfigError(f"fast.rho must be > 0, got {self.rho}")
        if self.backlog_s < 0:
            raise ConfigError(f"fast.backlog_s must be >= 0, got {self.backlog_s}")

    def stabilization(self, plan: Mapping, period_s: float, window_s: float | None = None) -> dict:
        """Plan settings with the fast path on: scale in only to the highest recommendation over a metrics
        window (`window_s`, default the period; at least one period), and not below a fast scale-out until a
        period's window lies after it, one period more for the broker's gauges to catch up."""
        out = dict(plan)
        if self.enabled:
            window = max(window_s if window_s is not None else period_s, period_s)
            out["scale_in_stabilization_s"] = max(float(out.get("scale_in_stabilization_s", 0.0)), window)
            out["fast_scale_in_hold_s"] = max(float(out.get("fast_scale_in_hold_s", 0.0)), window + period_s)
        return out


def consumer_snapshot(
    name: str,
    parallelism: int,
    prev: FunctionCounters | None,
    cur: FunctionCounters,
    running: int | None,
    service_prev: FunctionCounters | None = None,
) -> FunctionSnapshot:
    """The fast check's figures for one function, from readings of its consumers' counters: `prev`
    one short window ago, `service_prev` (default `prev`) one service window ago."""
    base = window_snapshot(name, parallelism, service_prev or prev, replace(cur, arrived=None), None, running, age_s=0.0)
    if prev is None or cur.newest_publish_s is None:
        return base
    received = cur.received - prev.received
    if received <= 0:  # nothing taken in the window: either idle or stuck; what was processed says which
        return replace(base, arrival_rate=0.0 if cur.processed == prev.processed else None, backlog=None)
    span = cur.newest_publish_s - (prev.newest_publish_s if prev.newest_publish_s is not None else cur.time)
    dt = cur.time - prev.time
    # the publish span can be shorter than the window (falling behind) but is at least one gap
    rate = received / max(span, dt / (received + 1), 1e-3) if span > 0 else received / dt
    wait = (cur.wait_s - prev.wait_s) / received
    return replace(base, arrival_rate=rate, backlog=rate * max(wait, 0.0))


def falling_behind(fs: FunctionSnapshot | None, k: int, config: FastConfig) -> bool:
    if fs is None or fs.arrival_rate is None or fs.backlog is None or not fs.service_rate or k < 1:
        return False
    capacity = k * fs.service_rate
    return fs.arrival_rate >= config.rho * capacity and fs.backlog >= config.backlog_s * capacity


def admit(proposal: Proposal, snapshot: Snapshot, current: Mapping[str, int], config: FastConfig) -> Proposal:
    """Keep a fast proposal's scale-outs for functions falling behind; everything else keeps its
    parallelism. The returned state is None: the caller keeps the policy's state of the last period."""
    targets, reasons = {}, {}
    for fn, k in current.items():
        want = proposal.targets.get(fn, k)
        fs = snapshot.functions.get(fn)
        if want > k and fs is not None and falling_behind(fs, k, config):
            targets[fn] = want
            reasons[fn] = (
                f"fast: lambda {fs.arrival_rate:.1f}/s, backlog {fs.backlog:.0f} vs {k} x mu "
                f"{fs.service_rate:.2f}/s; {proposal.reasons.get(fn, '')}"
            )
        else:
            targets[fn] = k
    return Proposal(targets, reasons, None)


def topic_snapshot(fs: FunctionSnapshot, prev: InputReading | None, cur: InputReading | None) -> FunctionSnapshot:
    """Stock mode: `fs` (service figures from FunctionStats) with the arrival rate and backlog of
    the broker's topic stats, `prev` one window before `cur`."""
    if cur is None:
        return fs
    rate = cur.rate_in
    if prev is not None and cur.time > prev.time and cur.in_counter >= prev.in_counter:
        rate = (cur.in_counter - prev.in_counter) / (cur.time - prev.time)
    return replace(fs, arrival_rate=rate, backlog=cur.backlog)


def topic_window(
    fs: FunctionSnapshot, readings: deque, cur: InputReading | None, now: float, config: FastConfig
) -> FunctionSnapshot:
    """topic_snapshot against the newest of a function's past input readings (oldest first) at or before
    one window ago, which it then trims and extends with `cur` (stock mode: the live FastMonitor, the simulator)."""
    prev = _windowed(readings, now, config.window_s, config.window_s)[0]
    if cur is not None:
        readings.append(cur)
    return topic_snapshot(fs, prev, cur)


def _windowed(readings: deque, now: float, keep_s: float, window_s: float):
    """Drop readings older than `keep_s` (keeping one at or before it); the newest reading at or
    before `window_s` ago, else the oldest (a shorter first window), and the oldest; None if none."""
    while len(readings) > 1 and readings[1].time <= now - keep_s + 1e-9:
        readings.popleft()
    short = None
    for r in readings:
        if r.time <= now - window_s + 1e-9:
            short = r
    oldest = readings[0] if readings else None
    return short or oldest, oldest


def window_readings(
    name: str, parallelism: int, readings: deque, cur: FunctionCounters, running: int | None, config: FastConfig
) -> FunctionSnapshot:
    """consumer_snapshot from a function's past readings (oldest first), which it then trims and extends."""
    short, oldest = _windowed(readings, cur.time, config.service_window_s, config.window_s)
    fs = consumer_snapshot(name, parallelism, short, cur, running, oldest)
    readings.append(cur)
    return fs


class FastMonitor:
    """The live fast check's eyes: each function's consumer counters from the worker's stats (our
    worker sums its instances' counters; process instances report every 0.25 s), kept over the
    fast window. The graph and parallelism come from the last regular period and the fast
    decisions since; no config is re-read between periods."""

    def __init__(self, admin: FunctionsApi, config: FastConfig):
        self.admin = admin
        self.config = config
        self._history: dict[str, deque] = {}
        self._inputs: dict[str, deque] = {}  # stock mode: each function's InputReadings

    def observe(
        self, current: Mapping[str, int], now: float, inputs: Mapping[str, tuple[Sequence[str], str]] | None = None
    ) -> tuple[Snapshot, list[str]]:
        """`inputs`: function -> (input topics, subscription), as the last period saw them; stock
        mode reads the arrival rate and backlog from those topics' stats."""
        # imported here: the simulator uses this module and needs no REST client
        from pulsar_autoscale.admin.client import AdminError
        from pulsar_autoscale.controller.monitor import counters_from_stats

        functions, errors = {}, []
        figures = self.admin if isinstance(self.admin, TopicFigures) else None
        stock = figures is not None
        for fn, k in current.items():
            tenant, namespace, name = fn.split("/")
            reading = None
            try:
                if figures is not None:  # no consumer wait counters: FunctionStats, and topic stats for the inputs
                    cur, running = figures.counters_and_running(tenant, namespace, name, now)
                    if inputs and fn in inputs:
                        reading = figures.input_reading(*inputs[fn], now)
                else:
                    cur, running = counters_from_stats(self.admin.stats(tenant, namespace, name), now)
            except (AdminError, KeyError, TypeError) as exc:
                errors.append(f"{fn}: stats unreadable: {exc}")
                continue
            readings = self._history.setdefault(fn, deque())
            functions[fn] = window_readings(fn, k, readings, cur, running, self.config)
            if stock:
                functions[fn] = topic_window(functions[fn], self._inputs.setdefault(fn, deque()), reading, now, self.config)
        for history in (self._history, self._inputs):
            for gone in set(history) - set(current):
                del history[gone]
        return Snapshot(time=now, window_s=self.config.window_s, functions=functions, check="fast"), errors
