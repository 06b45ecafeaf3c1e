"""A hosted function's figures: its instances' summed, drained instances included, and a minute of history."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from pulsar_autoscale.broker.lite.stalls import StallFence
from pulsar_autoscale.functions.instance.stats import InstanceFigures, InstanceStats
from pulsar_autoscale.functions.keyed.cluster import ClusterKeyed
from pulsar_autoscale.functions.keyed.protocol import ROUTE_SUBSCRIPTION
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.worker.hosted import HostedFunction, sum_figures
from pulsar_autoscale.functions.worker.parallelism import Parallelism
from pulsar_autoscale.snapshot import FunctionCounters

if TYPE_CHECKING:
    from pulsar_autoscale.functions.worker.broker_link import BrokerLink

HISTORY_S = 70.0  # kept for the "1min" window


def total_counters(fn: HostedFunction) -> FunctionCounters:
    """Cumulative since the function was created, drained instances included (for the controller)."""
    total = fn.retired
    for h in [*fn.instances.values(), *fn.draining]:
        total = sum_figures(total, h.figures())
    t = time.time()
    if total is None:
        return FunctionCounters(time=t, arrived=None)
    return FunctionCounters(
        time=t,
        arrived=None,
        received=total.received,
        processed=total.processed,
        outputs=total.outputs,
        busy_s=total.busy_s,
        busy_sq_s2=total.busy_sq_s2,
        interarrival_n=total.interarrival_n,
        interarrival_s=total.interarrival_s,
        interarrival_sq_s2=total.interarrival_sq_s2,
        wait_s=total.wait_s,
        newest_publish_s=total.newest_publish_ms / 1000.0 if total.newest_publish_ms else None,
    )


def record_history(fn: HostedFunction, now: float) -> None:
    fn.history.append((now, total_counters(fn)))
    while fn.history and now - fn.history[0][0] > HISTORY_S:
        fn.history.popleft()


def total_exceptions(fn: HostedFunction) -> tuple[int, int]:
    """(system, user) exceptions since creation, drained instances included."""
    figs = [h.figures() for h in [*fn.instances.values(), *fn.draining]] + ([fn.retired] if fn.retired else [])
    return sum(f.system_exceptions for f in figs), sum(f.user_exceptions for f in figs)


def waiting(fn: HostedFunction, waiting_for: str) -> dict[int, InstanceFigures]:
    """Each instance's figures before the broker has answered: not started, and why."""
    figs = {}
    for i in range(fn.config.parallelism):
        stats = InstanceStats(i)
        stats.set_running(False, error=f"not started: waiting for {waiting_for}")
        figs[i] = stats.figures()
    return figs


def stuck_inputs(fn: HostedFunction, figs: dict[int, InstanceFigures], fence: StallFence | None) -> None:
    """B12: an instance whose input the broker no longer dispatches to, even after a reopen, is not running, and
    says why (the fence's failure), instead of looking idle: the function's input on this worker stops every
    instance here; a spread keyedState instance's route topic stops that instance."""
    if fence is None:
        return
    cfg = fn.config
    stuck = fence.failure((t, cfg.subscription_name) for t in cfg.inputs)
    for i, f in figs.items():
        why = stuck or (
            fence.failure([(fn.keyed.topics.route(i), ROUTE_SUBSCRIPTION)]) if isinstance(fn.keyed, ClusterKeyed) else ""
        )
        if why and f.running:
            figs[i] = replace(f, running=False, error=why)


class FunctionFigures:
    """What the REST API and the controller read of a hosted function. A mixin of Worker (worker.py), whose
    lock, hosted functions and broker link it reads."""

    if TYPE_CHECKING:  # Worker's (worker.py)
        link: BrokerLink
        _lock: threading.RLock

        def _get(self, fqfn: str) -> HostedFunction: ...

    def instance_figures(self, fqfn: str) -> tuple[FunctionConfig, dict[int, InstanceFigures], dict[int, int]]:
        with self._lock:
            fn = self._get(fqfn)
            figs = {i: h.figures() for i, h in fn.instances.items()}
            if not self.link.connected.is_set():
                figs.update(waiting(fn, self.link.waiting_for))
            stuck_inputs(fn, figs, self.link.stall_fence)
            return fn.config, figs, dict(fn.restarts)

    def health(self, fqfn: str) -> tuple[str, int]:
        """(why the function cannot run or "", how many of its drains were abandoned)."""
        with self._lock:
            fn = self._get(fqfn)
            return fn.failure, fn.abandoned

    def keyed_view(self, fqfn: str) -> dict | None:
        """A keyedState function's routing and migration state (status), else None."""
        with self._lock:
            fn = self._get(fqfn)
            keyed, stopped, parallelism = fn.keyed, sorted(fn.stopped), fn.config.parallelism
            waits = bool(stopped) and Parallelism.keyed_change_pending(fn)
        view = None if keyed is None else keyed.view()
        if view is not None and waits:
            view["waiting"] = f"the change to {parallelism} instances moves key groups once the stopped instances {stopped} start"
        return view

    def counters(self, fqfn: str) -> FunctionCounters:
        """Cumulative since the function was created, drained instances included (for the controller)."""
        with self._lock:
            return total_counters(self._get(fqfn))

    def exception_totals(self, fqfn: str) -> tuple[int, int]:
        """(system, user) exceptions since creation, drained instances included."""
        with self._lock:
            return total_exceptions(self._get(fqfn))

    def counters_1min_ago(self, fqfn: str) -> FunctionCounters | None:
        with self._lock:
            fn = self._get(fqfn)
            return fn.history[0][1] if fn.history else None
