"""Analyze + Plan, shared by the live controller and the simulator: the policy, then the Plan step.

It holds the only memory between periods (each policy's state and the Plan state) and contains
a failing policy: an exception or an unusable proposal yields no decisions for the functions it
decides and an error text, `errors` goes up, its state stays as it was, and the next period tries
again. A function may have its own policy (an override from its controls): functions are grouped
by policy and each group's policy sees the whole graph and snapshot but only its own functions in
`current`. A paused function and one at parallelism 0 go to no policy: the Plan step handles them.

A snapshot with `check == "fast"` is the fast path's (controller.fast): its proposal passes
`fast.admit` (scale-outs of functions falling behind only) and its policy state is dropped.
A policy whose class sets `fast = False` is not asked at fast checks.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Mapping

from pulsar_autoscale.controller import fast as fastpath
from pulsar_autoscale.controller.planner import (
    Decision,
    FunctionPlan,
    Planner,
    PlanState,
    PolicyError,
    Proposal,
    validate_proposal,
)
from pulsar_autoscale.graph import AppGraph
from pulsar_autoscale.policies.base import Policy
from pulsar_autoscale.snapshot import Snapshot

DEFAULT = ""  # the key of the controller's own policy among the policies' states


@dataclass(frozen=True)
class StepResult:
    decisions: list[Decision] = field(default_factory=list)
    error: str | None = None
    failed: dict[str, str] = field(default_factory=dict)  # function -> its policy's error (no decision)


class Autoscaler:
    def __init__(self, policy: Policy, planner: Planner | None = None, fast: fastpath.FastConfig | None = None):
        self.policy = policy
        self.planner = planner or Planner()
        self.fast = fast or fastpath.FastConfig()
        self.states: dict[str, Any] = {}  # policy key -> its state
        self.plan_state = PlanState()
        self.errors = 0
        self.last_error: str | None = None  # the latest policy failure, for a summary after a run

    @property
    def policy_state(self) -> Any:
        return self.states.get(DEFAULT)

    def step(
        self,
        graph: AppGraph,
        snapshot: Snapshot,
        current: Mapping[str, int],
        now: float,
        rules: Mapping[str, FunctionPlan] | None = None,
        overrides: Mapping[str, tuple[str, Policy]] | None = None,
    ) -> StepResult:
        """`rules`: per-function Plan rules; `overrides`: function -> (key, policy) for a function that
        has its own policy (the key names its state)."""
        rules, overrides = rules or {}, overrides or {}
        fast = snapshot.check == "fast"
        groups: dict[str, tuple[Policy, dict[str, int]]] = {}
        for fn, k in current.items():
            if k > 0 and not (fn in rules and rules[fn].paused):
                key, policy = overrides.get(fn, (DEFAULT, self.policy))
                if not fast or getattr(policy, "fast", True):
                    groups.setdefault(key, (policy, {}))[1][fn] = k
        if fast and not groups:
            return StepResult()
        targets, reasons, errors, failed = {}, {}, [], {}
        for key, (policy, group) in groups.items():
            try:
                proposal = policy.decide(graph, snapshot, group, self.states.get(key))
                validate_proposal(proposal, group)
            except Exception as exc:  # a plugin's bug must not stop the loop
                self.errors += 1
                error = self.last_error = f"{policy.name}: {_describe(exc)}"
                errors.append(error)
                failed.update(dict.fromkeys(group, error))
                continue
            if fast:
                proposal = fastpath.admit(proposal, snapshot, group, self.fast)
            else:
                self.states[key] = proposal.state
            targets.update(proposal.targets)
            reasons.update(proposal.reasons)
        planned = {fn: k for fn, k in current.items() if fn not in failed}
        if not planned:  # nothing to plan: the Plan state does not move on either
            return StepResult([], "; ".join(errors) or None, failed)
        decisions, state = self.planner.plan(
            Proposal(targets, reasons), snapshot, planned, self.plan_state, now, fast=fast, rules=rules
        )
        self.plan_state = _keep(self.plan_state, state, failed) if failed else state
        return StepResult(decisions, "; ".join(errors) or None, failed)


def _keep(old: PlanState, new: PlanState, functions: Mapping[str, Any]) -> PlanState:
    """The new Plan state, with the old memory of `functions` (not planned this period) kept."""

    def merged(a: Mapping, b: Mapping) -> dict:
        return {**{fn: v for fn, v in a.items() if fn in functions}, **b}

    return PlanState(
        merged(old.last_change, new.last_change),
        merged(old.recent, new.recent),
        merged(old.idle_since, new.idle_since),
        merged(old.fast_out, new.fast_out),
    )


def _describe(exc: Exception) -> str:
    """The exception and, for a crash inside the policy, the line that raised it."""
    if isinstance(exc, PolicyError) or exc.__traceback__ is None:
        return f"{type(exc).__name__}: {exc}"
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {exc} at {where.filename}:{where.lineno}"
