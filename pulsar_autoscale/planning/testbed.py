"""What the planner asks of a testbed and what it gets back: one controlled run at one rate.

The planner never looks inside a testbed: a simulated one (simbed.SimTestbed) and a live one
(livebed.LiveTestbed) both answer `run(rate, config)` with a RunResult of measured figures, so the
same planner code is checked at scales no machine here can run and then used on a staging cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable


@dataclass(frozen=True)
class TestConfig:
    """A deployment to test: parallelism per function and the number of workers (None: the testbed's
    own rule for how many workers a number of instances gets)."""

    __test__ = False  # not a pytest class

    parallelism: Mapping[str, int]
    workers: int | None = None

    @property
    def instances(self) -> int:
        return sum(self.parallelism.values())

    def with_parallelism(self, **changes: int) -> "TestConfig":
        return TestConfig({**self.parallelism, **changes}, self.workers)

    def key(self) -> tuple:
        return (tuple(sorted(self.parallelism.items())), self.workers)


@dataclass(frozen=True)
class Phases:
    """One measurement (StreamBed's capacity estimator): a cooldown at a low rate so the previous
    step's backlog drains, the target rate for `ramp_s` (not measured: buffers fill, rates settle),
    then `observe_s` measured. Choose observe_s as a multiple of any window a function uses, so
    a burst of window outputs does not look like a growing backlog."""

    cooldown_s: float = 15.0
    ramp_s: float = 30.0
    observe_s: float = 60.0
    cooldown_rate: float | None = None  # None: 10% of the target rate

    @property
    def total_s(self) -> float:
        return self.cooldown_s + self.ramp_s + self.observe_s


@dataclass(frozen=True)
class InstanceMeasure:
    processed: float  # messages processed in the observation
    busy_s: float  # time spent inside process() (useful time; includes waiting for a lock)
    cpu_s: float  # CPU time the instance used
    arrived: float  # messages routed to this instance (its share of the function's input)


@dataclass(frozen=True)
class FunctionMeasure:
    parallelism: int
    arrival_rate: float  # messages/s arriving on the function's inputs
    processed_rate: float  # messages/s processed by all instances
    output_rate: float  # messages/s emitted
    backlog_start: float  # messages waiting at the start of the observation
    backlog_end: float  # ... and at its end
    instances: tuple[InstanceMeasure, ...] = ()
    key_group_counts: tuple[float, ...] | None = None  # messages per key group (keyed functions)
    backlog_noise: float = 0.0  # std of the backlog about its trend over the observation (messages)

    def backlog_growth_rate(self, observe_s: float) -> float:
        return (self.backlog_end - self.backlog_start) / observe_s if observe_s > 0 else 0.0

    @property
    def busy_s(self) -> float:
        return sum(i.busy_s for i in self.instances)

    @property
    def cpu_s(self) -> float:
        return sum(i.cpu_s for i in self.instances)

    @property
    def true_rate(self) -> float | None:
        """DS2's true processing rate per instance: messages per busy second."""
        busy = self.busy_s
        processed = sum(i.processed for i in self.instances)
        return processed / busy if busy > 0 else None


@dataclass(frozen=True)
class RunResult:
    """What one run measured. `processed_rate` is the rate of source messages the app kept up with
    (from the sinks' point of view); `injected_rate` what the producer really sent."""

    target_rate: float
    injected_rate: float
    processed_rate: float
    p99_s: float | None
    observe_s: float
    duration_s: float  # testbed time the run took (cooldown + ramp + observe)
    functions: Mapping[str, FunctionMeasure] = field(default_factory=dict)
    workers: int = 1
    note: str = ""

    PRODUCER_TOLERANCE = 0.005  # a producer more than 0.5% short of its target makes the run invalid

    @property
    def valid(self) -> bool:
        """A run whose producer missed its target says nothing about the app. One message is forgiven: the
        observation's two ends cut a paced stream between messages, which at a few messages per second is
        more than 0.5% of a short observation."""
        slack = 1.0 / self.observe_s if self.observe_s > 0 else 0.0
        return self.injected_rate >= self.target_rate * (1 - self.PRODUCER_TOLERANCE) - slack


@runtime_checkable
class Testbed(Protocol):
    """A place to run the app under test at a controlled rate."""

    name: str
    max_rate: float  # what the producer sends at full speed (the warm-up's rate)

    def functions(self) -> tuple[str, ...]:
        """The app's functions, upstream first."""

    def upstream(self, function: str) -> tuple[str, ...]:
        """The functions whose outputs feed `function` (empty: fed by source topics only)."""

    def window_s(self, function: str) -> float:
        """Seconds between a windowed function's emissions, whose outputs reach the next function in one
        burst (0: it emits as its messages arrive)."""

    def run(self, rate: float, config: TestConfig, phases: Phases = Phases()) -> RunResult:
        """Inject `rate` source messages/s into `config` and measure it."""

    def warmup(self, rate: float, config: TestConfig, seconds: float) -> RunResult:
        """Deploy `config` and load it at `rate` for `seconds` before measurements (state, buffers)."""
