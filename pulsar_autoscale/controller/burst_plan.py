"""When and how much to hand to a Spark burst drain: the controller's Plan step for bursts.

Pure, like a policy: the snapshot and the parallelism the Plan step just chose in, a number of
messages out. The controller (burst.enabled in its config) asks our worker to drain that many
(functions/spark/bursts.py runs spark_bridge.burst.BurstDrain); stock Pulsar has no such endpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.snapshot import FunctionSnapshot


@dataclass(frozen=True)
class BurstConfig:
    enabled: bool = False
    deadline_s: float = 30.0  # the backlog must be gone by then (Sponge's recovery deadline)
    start_latency_s: float = 1.0  # a new instance of our runtime serves after this
    min_messages: int = 100  # a smaller excess is left to the instances: a Spark job costs seconds
    max_messages: int = 20000  # one drain's slice at most
    partitions: int = 4  # Spark tasks per drain
    threads_per_partition: int = 1  # > 1 for a function that mostly waits (a model server call)

    def __post_init__(self):
        if self.deadline_s <= 0 or self.start_latency_s < 0:
            raise ConfigError(
                f"burst: deadline_s ({self.deadline_s}) must be > 0 and start_latency_s ({self.start_latency_s}) >= 0"
            )
        if (
            self.min_messages < 1
            or self.max_messages < self.min_messages
            or self.partitions < 1
            or self.threads_per_partition < 1
        ):
            raise ConfigError(
                f"burst: need 1 <= min_messages ({self.min_messages}) <= max_messages "
                f"({self.max_messages}), partitions ({self.partitions}) and threads_per_partition "
                f"({self.threads_per_partition}) >= 1"
            )


def burst_size(snapshot: FunctionSnapshot, parallelism: int, max_parallelism: int, config: BurstConfig) -> int:
    """Messages to drain now: should_burst's excess, 0 below min_messages, capped at max_messages."""
    n = should_burst(snapshot, parallelism, max_parallelism, config.start_latency_s, config.deadline_s)
    return 0 if n < config.min_messages else min(n, config.max_messages)


def should_burst(
    snapshot: FunctionSnapshot, parallelism: int, max_parallelism: int, start_latency_s: float, deadline_s: float
) -> int:
    """Messages to hand to a burst drain: the backlog the instances cannot clear by the deadline.

    Sponge's recovery condition (paper 000, eq. 1): what the queue holds now plus what arrives
    until the deadline must not exceed what the processors complete by then. The instances
    complete `parallelism * mu * D`; the controller can add `max_parallelism - parallelism`
    instances, each working `D - start_latency_s`. The rest is the burst:

        burst = ceil(Q + lambda*D - mu * (k*D + (k_max - k) * max(0, D - L)))

    0 when the figures needed (backlog, service rate) are unknown: a burst job is not
    started on a guess.
    """
    if deadline_s <= 0:
        raise ConfigError(f"should_burst: deadline_s must be > 0, got {deadline_s}")
    if start_latency_s < 0:
        raise ConfigError(f"should_burst: start_latency_s must be >= 0, got {start_latency_s}")
    if parallelism < 0 or max_parallelism < 0:
        raise ConfigError(f"should_burst: parallelism {parallelism} and max_parallelism {max_parallelism} must be >= 0")
    mu = snapshot.service_rate or snapshot.true_processing_rate
    if snapshot.backlog is None or mu is None or mu <= 0:
        return 0
    k = parallelism
    extra = max(0, max_parallelism - k)
    capacity = mu * (k * deadline_s + extra * max(0.0, deadline_s - start_latency_s))
    demand = snapshot.backlog + (snapshot.arrival_rate or 0.0) * deadline_s
    excess = demand - capacity
    return int(math.ceil(excess)) if excess > 0 else 0
