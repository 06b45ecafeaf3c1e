"""What an operator asks of a running controller (rest.py serves it; `pulsar-autoscale autoscaler` calls it):
a function's controls shown, set and cleared, why it was scaled, and a reload of the config file."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from pulsar_autoscale.controller import forwarding, reloading
from pulsar_autoscale.controller.autoscaler import DEFAULT as DEFAULT_POLICY
from pulsar_autoscale.controller.controls import FunctionControls
from pulsar_autoscale.controller.decision_log import DecisionLog

if TYPE_CHECKING:
    from apscheduler.schedulers.background import BackgroundScheduler

    from pulsar_autoscale.controller.autoscaler import Autoscaler
    from pulsar_autoscale.controller.burst_plan import BurstConfig
    from pulsar_autoscale.controller.config import ControllerConfig
    from pulsar_autoscale.controller.controls import ControlStore
    from pulsar_autoscale.controller.executor import Executor
    from pulsar_autoscale.controller.function_controls import FunctionControlsView
    from pulsar_autoscale.controller.monitor import Monitor
    from pulsar_autoscale.controller.wake import WakeWatcher
    from pulsar_autoscale.controller.warm_sizing import WarmPoolSizer
    from pulsar_autoscale.leader import LeaderElector
    from pulsar_autoscale.policies import Policy

log = logging.getLogger(__name__)


class OperatorControls:
    """These requests as methods of the Controller (loop.py), which is built on this class: the attributes
    declared below are the loop's own, set by Controller.__init__."""

    config: ControllerConfig
    config_path: str | None
    overrides: dict
    policy: Policy
    autoscaler: Autoscaler
    monitor: Monitor
    executor: Executor
    burst: BurstConfig
    warm_pools: WarmPoolSizer
    elector: LeaderElector
    log: DecisionLog
    controls: ControlStore
    watcher: WakeWatcher
    functions: FunctionControlsView
    _iter_lock: threading.Lock
    _scheduler: BackgroundScheduler | None

    def controls_of(self, fn: str) -> dict:
        """Effective controls of one function, the layers they came from, and its last evaluation."""
        last = self.log.recent(fn, 1)
        return {
            **self.functions.view(fn, self.config, self.autoscaler.planner.config),
            "asleep": fn in self.watcher.watching,
            "last": last[0] if last else None,
        }

    def set_controls(self, fn: str, update: dict) -> dict:
        controls = self.functions.set(fn, update, self.config, self.autoscaler.planner.config)
        log.info("controls of %s set: %s", fn, controls.set_fields() or "none (controller defaults)")
        return self.controls_of(fn)

    def clear_controls(self, fn: str) -> dict:
        self.controls.put(fn, FunctionControls())
        return self.controls_of(fn)

    def why(self, fn: str, limit: int = 10) -> list[dict]:
        """This replica's evaluations of fn (a replica logs only the terms it led)."""
        return self.log.recent(fn, limit)

    def why_with_leader(self, fn: str, limit: int = 10) -> tuple[list[dict], str | None]:
        """Asked of a replica that does not lead: the leader's records too (forwarding.with_leader)."""
        return forwarding.with_leader(self.why(fn, limit), fn, limit, self.elector, self.config)

    def reload(self) -> dict:
        """Re-read the config file and swap in what it changes (reloading.read builds it all first)."""
        new = reloading.read(self.config_path, self.overrides, self.config)
        with self._iter_lock:
            if (new.config.policy, new.config.policy_params) != (self.config.policy, self.config.policy_params):
                self.policy = self.autoscaler.policy = new.policy
                self.autoscaler.states.pop(DEFAULT_POLICY, None)
            self.autoscaler.planner = new.planner
            self.monitor.metrics_url, self.monitor.namespaces = new.config.metrics_url, new.config.namespaces
            self.monitor.window_s = new.config.window_s
            self.executor.retries = new.config.execute_retries
            self.burst = new.burst
            self.warm_pools.config = new.warm_pool
            logged = ("decision_log", "decision_log_max_bytes", "decision_log_backups")
            if any(getattr(new.config, name) != getattr(self.config, name) for name in logged):
                self.log = DecisionLog(*(getattr(new.config, name) for name in logged))
            self.functions.policies.reset(new.config.policy, new.config.policy_dir)
            self.config = new.config
        if self._scheduler and "period_s" in new.changed:
            self._scheduler.reschedule_job("mape", trigger="interval", seconds=new.config.period_s)
        log.info(
            "reloaded %s: changed %s%s",
            self.config_path,
            ", ".join(new.changed) or "nothing",
            f"; needs a restart, kept: {', '.join(new.kept)}" if new.kept else "",
        )
        return {"reloaded": self.config_path, "changed": new.changed, "restart_needed": new.kept}
