"""Analyze + Plan, shared by the live controller and the simulator: the policy, then the Plan step.

It holds the only memory between periods (the policy's state and the Plan state) and contains
a failing policy: an exception or an unusable proposal yields no decisions and an error text,
`errors` goes up, the policy state stays as it was, and the next period tries again.

A snapshot with `check == "fast"` is the fast path's (controller.fast): its proposal passes
`fast.admit` (scale-outs of functions falling behind only) and its policy state is dropped.
A policy whose class sets `fast = False` is not asked at fast checks.
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from typing import Any, Mapping

from pulsar_autoscale.controller import fast as fastpath
from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.controller.planner import Decision, Planner, PlanState, PolicyError, validate_proposal
from pulsar_autoscale.policies.base import Policy
from pulsar_autoscale.snapshot import Snapshot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    decisions: list[Decision] = field(default_factory=list)
    error: str | None = None


class Autoscaler:
    def __init__(self, policy: Policy, planner: Planner | None = None, fast: fastpath.FastConfig | None = None):
        self.policy = policy
        self.planner = planner or Planner()
        self.fast = fast or fastpath.FastConfig()
        self.policy_state: Any = None
        self.plan_state = PlanState()
        self.errors = 0

    def step(self, graph: AppGraph, snapshot: Snapshot, current: Mapping[str, int], now: float) -> StepResult:
        fast = snapshot.check == "fast"
        if fast and not getattr(self.policy, "fast", True):
            return StepResult()
        try:
            proposal = self.policy.decide(graph, snapshot, current, self.policy_state)
            validate_proposal(proposal, current)
        except Exception as exc:  # a plugin's bug must not stop the loop
            self.errors += 1
            error = f"{self.policy.name}: {_describe(exc)}"
            log.warning("policy error, nothing applied this period: %s", error)
            return StepResult(error=error)
        if fast:
            proposal = fastpath.admit(proposal, snapshot, current, self.fast)
        else:
            self.policy_state = proposal.state
        decisions, self.plan_state = self.planner.plan(proposal, snapshot, current, self.plan_state, now, fast=fast)
        return StepResult(decisions)


def _describe(exc: Exception) -> str:
    """The exception and, for a crash inside the policy, the line that raised it."""
    if isinstance(exc, PolicyError) or exc.__traceback__ is None:
        return f"{type(exc).__name__}: {exc}"
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {exc} at {where.filename}:{where.lineno}"
