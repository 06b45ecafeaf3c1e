"""What a simulation run reports: its figures (SimResult: response times, instance cost, scaling actions,
losses) and the per-period series and response times behind them (SimSeries, for plots)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SimSeries:
    """Per-period figures (index = period) and per-message response times, for plots."""

    time: list[float] = field(default_factory=list)
    arrival_rate: list[float] = field(default_factory=list)  # source msg/s over the period
    parallelism: dict[str, list[int]] = field(default_factory=dict)
    running: dict[str, list[int]] = field(default_factory=dict)
    backlog: dict[str, list[float]] = field(default_factory=dict)
    actions: list[tuple[float, str, str]] = field(default_factory=list)  # (time, "period"/"fast", function)
    rt_time: np.ndarray = field(default_factory=lambda: np.empty(0))  # completion times
    rt: np.ndarray = field(default_factory=lambda: np.empty(0))  # response times, same order


@dataclass
class SimResult:
    mean_rt_s: float
    p95_rt_s: float
    p99_rt_s: float
    max_rt_s: float
    slo_violation_share: float
    avg_instances: float
    instance_seconds: float
    efficiency: float
    scaling_actions: int
    fast_actions: int  # of scaling_actions, those the fast path took
    standby_instance_seconds: float  # warm-pool standbys, weighted (included in instance_seconds)
    lost: int
    produced: int  # source messages
    completed: int  # source messages that left the DAG
    redelivered: int  # in-flight messages handed back by restarts
    drained: bool  # every backlog emptied before drain_limit_s
    sim_time_s: float  # workload plus drain
    policy_errors: int
    series: SimSeries = field(repr=False, default_factory=SimSeries)

    SCALARS = (
        "mean_rt_s",
        "p95_rt_s",
        "p99_rt_s",
        "max_rt_s",
        "slo_violation_share",
        "avg_instances",
        "instance_seconds",
        "efficiency",
        "scaling_actions",
        "fast_actions",
        "standby_instance_seconds",
        "lost",
        "produced",
        "completed",
        "redelivered",
        "drained",
        "sim_time_s",
        "policy_errors",
    )

    def summary(self) -> dict:
        return {k: getattr(self, k) for k in self.SCALARS}
