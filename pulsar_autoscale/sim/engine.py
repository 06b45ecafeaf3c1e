"""Discrete-event simulator (SimPy) of an app DAG under a workload, scaled by the live controller's code.

Each function is a station: a FIFO backlog (its subscription) in front of k instances that serve
one message at a time with service times from the app's distribution. A new instance serves after
`start_s`; a removed one finishes its message first (our restart-free runtime). With `restart_s > 0`
every parallelism update behaves like stock Pulsar: all instances stop at once, their in-flight
messages go back to the head of the backlog (redelivered), and the new set serves after `restart_s`.

The MAPE loop reads cumulative FunctionCounters per function each period, turns two readings into
a Snapshot with `snapshot.window_snapshot` (as the live Monitor does; window = period, as in the
paper) and calls `Autoscaler.step`: the same policy objects and Plan step as the controller.

A message carries its source publish time. A source message is complete when every copy of it
(fan-out makes several) has left the DAG; response time = that moment - publish time, i.e. the
slowest path, which in `paper-image` is the recognition path the paper reports. Backlog counts
waiting plus in-flight messages, as Pulsar's msgBacklog counts unacknowledged ones.

Fast path (the autoscaler's FastConfig enabled): every `fast.period_s` the consumers' own
counters (received, publish-to-receive wait, newest publish time: exact and current, as the
worker's are) over `fast.window_s` become a `check="fast"` Snapshot through
controller.fast.consumer_snapshot, the code the live Monitor uses; the broker's gauges play no part.
In stock mode (`restart_s` > 0) there are no such consumer counters: as the live FastMonitor does
there (controller.fast.topic_window), the arrival rate comes from the input's msgInCounter over the
fast window and the backlog from its subscription's msgBacklog, both counted by the broker at each
request (exact here); msgRateIn, used only for a first reading, is the mean rate since the start.

Warm pool (`warm_pool` > 0): each function keeps that many standby instances; a scale-out takes
them first, and they serve after `warm_start_s` instead of `start_s`; a taken standby is replaced
by a cold start in the background. Standbys count as `standby_weight` of an instance each in
instance-seconds (reported apart as standby_instance_seconds and included in instance_seconds).

A policy with a `check_times()` method (the clairvoyant bound, sim.clairvoyant) is also
asked at those times, beside the period: it knows when the rate steps.

Random streams: one numpy Generator per station and one for arrivals, all from `seed`, so two
policies run on the same seed see the same arrivals and the same per-station service draws.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import simpy

from pulsar_autoscale.controller.autoscaler import Autoscaler
from pulsar_autoscale.controller.fast import topic_window, window_readings
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.sim.apps import SimApp, SimFunction
from pulsar_autoscale.sim.results import SimResult, SimSeries
from pulsar_autoscale.sim.workloads import Workload
from pulsar_autoscale.snapshot import FunctionCounters, InputReading, Snapshot, window_snapshot

_DRAW_BLOCK = 4096


@dataclass(frozen=True)
class SimConfig:
    period_s: float = 30.0  # MAPE period and metrics window (paper: 30 s)
    start_s: float = 1.0  # a new instance's start latency (our runtime)
    restart_s: float = 0.0  # > 0: stock Pulsar, every update stops all instances for this long
    initial_parallelism: int = 1
    slo_s: float = 1.0  # R_max for the SLO violation share (paper: 1 s)
    drain_limit_s: float = 3600.0  # after the workload ends, at most this long to drain the backlogs
    # > 0: the broker's figures (arrivals, backlog) are gauges refreshed this often, as pulsar-lite's
    # are (about 5 s); the worker's counters stay exact. 0: the monitor reads exact counts.
    gauge_refresh_s: float = 0.0
    warm_pool: int = 0  # standby instances per function (0: none)
    warm_start_s: float = 0.05  # a standby's start latency when a scale-out takes it
    standby_weight: float = 0.25  # a standby's cost as a share of a running instance
    seed: int = 0


class _Instance:
    __slots__ = ("proc", "msg", "wake", "stopping", "running")

    def __init__(self):
        self.proc = None
        self.msg = None
        self.wake = None
        self.stopping = False
        self.running = False


class _Station:
    """One function: backlog, instances, and the cumulative counters the monitor reads.

    The backlog holds (enqueue time, job) items: the enqueue time is the message's publish time on
    this function's input topic, from which its consumers measure their wait and arrival rate."""

    # set by Simulation._mape before the first period (gauge also by Simulation._gauges)
    prev_seen: FunctionCounters
    gauge: tuple[float, float]

    def __init__(self, sim: "Simulation", fn: SimFunction, rng: np.random.Generator, parallelism: int):
        self.sim, self.env, self.fn, self.rng = sim, sim.env, fn, rng
        self.queue: deque = deque()
        self.idle: list[_Instance] = []
        self.instances: list[_Instance] = []  # alive (starting, running or draining), oldest first
        self.parallelism = parallelism
        self.downstream: list[_Station] = []
        self.draws = np.empty(0)
        self.draw_i = 0
        self.arrived = self.received = self.processed = 0
        self.busy = self.busy_sq = 0.0
        self.ia_n = 0
        self.ia_s = self.ia_sq = 0.0
        self.last_arrival: float | None = None
        self.wait_s = 0.0
        self.newest_publish: float | None = None
        self.standby_ready = sim.config.warm_pool
        self.redelivered = 0
        self.alive_since = 0.0
        self.instance_seconds = 0.0
        self.prev: FunctionCounters | None = None
        self._start(parallelism, 0.0)

    # ---- instances -------------------------------------------------------------------------
    def _account(self) -> None:
        now = self.env.now
        self.instance_seconds += len(self.instances) * (now - self.alive_since)
        self.alive_since = now

    def _start(self, n: int, delay: float) -> None:
        self._account()
        for _ in range(n):
            inst = _Instance()
            self.instances.append(inst)
            inst.proc = self.env.process(self._serve(inst, delay))

    def _serve(self, inst: _Instance, delay: float):
        env = self.env
        try:
            if delay > 0:
                yield env.timeout(delay)
            inst.running = True
            while not inst.stopping:
                if self.queue:
                    msg = self.queue.popleft()
                else:
                    inst.wake = env.event()
                    self.idle.append(inst)
                    msg = yield inst.wake
                    inst.wake = None
                    if msg is None:
                        break
                inst.msg = msg
                self.received += 1
                self.wait_s += env.now - msg[0]
                if self.newest_publish is None or msg[0] > self.newest_publish:
                    self.newest_publish = msg[0]
                s = self._draw()
                yield env.timeout(s)
                inst.msg = None
                self._complete(msg[1], s)
        except simpy.Interrupt:
            self._hand_back(inst)
        self._account()
        self.instances.remove(inst)

    def _hand_back(self, inst: _Instance) -> None:
        """A stopped instance's message (in service, or handed to it but not yet taken) is redelivered."""
        msg = inst.msg
        if inst.wake is not None:
            if inst.wake.triggered:
                msg = inst.wake.value
            else:
                self.idle.remove(inst)
        if msg is not None:
            self.queue.appendleft(msg)
            self.redelivered += 1
        inst.msg = inst.wake = None

    def _draw(self) -> float:
        if self.draw_i >= len(self.draws):
            self.draws = self.fn.service.draw(self.rng, _DRAW_BLOCK)
            self.draw_i = 0
        self.draw_i += 1
        return float(self.draws[self.draw_i - 1])

    def scale(self, new: int, restart_s: float, start_s: float) -> None:
        if restart_s > 0:
            for inst in list(self.instances):
                inst.proc.interrupt("restart")
            self.parallelism = new
            self.env.process(self._restart(new, restart_s))
            return
        active = [i for i in self.instances if not i.stopping]
        if new > len(active):
            warm = min(new - len(active), self.standby_ready)
            if warm:
                self.standby_ready -= warm
                self._start(warm, self.sim.config.warm_start_s)
                self.env.process(self._refill(warm, start_s))
            self._start(new - len(active) - warm, start_s)
        for inst in active[new:]:
            inst.stopping = True
            if inst.wake is not None and not inst.wake.triggered:
                self.idle.remove(inst)
                inst.wake.succeed(None)
        self.parallelism = new

    def _refill(self, n: int, start_s: float):
        """Taken standbys are replaced by cold starts in the background."""
        yield self.env.timeout(start_s)
        self.standby_ready += n

    def _restart(self, new: int, restart_s: float):
        yield self.env.timeout(0)  # let the interrupted instances leave first
        self._start(new, restart_s)

    # ---- messages --------------------------------------------------------------------------
    def offer(self, job: list) -> None:
        now = self.env.now
        item = (now, job)
        self.arrived += 1
        if self.last_arrival is not None:
            gap = now - self.last_arrival
            self.ia_n += 1
            self.ia_s += gap
            self.ia_sq += gap * gap
        self.last_arrival = now
        if self.idle:
            inst = self.idle.pop()
            inst.wake.succeed(item)
        else:
            self.queue.append(item)

    def _complete(self, job: list, s: float) -> None:
        self.processed += 1
        self.busy += s
        self.busy_sq += s * s
        job[1] -= 1
        for g in self.downstream:
            job[1] += 1
            g.offer(job)
        if job[1] == 0:
            self.sim.job_done(job)

    # ---- what the monitor sees -------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return sum(1 for i in self.instances if i.msg is not None)

    @property
    def running(self) -> int:
        return sum(1 for i in self.instances if i.running and not i.stopping)

    def counters(self, now: float) -> FunctionCounters:
        return FunctionCounters(
            time=now,
            arrived=float(self.arrived),
            received=float(self.received),
            processed=float(self.processed),
            outputs=float(self.processed if self.fn.output else 0),
            busy_s=self.busy,
            busy_sq_s2=self.busy_sq,
            interarrival_n=float(self.ia_n),
            interarrival_s=self.ia_s,
            interarrival_sq_s2=self.ia_sq,
            wait_s=self.wait_s,
            newest_publish_s=self.newest_publish,
        )


class Simulation:
    """One run: build with the app, workload, autoscaler and config, then `run()` once."""

    def __init__(self, app: SimApp, workload: Workload, autoscaler: Autoscaler, config: SimConfig = SimConfig()):
        self.app, self.workload, self.autoscaler, self.config = app, workload, autoscaler, config
        self.env = simpy.Environment()
        seeds = np.random.SeedSequence(config.seed).spawn(len(app.functions) + 1)
        self.arrival_rng = np.random.default_rng(seeds[0])
        self.graph = AppGraph.build(FunctionNode(f.name, f.inputs, f.output) for f in app.functions)
        self.stations = {
            f.name: _Station(self, f, np.random.default_rng(s), config.initial_parallelism)
            for f, s in zip(app.functions, seeds[1:])
        }
        self.sources: list[_Station] = []
        for st in self.stations.values():
            st.downstream = [self.stations[g] for g in self.graph.downstream(st.fn.name)]
            if any(t in app.sources for t in st.fn.inputs):
                self.sources.append(st)
        self.produced = 0
        self.in_system = 0
        self.source_done = False
        self.drained = self.env.event()
        self.rt_time: list[float] = []
        self.rt: list[float] = []
        self.series = SimSeries(
            parallelism={n: [] for n in self.stations},
            running={n: [] for n in self.stations},
            backlog={n: [] for n in self.stations},
        )
        self.scaling_actions = 0
        self.fast_actions = 0
        self.policy_errors = 0
        self.lower_bound_instance_s = 0.0

    # ---- processes -------------------------------------------------------------------------
    def _source(self, times: np.ndarray):
        env = self.env
        for t in times.tolist():
            if t > env.now:
                yield env.timeout(t - env.now)
            job = [t, 0]
            self.produced += 1
            self.in_system += 1
            for st in self.sources:
                job[1] += 1
                st.offer(job)
            if job[1] == 0:
                self.job_done(job)
        self.source_done = True
        self._check_drained()

    def job_done(self, job: list) -> None:
        now = self.env.now
        self.rt_time.append(now)
        self.rt.append(now - job[0])
        self.in_system -= 1
        self._check_drained()

    def _check_drained(self) -> None:
        if self.source_done and self.in_system == 0 and not self.drained.triggered:
            self.drained.succeed()

    def _gauges(self):
        """The broker's view, refreshed every gauge_refresh_s (half a refresh out of phase with the periods)."""
        refresh = self.config.gauge_refresh_s
        yield self.env.timeout(refresh / 2)
        while True:
            for st in self.stations.values():
                st.gauge = (float(st.arrived), float(len(st.queue) + st.in_flight))
            yield self.env.timeout(refresh)

    def _mape(self):
        period = self.config.period_s
        for st in self.stations.values():
            st.prev = st.prev_seen = st.counters(0.0)
            st.gauge = (0.0, 0.0)
        while True:
            yield self.env.timeout(period)
            self._period(self.env.now, period)

    def _period(self, now: float, period: float) -> None:
        functions = {}
        source_arrivals = 0.0
        for name, st in self.stations.items():
            cur = st.counters(now)
            backlog = float(len(st.queue) + st.in_flight)
            prev = cast(FunctionCounters, st.prev)  # set by _mape before the first period
            # the simulator always counts arrivals (FunctionCounters allows None for the live monitor)
            lam = (cast(float, cur.arrived) - cast(float, prev.arrived)) / period
            seen, seen_backlog = cur, backlog
            if self.config.gauge_refresh_s > 0:
                seen, seen_backlog = replace(cur, arrived=st.gauge[0]), st.gauge[1]
            functions[name] = window_snapshot(name, st.parallelism, st.prev_seen, seen, seen_backlog, st.running, age_s=0.0)
            mu = 1.0 / st.fn.service.expected
            self.lower_bound_instance_s += max(1, math.ceil(lam / mu - 1e-9)) * period
            if st in self.sources:
                source_arrivals = lam
            st.prev, st.prev_seen = cur, seen
            self.series.parallelism[name].append(st.parallelism)
            self.series.running[name].append(st.running)
            self.series.backlog[name].append(backlog)
        self.series.time.append(now)
        self.series.arrival_rate.append(source_arrivals)
        self._check(Snapshot(time=now, window_s=period, functions=functions))

    def _check(self, snapshot: Snapshot) -> None:
        """One policy call through the Plan step, and its changes applied."""
        current = {n: st.parallelism for n, st in self.stations.items()}
        step = self.autoscaler.step(self.graph, snapshot, current, snapshot.time)
        if step.error:
            self.policy_errors += 1
        for d in step.decisions:
            if d.changed:
                self.scaling_actions += 1
                self.fast_actions += snapshot.check == "fast"
                self.series.actions.append((snapshot.time, snapshot.check, d.function))
                self.stations[d.function].scale(d.new, self.config.restart_s, self.config.start_s)

    def _fast(self):
        """The fast path: the consumers' counters over the fast window, every fast period (not at the
        instants the regular period runs)."""
        fast, period = self.autoscaler.fast, self.config.period_s
        history = {name: deque([st.counters(0.0)]) for name, st in self.stations.items()}
        topics = {name: deque() for name in self.stations} if self.config.restart_s > 0 else None
        while True:
            yield self.env.timeout(fast.period_s)
            now = self.env.now
            functions = {}
            for name, st in self.stations.items():
                functions[name] = window_readings(name, st.parallelism, history[name], st.counters(now), st.running, fast)
                if topics is not None:  # stock mode: the broker's topic stats of the input
                    reading = InputReading(
                        now, rate_in=st.arrived / now, in_counter=float(st.arrived), backlog=float(len(st.queue) + st.in_flight)
                    )
                    functions[name] = topic_window(functions[name], topics[name], reading, now, fast)
            if abs(now / period - round(now / period)) > 1e-9:
                self._check(Snapshot(time=now, window_s=fast.window_s, functions=functions, check="fast"))

    def _oracle(self, times: list[float]):
        """Checks at the times a policy that knows the workload asked for (sim.clairvoyant)."""
        for t in times:
            if t > self.env.now:
                yield self.env.timeout(t - self.env.now)
            self._check(Snapshot(time=self.env.now, window_s=self.config.period_s, functions={}))

    # ---- run ---------------------------------------------------------------------------------
    def run(self) -> SimResult:
        times = self.workload.arrival_times(self.arrival_rng)
        self.env.process(self._source(times))
        self.env.process(self._mape())
        if self.autoscaler.fast.enabled:
            self.env.process(self._fast())
        check_times = getattr(self.autoscaler.policy, "check_times", None)
        if check_times is not None:
            self.env.process(self._oracle(sorted({max(t, 0.0) for t in check_times()})))
        if self.config.gauge_refresh_s > 0:
            self.env.process(self._gauges())
        limit = self.env.timeout(self.workload.duration_s + self.config.drain_limit_s)
        self.env.run(until=self.env.all_of([self.drained, self.env.timeout(self.workload.duration_s)]) | limit)
        return self._result()

    def _result(self) -> SimResult:
        end = self.env.now
        lost = 0
        redelivered = 0
        standby_s = len(self.stations) * self.config.warm_pool * self.config.standby_weight * end
        instance_s = standby_s
        for st in self.stations.values():
            st._account()
            instance_s += st.instance_seconds
            redelivered += st.redelivered
            lost += st.arrived - st.processed - len(st.queue) - st.in_flight
        rt = np.asarray(self.rt)
        self.series.rt_time, self.series.rt = np.asarray(self.rt_time), rt
        has = rt.size > 0
        return SimResult(
            mean_rt_s=float(rt.mean()) if has else 0.0,
            p95_rt_s=float(np.percentile(rt, 95)) if has else 0.0,
            p99_rt_s=float(np.percentile(rt, 99)) if has else 0.0,
            max_rt_s=float(rt.max()) if has else 0.0,
            slo_violation_share=float((rt > self.config.slo_s).mean()) if has else 0.0,
            avg_instances=instance_s / end if end > 0 else 0.0,
            instance_seconds=instance_s,
            efficiency=self.lower_bound_instance_s / instance_s if instance_s > 0 else 0.0,
            scaling_actions=self.scaling_actions,
            fast_actions=self.fast_actions,
            standby_instance_seconds=standby_s,
            lost=int(lost),
            produced=self.produced,
            completed=len(self.rt),
            redelivered=redelivered,
            drained=self.drained.triggered,
            sim_time_s=end,
            policy_errors=self.policy_errors,
            series=self.series,
        )


def simulate(app: SimApp, workload: Workload, autoscaler: Autoscaler, config: SimConfig = SimConfig()) -> SimResult:
    return Simulation(app, workload, autoscaler, config).run()
