"""Pulsar's FunctionStatus and FunctionStats bodies, with Pulsar's field names, from our figures.

Extra figures the policies need (service and inter-arrival moments, busy time, outputs, and
the function's cumulative counters including drained instances) are under "autoscale" keys,
which Pulsar's clients ignore.
"""

from __future__ import annotations

import time
from dataclasses import asdict

from pulsar_autoscale.functions.instance.stats import InstanceFigures
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.snapshot import FunctionCounters


def _moments(n: float, total: float, total_sq: float) -> tuple[float, float]:
    if n <= 0:
        return 0.0, 0.0
    mean = total / n
    return mean, max(total_sq / n - mean * mean, 0.0)


def instance_status(
    i: int,
    fig: InstanceFigures | None,
    restarts: int,
    worker_id: str,
    stall_after_s: float = float("inf"),
    now_ms: int | None = None,
) -> dict:
    if fig is None:
        return {"instanceId": i, "status": {"running": False, "error": "stopped", "numRestarts": restarts, "workerId": worker_id}}
    running, error = honest_running(fig, stall_after_s, now_ms)
    return {
        "instanceId": i,
        "status": {
            "running": running,
            "error": error,
            "numRestarts": restarts,
            "numReceived": fig.received,
            "numSuccessfullyProcessed": fig.processed,
            "numUserExceptions": fig.user_exceptions,
            "latestUserExceptions": [asdict(e) for e in fig.latest_user_exceptions],
            "numSystemExceptions": fig.system_exceptions,
            "latestSystemExceptions": [asdict(e) for e in fig.latest_system_exceptions],
            "averageLatency": fig.avg_latency_ms,
            "lastInvocationTime": fig.last_invocation_ms,
            "workerId": worker_id,
            "instanceStartTimeMs": fig.start_time_ms,
            "firstProcessedTimeMs": fig.first_processed_ms,
        },
    }


def honest_running(fig: InstanceFigures, stall_after_s: float, now_ms: int | None = None) -> tuple[bool, str]:
    """running only while the instance can make progress: its input is connected to the broker and its
    in-flight work (a process() call, unacknowledged outputs) has progressed within stall_after_s."""
    if not fig.running:
        return False, fig.error
    if not fig.connected:
        return False, "not connected to the broker: its input consumer is disconnected"
    if fig.output_error:
        return False, fig.output_error
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if fig.stalled_since_ms and now_ms - fig.stalled_since_ms > stall_after_s * 1000:
        return False, (
            f"stalled: in-flight work has not progressed for {(now_ms - fig.stalled_since_ms) / 1000:.0f} s "
            "(a process() call that does not return, or outputs the broker does not acknowledge)"
        )
    return True, fig.error


def function_status(
    cfg: FunctionConfig,
    figs: dict[int, InstanceFigures],
    restarts: dict[int, int],
    worker_id: str,
    stall_after_s: float = float("inf"),
    failure: str = "",
    abandoned: int = 0,
    broker_problem: str = "",
) -> dict:
    """Pulsar's FunctionStatus. A function that failed validation has no instance running, each saying why;
    while the broker does not answer (functions/worker/broker_watch.py) no instance is running either;
    drains abandoned after their bound are counted under "autoscale"."""
    instances = [instance_status(i, figs.get(i), restarts.get(i, 0), worker_id, stall_after_s) for i in range(cfg.parallelism)]
    for s in instances:
        if failure:
            s["status"].update(running=False, error=failure)
        elif broker_problem and s["status"]["running"]:
            s["status"].update(running=False, error=broker_problem)
    return {
        "numInstances": cfg.parallelism,
        "numRunning": sum(1 for s in instances if s["status"]["running"]),
        "instances": instances,
        "autoscale": {"abandonedInstances": abandoned, **({"failure": failure} if failure else {})},
    }


def _window_block(received, processed, sys_exc, user_exc, busy_s) -> dict:
    return {
        "receivedTotal": received,
        "processedSuccessfullyTotal": processed,
        "systemExceptionsTotal": sys_exc,
        "userExceptionsTotal": user_exc,
        "avgProcessLatency": (1000.0 * busy_s / processed) if processed else None,
    }


def instance_metrics(fig: InstanceFigures) -> dict:
    svc_mean, svc_var = _moments(fig.processed, fig.busy_s, fig.busy_sq_s2)
    ia_mean, ia_var = _moments(fig.interarrival_n, fig.interarrival_s, fig.interarrival_sq_s2)
    block = _window_block(fig.received, fig.processed, fig.system_exceptions, fig.user_exceptions, fig.busy_s)
    return {
        **block,
        "1min": block,
        "lastInvocation": fig.last_invocation_ms,
        "redeliveredTotal": fig.redelivered,
        "userMetrics": {k: s / c for k, (s, c) in fig.user_metrics.items() if c},
        "autoscale": {
            "processTimeMean": svc_mean,
            "processTimeVariance": svc_var,
            "interArrivalMean": ia_mean,
            "interArrivalVariance": ia_var,
            "busyTimeSeconds": fig.busy_s,
            "outputTotal": fig.outputs,
            "startTimeMs": fig.start_time_ms,
        },
    }


def function_stats(
    figs: dict[int, InstanceFigures], counters: FunctionCounters, minute_ago: FunctionCounters | None, exceptions: tuple[int, int]
) -> dict:
    """Totals are cumulative since creation (drained instances included); "1min" is the last minute."""
    sys_exc, user_exc = exceptions
    total = _window_block(counters.received, counters.processed, sys_exc, user_exc, counters.busy_s)
    base = minute_ago or FunctionCounters(time=counters.time, arrived=None)
    minute = _window_block(
        counters.received - base.received, counters.processed - base.processed, None, None, counters.busy_s - base.busy_s
    )
    return {
        **total,
        "1min": minute,
        "lastInvocation": max((f.last_invocation_ms for f in figs.values()), default=0),
        "instances": [{"instanceId": i, "metrics": instance_metrics(f)} for i, f in sorted(figs.items())],
        "autoscale": {"counters": asdict(counters)},
    }
