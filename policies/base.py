"""The policy plugin interface: a pure function of (graph, snapshot, current parallelism, state).

No I/O, no clock, no randomness: the same policy runs identically in the live controller and
in the simulator, and a decision can be replayed from the decision log. Memory a policy
needs (a forecast's history, counters across periods) comes in as `state` and goes out in
the Proposal. A None figure in the snapshot means unknown: keep that function's parallelism
and say so in the reason. Bounds, cooldown and stabilization are not a policy's business: the
Plan step applies them to every policy's output.

Two kinds of check call `decide` (`snapshot.check` says which):
- "period": the regular period (30 s by default); every figure is over `snapshot.window_s`; the
  state the Proposal returns is kept.
- "fast": the fast path (controller.fast, every second or two when enabled): a short window,
  arrival rate and backlog measured at the consumers. Only scale-outs of functions that are
  falling behind are applied, and the returned state is dropped, so a policy written for the
  period alone stays correct unchanged. A policy that wants to act differently reads
  `snapshot.check`; one that must never be asked between periods sets `fast = False`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.snapshot import Snapshot


@dataclass(frozen=True)
class Proposal:
    targets: dict[str, int]  # function -> proposed parallelism
    reasons: dict[str, str] = field(default_factory=dict)  # function -> why, with the numbers
    state: Any = None  # handed back to decide() next period


@dataclass(frozen=True)
class NoConfig:
    """For policies without parameters."""


class Policy(ABC):
    name: ClassVar[str]
    Config: ClassVar[type] = NoConfig
    fast: ClassVar[bool] = True  # asked at fast checks too (see the module text)

    def __init__(self, config=None):
        self.config = config if config is not None else self.Config()

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None = None) -> Policy:
        """Build from user parameters; an unknown key or a wrong type is a ConfigError that names
        it and lists the valid keys."""
        # imported here: controller_config pulls in the Pulsar client, which a policy never needs
        from pulsar_autoscale.configparse import from_mapping

        return cls(from_mapping(cls.Config, dict(params or {}), f"policy {cls.name} parameters"))

    @abstractmethod
    def decide(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], state: Any) -> Proposal:
        """Proposed parallelism per function for the next period."""
