"""The Plan step as the controller's config asks for it: bounds, cooldown and stabilization, adjusted to
the mode (stock Pulsar restarts every instance on each update) and to the fast path's windows."""

from __future__ import annotations

from pulsar_autoscale.configparse import from_mapping
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.planner import PlanConfig, Planner, restart_aware
from pulsar_autoscale.errors import ConfigError


def build_planner(config: ControllerConfig) -> Planner:
    # stock Pulsar restarts every instance on each update: plan fewer, larger changes there
    plan = restart_aware(config.plan, config.period_s) if config.mode == "stock" else dict(config.plan)
    plan = config.fast_config().stabilization(plan, config.period_s, config.window_s)
    try:
        return Planner(plan_config(plan))
    except TypeError as exc:
        raise ConfigError(f"plan: {exc}") from exc


def plan_config(data: dict) -> PlanConfig:
    data = dict(data)
    if "bounds" in data:
        bounds = []
        for b in data["bounds"]:
            if not isinstance(b, dict) or "pattern" not in b:
                raise ConfigError(f"plan.bounds entries need pattern, min and max; got {b!r}")
            bounds.append((b["pattern"], int(b.get("min", 1)), int(b.get("max", 15))))
        data["bounds"] = tuple(bounds)
    return from_mapping(PlanConfig, data, "plan")
