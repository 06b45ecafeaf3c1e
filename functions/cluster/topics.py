"""The topics a cluster named NAME coordinates on (docs/cluster.md lists what each holds)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pulsar_autoscale.errors import ConfigError

PREFIX = "persistent://public/default/__pulsar_autoscale_cluster"


@dataclass(frozen=True)
class ClusterTopics:
    name: str

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.name):
            raise ConfigError(f"cluster name {self.name!r} must be 1-64 letters, digits, '-' or '_'")

    def _topic(self, role: str) -> str:
        return f"{PREFIX}_{self.name}_{role}"

    @property
    def membership(self) -> str:
        return self._topic("membership")

    @property
    def metadata(self) -> str:
        return self._topic("metadata")

    @property
    def packages(self) -> str:
        return self._topic("packages")

    @property
    def assignments(self) -> str:
        return self._topic("assignments")

    @property
    def leader_lock(self) -> str:
        return self._topic("leader")
