"""The capacity estimator: the maximum sustainable throughput (MST) of one deployment, by bisection.

StreamBed's method: a warm-up (state and buffers reach their steady size; a fresh deployment
absorbs more than it sustains), then a dichotomous search between a passing rate and a failing one,
each test a cooldown, a ramp-up and an observation. A test passes when the app processed at least
99% of what was injected (or less by no more than its backlogs' noise), no function's backlog grew,
and (for an SLO capacity) the p99 response time stayed under the SLO. A run whose producer missed its
target is invalid: it is repeated, and if the producer cannot reach a rate, that rate bounds the search
(the app was not shown to fail).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.planning.testbed import Phases, RunResult, Testbed, TestConfig


@dataclass(frozen=True)
class MstSettings:
    warmup_s: float = 120.0
    phases: Phases = field(default_factory=Phases)
    pass_ratio: float = 0.99  # processed / injected at least this
    backlog_growth: float = 0.005  # a backlog growing faster than this share of the function's input rate fails
    backlog_floor: float = 50.0  # ... and by more than this many messages over the observation (noise)
    slo_p99_s: float | None = None  # SLO capacity: the p99 must stay under this
    step: float = 0.01  # stop when the next rate is within this share of the last one
    max_iterations: int = 14
    max_invalid: int = 2  # repeats of an invalid run before the producer bounds the search
    start: str = "warmup"  # warmup: the warm-up's observed rate; ds2: DS2's estimate from it
    warmup_rate: float | None = None  # rate injected in the warm-up (None: the testbed's producer at full speed)
    bracket: float | None = None  # None: x1.5 up / halve down until bracketed; f: move by (1 +- f) instead


@dataclass(frozen=True)
class Step:
    rate: float
    passed: bool
    valid: bool
    processed_rate: float
    p99_s: float | None
    reason: str


@dataclass(frozen=True)
class MstResult:
    config: TestConfig
    mst: float
    start_rate: float
    steps: tuple[Step, ...]
    testbed_s: float  # testbed time taken (warm-up and every run)
    producer_bound: bool = False  # the producer could not reach a rate the app might sustain
    last: RunResult | None = None  # the highest passing run (its per-function figures)
    failing: RunResult | None = None  # the lowest failing run (which function fell behind)

    @property
    def runs(self) -> int:
        return len(self.steps)


NOISE_SIGMAS = 3.0  # a deficit within this many standard deviations of the backlogs' own noise is not a trend


def judge(run: RunResult, settings: MstSettings) -> tuple[bool, str]:
    """Did the app keep up with this run's rate? (pass, reason with the numbers).

    A processed deficit counts only beyond the backlogs' noise: a function's backlog under its capacity
    still fluctuates (a slow message holds up the ones behind it), and over a short observation the
    difference between its two ends can be a few percent of what arrived without any growth."""
    if not run.valid:
        return False, (
            f"invalid: producer sent {run.injected_rate * run.observe_s:.0f} of "
            f"{run.target_rate * run.observe_s:.0f} messages in {run.observe_s:.0f} s "
            f"(more than {RunResult.PRODUCER_TOLERANCE:.1%} short)"
        )
    ratio = run.processed_rate / run.injected_rate if run.injected_rate > 0 else 0.0
    kept_up = f"processed {ratio:.2%} of injected"
    if ratio < settings.pass_ratio:
        deficit = (run.injected_rate - run.processed_rate) * run.observe_s
        noise = deficit_noise(run)
        if deficit > noise:
            return False, f"{kept_up} < {settings.pass_ratio:.0%}"
        kept_up += f" (a deficit of {deficit:.0f} messages, within the backlogs' noise of {noise:.1f})"
    for name, fm in run.functions.items():
        growth = fm.backlog_end - fm.backlog_start
        if growth > settings.backlog_floor and growth / run.observe_s > settings.backlog_growth * max(fm.arrival_rate, 1e-9):
            return False, f"{name}: backlog grew by {growth:.0f} messages in {run.observe_s:.0f} s"
    if settings.slo_p99_s is not None and (run.p99_s is None or run.p99_s > settings.slo_p99_s):
        p99 = "unknown" if run.p99_s is None else f"{run.p99_s:.3f} s"
        return False, f"p99 {p99} > SLO {settings.slo_p99_s} s"
    return True, kept_up


def deficit_noise(run: RunResult) -> float:
    """In source messages: the largest deficit the backlogs' fluctuation explains (NOISE_SIGMAS of each
    function's backlog noise, over its messages per source message)."""
    worst = 0.0
    for fm in run.functions.values():
        gain = fm.arrival_rate / run.injected_rate if run.injected_rate > 0 else 0.0
        if gain > 0:
            worst = max(worst, NOISE_SIGMAS * fm.backlog_noise / gain)
    return worst


def bottleneck(run: RunResult) -> str | None:
    """The function that fell behind in a failing run: the fastest-growing backlog relative to its input."""
    worst, name = 0.0, None
    for fn, fm in run.functions.items():
        g = (fm.backlog_end - fm.backlog_start) / max(fm.arrival_rate * run.observe_s, 1e-9)
        if g > worst:
            worst, name = g, fn
    return name


def ds2_estimate(run: RunResult) -> float | None:
    """DS2's one-pass estimate of the source rate `run`'s deployment sustains: each function's
    true rate (per busy second) times its instances, over its share of the source rate."""
    best = math.inf
    for fm in run.functions.values():
        tr = fm.true_rate
        if tr is None or run.injected_rate <= 0 or fm.arrival_rate <= 0:
            continue
        gain = fm.arrival_rate / run.injected_rate
        best = min(best, tr * fm.parallelism / gain)
    return best if math.isfinite(best) else None


def next_rate(rate: float, lo: float, hi: float, bracket: float | None = None) -> float:
    """The next rate to test: the midpoint once both a passing and a failing rate are known. Before
    that, StreamBed's wide moves (x1.5 up, halving down), or with `bracket` steps of that share: a
    warm-up start is within a few percent of the MST on a live testbed, where each run costs tens of
    seconds, and halving from there costs three runs to climb back."""
    if lo > 0 and math.isfinite(hi):
        return (lo + hi) / 2
    if not math.isfinite(hi):
        return rate * (1 + bracket) if bracket else rate * 1.5
    return rate * (1 - bracket) if bracket else hi / 2


def run_until_valid(testbed: Testbed, rate: float, config: TestConfig, settings: MstSettings) -> list[RunResult]:
    """One run at `rate`, repeated up to `settings.max_invalid` times while its producer missed the rate (such a
    run says nothing about the app): every run made, the last the one to judge."""
    runs = [testbed.run(rate, config, settings.phases)]
    while not runs[-1].valid and len(runs) <= settings.max_invalid:
        runs.append(testbed.run(rate, config, settings.phases))
    return runs


def measure_mst(
    testbed: Testbed, config: TestConfig, settings: MstSettings = MstSettings(), start_rate: float | None = None
) -> MstResult:
    """Warm up, then bisect. `start_rate` skips the warm-up's estimate (a re-measurement)."""
    spent = 0.0
    warm_rate = settings.warmup_rate or testbed.max_rate
    warm = testbed.warmup(warm_rate, config, settings.warmup_s)
    spent += warm.duration_s
    if start_rate is None:
        if warm.processed_rate <= 0:
            raise PulsarAutoscaleError(
                f"the warm-up at {warm_rate:g}/s measured no processing ({warm.note or 'no note'}):"
                " is every function running and reading its input?"
            )
        start_rate = warm.processed_rate
        if settings.start == "ds2":
            start_rate = ds2_estimate(warm) or start_rate
    start_rate = max(start_rate, 1e-3)
    lo, hi = 0.0, math.inf
    rate = start_rate
    steps: list[Step] = []
    producer_bound = False
    last = failing = None
    for _ in range(settings.max_iterations):
        runs = run_until_valid(testbed, rate, config, settings)
        spent += sum(r.duration_s for r in runs)
        for r in runs[:-1]:
            steps.append(Step(rate, False, False, r.processed_rate, r.p99_s, judge(r, settings)[1]))
        run = runs[-1]
        passed, reason = judge(run, settings)
        steps.append(Step(rate, passed, run.valid, run.processed_rate, run.p99_s, reason))
        if not run.valid:
            producer_bound = True
            hi = rate
        elif passed:
            lo, last = rate, run
        else:
            hi, failing = rate, run
        nxt = next_rate(rate, lo, hi, settings.bracket)
        if abs(nxt - rate) <= settings.step * rate:
            break
        rate = nxt
    return MstResult(
        config,
        lo,
        start_rate,
        tuple(steps),
        spent,
        producer_bound and last is not None and lo >= hi * (1 - 2 * settings.step),
        last,
        failing,
    )
