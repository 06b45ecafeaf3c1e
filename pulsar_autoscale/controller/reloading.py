"""A reload (SIGHUP, POST /autoscaler/reload) reads the config file again and builds everything it
changes before the loop swaps anything in, so a bad file leaves the running config as it was."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from pulsar_autoscale.controller.burst_plan import BurstConfig
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.planner import Planner
from pulsar_autoscale.controller.planning_config import build_planner
from pulsar_autoscale.controller.warm_sizing import WarmPoolConfig
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.policies import Policy, load_policy

log = logging.getLogger(__name__)


@dataclass
class Reloaded:
    config: ControllerConfig
    changed: list[str]  # the options that changed
    kept: list[str]  # the options that changed but need a restart: not applied
    policy: Policy
    planner: Planner
    burst: BurstConfig
    warm_pool: WarmPoolConfig


def read(path: str | None, overrides: dict, running: ControllerConfig) -> Reloaded:
    """The file at `path` with the command line's `overrides` over it, checked and built (ConfigError says why not)."""
    if not path:
        raise ConfigError("this controller was not started from a config file: nothing to reload")
    try:
        new = ControllerConfig.from_file(path)
        new = ControllerConfig(**{**new.__dict__, **overrides}) if overrides else new
        new, kept = running.reloaded(new)
        changed = [f.name for f in dataclasses.fields(new) if getattr(new, f.name) != getattr(running, f.name)]
        return Reloaded(
            new,
            changed,
            kept,
            load_policy(new.policy, new.policy_params),
            build_planner(new),
            new.burst_config(),
            new.warm_pool_config(),
        )
    except ConfigError as exc:
        log.error("reload of %s refused, the running config stays: %s", path, exc)
        raise ConfigError(f"reload of {path} refused, the running config stays: {exc}") from exc
