"""Per-function policies (a function's own `policy` control), each loaded once per name and parameters.
Such names come from REST callers and from functions' own configs, so they never reach a file the operator
did not put in policy_dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.policies import Policy, load_policy


class PolicyRegistry:
    def __init__(self, own: str, policy_dir: str | None, load: Callable[[str, dict], Policy] = load_policy):
        self.own, self.policy_dir = own, policy_dir  # the controller's own policy, from its config file
        self._load = load
        self._policies: dict[str, Policy] = {}

    def reset(self, own: str, policy_dir: str | None) -> None:
        """A reload: the config's names now, every policy loaded again when next asked for."""
        self.own, self.policy_dir = own, policy_dir
        self._policies.clear()

    def get(self, spec: str, params: dict) -> tuple[str, Policy]:
        """The policy and its key (the autoscaler keeps one state per key)."""
        key = f"{spec} {json.dumps(params, sort_keys=True)}"
        if key not in self._policies:
            self._policies[key] = self._load(self._named(spec), params)
        return key, self._policies[key]

    def _named(self, name: str) -> str:
        if name == self.own:
            return name
        if name.endswith(".py") or "/" in name or "\\" in name:
            raise ConfigError(
                f"policy {name!r}: a per-function policy is given by name, not by file: register it "
                f"as an entry point or put NAME.py in the controller's policy_dir"
            )
        if self.policy_dir:
            plugin = Path(self.policy_dir, f"{name}.py")
            if plugin.is_file():
                return str(plugin)
        return name
