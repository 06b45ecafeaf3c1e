"""Each function's controls as the loop applies them: the controller's defaults (its config and Plan
bounds) under the function's own config under the operator's (controls.effective). The config and Plan
are given on each call, not kept, because a reload swaps them."""

from __future__ import annotations

from dataclasses import asdict

import pulsar

from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.controls import ControlStore, Effective, FunctionControls, effective
from pulsar_autoscale.controller.metrics import ControllerMetrics
from pulsar_autoscale.controller.monitor import Observation
from pulsar_autoscale.controller.planner import FunctionPlan, PlanConfig
from pulsar_autoscale.controller.policy_registry import PolicyRegistry
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.policies import Policy


class FunctionControlsView:
    def __init__(self, store: ControlStore, policies: PolicyRegistry):
        self.store, self.policies = store, policies
        self.effective: dict[str, Effective] = {}  # per function, as of the last period
        self.declared: dict[str, FunctionControls] = {}

    def follow(
        self, obs: Observation, config: ControllerConfig, plan: PlanConfig, metrics: ControllerMetrics, errors: list[str]
    ) -> tuple[dict[str, FunctionPlan], dict[str, tuple[str, Policy]], dict[str, str]]:
        """This period's controls per function: Plan rules, policy overrides, and the functions whose
        own policy cannot be loaded (no decision for them, an error each)."""
        try:
            operator = self.store.refresh()
        except pulsar.PulsarException as exc:  # keep following the controls last read
            operator = self.store.known()
            errors.append(f"controls topic unreadable, last known controls apply: {exc}")
        self.declared = dict(obs.declared)
        self.effective = {fn: self.of(fn, operator.get(fn, FunctionControls()), config, plan) for fn in obs.current}
        rules, overrides, failed = {}, {}, {}
        for fn, e in self.effective.items():
            rules[fn] = FunctionPlan(e.min, e.max, e.paused, e.idle_s)
            metrics.paused.labels(fn).set(1 if e.paused else 0)
            metrics.max_parallelism.labels(fn).set(e.max)
            fs = obs.snapshot.functions.get(fn)
            if fs is not None and fs.backlog is not None:
                metrics.backlog.labels(fn).set(fs.backlog)
            if (e.policy, e.policy_params) != (config.policy, dict(config.policy_params)):
                try:
                    overrides[fn] = self.policies.get(e.policy, e.policy_params)
                except ConfigError as exc:
                    failed[fn] = f"policy override of {fn}: {exc}"
                    errors.append(failed[fn])
        return rules, overrides, failed

    def of(self, fn: str, operator: FunctionControls, config: ControllerConfig, plan: PlanConfig) -> Effective:
        lo, hi = plan.limits(fn)
        base = FunctionControls(
            paused=False,
            min=lo,
            max=hi,
            policy=config.policy,
            policy_params=dict(config.policy_params),
            dry_run=config.dry_run,
            idle_s=plan.scale_to_zero_idle_s,
        )
        return effective(fn, base, self.declared.get(fn, FunctionControls()), operator, stock=config.mode == "stock")

    def dry_run(self, fn: str, config: ControllerConfig) -> bool:
        """The controller-wide dry run wins; a function's own makes only that one recommend-only."""
        e = self.effective.get(fn)
        return config.dry_run or (e is not None and e.dry_run)

    def view(self, fn: str, config: ControllerConfig, plan: PlanConfig) -> dict:
        """Effective controls of one function and the layers they came from."""
        operator = self.store.get(fn)
        e = self.of(fn, operator, config, plan)
        return {
            **asdict(e),
            "dry_run": config.dry_run or e.dry_run,
            "layers": {
                "function config": self.declared.get(fn, FunctionControls()).set_fields(),
                "operator": operator.set_fields(),
            },
        }

    def set(self, fn: str, update: dict, config: ControllerConfig, plan: PlanConfig) -> FunctionControls:
        """Operator controls of one function changed (None clears a field), checked, then stored on the
        controls topic, so every replica and the next leader follow them."""
        controls = self.store.get(fn).changed(update, f"controls of {fn}")
        if config.mode == "stock" and controls.min == 0:
            raise ConfigError(f"{fn}: min 0 refused: stock Pulsar refuses parallelism 0 (no scale to zero); min stays at least 1")
        e = self.of(fn, controls, config, plan)
        if (e.policy, e.policy_params) != (config.policy, dict(config.policy_params)):
            self.policies.get(e.policy, e.policy_params)  # a bad policy or parameter is refused now, not each period
        self.store.put(fn, controls)
        return controls
