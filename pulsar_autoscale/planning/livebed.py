"""The Testbed protocol against a live deployment: our worker (or worker cluster) through the Functions
admin REST API, the broker's /metrics for arrivals, and a paced producer.

Why these sources: the worker's counters are exact per instance (processed, busy time), the broker's
in-counters are what arrived whatever the app reports, so arrived - processed is the backlog a
function cannot hide (its prefetch queue included), and the producer's acknowledged count says what
was really injected, so a run the producer could not drive is INVALID rather than a failure of the app.

A run: cooldown at a low rate (until backlogs drain), the target rate for the ramp (not measured),
then the observation, sampled every `sample_s`. Backlog growth is the least-squares slope over the
observation's samples (one reading at each end is at the mercy of prefetch and batching), the p99 is
end-to-end: sink message receive time minus the source message's event_timestamp (the instance
carries it to its outputs), as bench/ scripts measure it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence, cast

import numpy as np

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from pulsar_autoscale.broker import metrics as broker_metrics
from pulsar_autoscale.planning.liveapps import LiveApp
from pulsar_autoscale.planning.producer import PacedProducer
from pulsar_autoscale.planning.testbed import FunctionMeasure, InstanceMeasure, Phases, RunResult, TestConfig

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- the latency at the sink


class SinkLatency:
    """End-to-end latency at the sink: receive time minus the source message's event_timestamp."""

    def __init__(self, service_url: str, topic: str):
        import pulsar

        self._pulsar = pulsar
        self._client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        self._consumer = self._client.subscribe(
            topic, f"plan-latency-{uuid.uuid4().hex[:6]}", consumer_type=pulsar.ConsumerType.Exclusive, receiver_queue_size=5000
        )
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="plan-sink")
        self._thread.start()

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                msg = self._consumer.receive(200)
            except self._pulsar.Timeout:
                continue
            except Exception:  # closed under us
                return
            now = time.time()
            ts = msg.event_timestamp() or msg.publish_timestamp()
            with self._lock:
                self._samples.append((now, max(0.0, now - ts / 1000.0)))
            n += 1
            if n % 100 == 0:
                self._consumer.acknowledge_cumulative(msg)

    def latencies(self, start: float, end: float) -> list[float]:
        """Latencies of the messages received in [start, end) (time.time())."""
        with self._lock:
            out = [lat for t, lat in self._samples if start <= t < end]
            self._samples = [s for s in self._samples if s[0] >= start]
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()


# ---------------------------------------------------------------- readings and the measurement (pure)


@dataclass(frozen=True)
class FnReading:
    """One function's cumulative counters at one time."""

    arrived: float  # broker in-messages on its inputs
    processed: float
    outputs: float
    busy_s: float
    backlog: float  # messages waiting on its subscription
    instances: Mapping[int, tuple[float, float, float]] = field(default_factory=dict)  # id -> (received, processed, busy_s)


@dataclass(frozen=True)
class Reading:
    time: float  # time.time() when read
    sent: float  # messages the producer's broker acknowledged (cumulative)
    functions: Mapping[str, FnReading]


def trend(ts: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope (per second) and the standard deviation of the samples about that line;
    (0, 0) with fewer than two distinct times."""
    t, y = np.asarray(ts, dtype=float), np.asarray(ys, dtype=float)
    if len(t) < 2 or np.ptp(t) <= 0:
        return 0.0, 0.0
    k, c = np.polyfit(t - t[0], y, 1)
    return float(k), float(np.std(y - (k * (t - t[0]) + c)))


def summarize(
    target_rate: float,
    readings: Sequence[Reading],
    latencies: Sequence[float],
    parallelism: Mapping[str, int],
    duration_s: float,
    workers: int = 1,
    note: str = "",
) -> RunResult:
    """A RunResult from the observation's readings: rates from the first and last, backlog growth (and
    its noise about that trend) from the least-squares line over all of them, processed rate in source
    messages (injected x the worst function's processed / arrived, both least-squares slopes: the few
    messages in service at the last reading, or one slow message there, are not a shortfall in the rate),
    p99 over the sink latencies."""
    first, last = readings[0], readings[-1]
    obs = max(last.time - first.time, 1e-9)
    injected = (last.sent - first.sent) / obs
    ts = [r.time for r in readings]
    fms: dict[str, FunctionMeasure] = {}
    worst = 1.0
    for name, a in first.functions.items():
        b = last.functions[name]
        arrival = (b.arrived - a.arrived) / obs
        processed = (b.processed - a.processed) / obs
        arrival_k, _ = trend(ts, [r.functions[name].arrived for r in readings])
        if arrival_k > 0:
            worst = min(worst, trend(ts, [r.functions[name].processed for r in readings])[0] / arrival_k)
        backlogs = [r.functions[name].backlog for r in readings]
        k, noise = trend(ts, backlogs)
        growth = k * obs
        mid = float(np.mean(backlogs))
        inst = tuple(
            InstanceMeasure(
                processed=b.instances[i][1] - a.instances[i][1],
                busy_s=b.instances[i][2] - a.instances[i][2],
                cpu_s=0.0,
                arrived=b.instances[i][0] - a.instances[i][0],
            )
            for i in sorted(set(a.instances) & set(b.instances))
        )
        fms[name] = FunctionMeasure(
            parallelism=parallelism.get(name, len(inst)),
            arrival_rate=arrival,
            processed_rate=processed,
            output_rate=(b.outputs - a.outputs) / obs,
            backlog_start=mid - growth / 2,
            backlog_end=mid + growth / 2,
            instances=inst,
            backlog_noise=noise,
        )
    p99 = float(np.percentile(latencies, 99)) if len(latencies) else None
    return RunResult(
        target_rate=target_rate,
        injected_rate=injected,
        processed_rate=injected * worst,
        p99_s=p99,
        observe_s=obs,
        duration_s=duration_s,
        functions=fms,
        workers=workers,
        note=note,
    )


def saturated_rate(
    res: RunResult, readings: Sequence[Reading], share: Mapping[str, float], parallelism: Mapping[str, int]
) -> float:
    """The warm-up's estimate of the source rate the app sustains: the lowest processed rate, in source
    messages (over `share`, its arrivals per message sent), of the functions that had messages waiting
    beyond those in service all along (saturated). A function the paused producer starved processed what
    it got, not what it can, and would start the search far under the capacity. If none was saturated
    throughout, the lowest of all."""
    rates = {n: res.functions[n].processed_rate / s for n, s in share.items() if n in res.functions}
    saturated = [n for n in rates if min(r.functions[n].backlog for r in readings) > parallelism.get(n, 1)]
    return min((rates[n] for n in (saturated or rates)), default=res.processed_rate)


# ---------------------------------------------------------------- the testbed


class LiveTestbed:
    """The Testbed protocol on a live worker (cluster) and broker; `close()` deletes the app's functions.

    An observation lasts the phases' observe_s, and longer (up to MAX_STRETCH times) until every function
    has received `min_messages`: the 99% test needs a count in the hundreds to resolve 1%, and a slow
    function at a few messages per second receives only tens in a 15 s observation."""

    MAX_STRETCH = 4.0

    def __init__(
        self,
        app: LiveApp,
        admin_url: str | list[str],
        service_url: str,
        metrics_url: str,
        max_rate: float = 1000.0,
        producers: int = 1,
        sample_s: float = 0.5,
        warmup_backlog: float = 200.0,
        drain_backlog: float = 5.0,
        batching: bool = False,
        min_messages: int = 200,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.app = app
        self.name = f"live:{app.name}"
        self.max_rate = max_rate
        self.admin = FunctionsAdmin(admin_url)
        self.service_url, self.metrics_url = service_url, metrics_url
        self.sample_s, self.warmup_backlog, self.drain_backlog = sample_s, warmup_backlog, drain_backlog
        self.min_messages = min_messages
        self._clock, self._sleep = clock, sleep
        self._deployed: dict[str, int] = {}
        self._base: dict[str, float] = {}  # per function: arrived - processed when it was created
        self._first: Reading | None = None  # the first reading: each function's arrivals per message sent
        self._fns = {f.name: f for f in app.functions}
        self._topics = sorted({t for f in app.functions for t in f.inputs})
        self._sink = SinkLatency(service_url, app.sink)
        self._producer = PacedProducer(service_url, app.source, producers, batching)

    # -- protocol
    def functions(self) -> tuple[str, ...]:
        return tuple(self._fns)

    def upstream(self, function: str) -> tuple[str, ...]:
        return self.app.upstream(function)

    def window_s(self, function: str) -> float:
        return self._fns[function].window_s

    def warmup(self, rate: float, config: TestConfig, seconds: float) -> RunResult:
        """Deploy, then load at `rate` with the backlogs capped at `warmup_backlog` (the producer pauses
        above it): its bottleneck runs saturated, so that one's processed rate over the second half is the
        capacity (saturated_rate), and the backlog left to drain is small (an uncapped full-speed warm-up
        would leave minutes of it)."""
        self.deploy(config)
        t0 = self._clock()
        half = t0 + seconds / 2
        everything: list[Reading] = []
        paused = False
        while self._clock() < t0 + seconds:
            r = self.read()
            backlog = max((f.backlog for f in r.functions.values()), default=0.0)
            paused = backlog > self.warmup_backlog or (paused and backlog > self.warmup_backlog / 2)
            self._producer.set_rate(0.0 if paused else rate)
            everything.append(r)
            self._sleep(min(self.sample_s, 0.25))
        self._producer.set_rate(0.0)
        everything.append(self.read())
        readings = [r for r in everything if r.time >= half] or everything[-2:]
        res = summarize(rate, readings, [], config.parallelism, 0.0, self._workers(), "warm-up (backlog-capped)")
        # Each function's processed rate in source messages: over its arrivals per message sent since this
        # testbed's first reading. Not over the second half alone: a slow function keeps the producer paused all
        # of it (or all the warm-up, with a backlog left by the step before), and arrivals over nothing sent made
        # the start of the search 0.
        first = cast(Reading, self._first)  # read() keeps its first reading, and it has just read
        sent = everything[-1].sent - first.sent
        share = {
            n: (f.arrived - first.functions[n].arrived) / sent
            for n, f in everything[-1].functions.items()
            if sent > 0 and f.arrived > first.functions[n].arrived
        }
        processed = saturated_rate(res, readings, share, config.parallelism)
        self._drain(max(30.0, seconds))
        return RunResult(
            rate, res.injected_rate, processed, None, res.observe_s, self._clock() - t0, res.functions, res.workers, res.note
        )

    def run(self, rate: float, config: TestConfig, phases: Phases = Phases()) -> RunResult:
        t0 = self._clock()
        self.deploy(config)
        self._producer.set_rate(phases.cooldown_rate if phases.cooldown_rate is not None else rate * 0.1)
        self._sleep(phases.cooldown_s)
        self._drain(3 * phases.cooldown_s)  # a failing step's backlog must not bias this one
        self._producer.set_rate(rate)
        self._sleep(phases.ramp_s)
        readings = [self.read()]
        end = readings[0].time + phases.observe_s
        last = readings[0].time + phases.observe_s * self.MAX_STRETCH
        while (now := self._clock()) < end or (now < last and self._fewest_arrivals(readings) < self.min_messages):
            self._sleep(min(self.sample_s, end - now) if now < end else self.sample_s)
            readings.append(self.read())
        lat = self._sink.latencies(readings[0].time, readings[-1].time)
        self._producer.set_rate(0.0)
        return summarize(rate, readings, lat, config.parallelism, self._clock() - t0, self._workers())

    @staticmethod
    def _fewest_arrivals(readings: Sequence[Reading]) -> float:
        """The fewest messages any function received in the observation so far; a function that received
        none (a side input this app does not feed) does not stretch it."""
        first, last = readings[0], readings[-1]
        got = [last.functions[n].arrived - f.arrived for n, f in first.functions.items()]
        return min((g for g in got if g > 0), default=math.inf)

    # -- deployment
    def deploy(self, config: TestConfig) -> None:
        """Create the app's functions, or change their parallelism (restart-free on our worker), and wait
        until every instance runs."""
        created = False
        for name, fn in self._fns.items():
            k = int(config.parallelism.get(name, 1))
            if self._deployed.get(name) == k:
                continue
            tenant, ns = fn.config.get("tenant", "public"), fn.config.get("namespace", "default")
            if name not in self._deployed:
                try:
                    self.admin.delete(tenant, ns, name)  # a leftover of an earlier session
                except AdminError:
                    pass
                self.admin.create({**fn.config, "parallelism": k}, fn.py)
                self._base.pop(name, None)
                created = True
            else:
                try:
                    self.admin.set_parallelism(tenant, ns, name, k)
                except AdminError as exc:
                    if not exc.no_change:
                        raise
            self._wait_running(tenant, ns, name, k)
            self._deployed[name] = k
        if created:
            self.read()  # the backlog baselines, before any load

    def _wait_running(self, tenant: str, ns: str, name: str, k: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.admin.status(tenant, ns, name)
            if st.get("numInstances") == k and st.get("numRunning") == k:
                return
            if time.monotonic() > deadline:
                raise AdminError(f"{name}: {st.get('numRunning')}/{k} instances running after {timeout_s:.0f} s")
            time.sleep(0.2)

    def _drain(self, limit_s: float) -> None:
        """Wait (up to limit_s) until every backlog is under `drain_backlog` messages."""
        deadline = self._clock() + limit_s
        while self._clock() < deadline:
            if max((f.backlog for f in self.read().functions.values()), default=0.0) <= self.drain_backlog:
                return
            self._sleep(0.25)
        log.warning("backlogs not drained within %.0f s", limit_s)

    # -- readings
    def read(self) -> Reading:
        sent = self._producer.acked
        now = self._clock()
        m = broker_metrics.fetch(self.metrics_url, now, topics=self._topics)
        fns: dict[str, FnReading] = {}
        for name, fn in self._fns.items():
            stats = self.admin.stats(fn.config.get("tenant", "public"), fn.config.get("namespace", "default"), name)
            c = stats.get("autoscale", {}).get("counters", {})
            inst = {
                int(i["instanceId"]): (
                    float(i["metrics"].get("receivedTotal") or 0),
                    float(i["metrics"].get("processedSuccessfullyTotal") or 0),
                    float(i["metrics"].get("autoscale", {}).get("busyTimeSeconds") or 0),
                )
                for i in stats.get("instances", [])
            }
            arrived = sum(m.in_messages.get(t, 0.0) for t in fn.inputs)
            processed = float(c.get("processed", stats.get("processedSuccessfullyTotal", 0)) or 0)
            # Waiting = arrived on the inputs - processed, both live counters; the broker's subscription
            # backlog gauge is refreshed only every few seconds (pulsar-lite: 5 s, Apache: 60 s by default),
            # too coarse for a slope over a 15 s observation. The offset: what the topics held before we subscribed.
            base = self._base.setdefault(name, arrived - processed)
            fns[name] = FnReading(
                arrived,
                processed,
                float(c.get("outputs", 0) or 0),
                float(c.get("busy_s", 0) or 0),
                max(0.0, arrived - processed - base),
                inst,
            )
        reading = Reading(now, float(sent), fns)
        if self._first is None:
            self._first = reading
        return reading

    def _workers(self) -> int:
        try:
            return max(1, len(self.admin.cluster()))
        except (AdminError, TypeError):
            return 1

    def close(self) -> None:
        """Stop the producer and the sink reader, delete the functions this testbed created."""
        self._producer.close()
        self._sink.close()
        for name in self._deployed:
            fn = self._fns[name]
            try:
                self.admin.delete(fn.config.get("tenant", "public"), fn.config.get("namespace", "default"), name)
            except AdminError as exc:
                log.warning("could not delete %s: %s", name, exc)
        self._deployed.clear()


def analytic_capacity(service_ms: float, parallelism: int) -> float:
    """What a deterministic sleepy function sustains: parallelism / service time."""
    return parallelism / (service_ms / 1000.0) if service_ms > 0 else math.inf
