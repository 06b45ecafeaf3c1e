"""Autoscaler.step: the policy, then the Plan step; state carried between periods; errors contained."""

from __future__ import annotations

import pytest

from pulsar_autoscale.controller.autoscaler import Autoscaler
from pulsar_autoscale.controller.planner import PlanConfig, Planner
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies.base import Policy, Proposal
from pulsar_autoscale.policies.threshold import ThresholdPolicy
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot

FN = "t/n/f"
GRAPH = AppGraph.build([FunctionNode(FN, ("src",), None)])


def snap(backlog: float) -> Snapshot:
    return Snapshot(time=0.0, window_s=30.0, functions={FN: FunctionSnapshot(FN, 2, backlog=backlog)})


class Counting(Policy):
    """Proposes one more instance each period, counting periods in its state."""

    name = "counting"

    def decide(self, graph, snapshot, current, state):
        periods = (state or 0) + 1
        return Proposal({fn: k + 1 for fn, k in current.items()}, {fn: f"period {periods}" for fn in current}, periods)


class Scripted(Counting):
    """Counting, except in the periods listed in `bad`, where it misbehaves as told."""

    name = "scripted"

    def __init__(self, bad: dict[int, object]):
        super().__init__()
        self.bad = bad

    def decide(self, graph, snapshot, current, state):
        period = (state or 0) + 1
        if period in self.bad:
            misbehaviour = self.bad.pop(period)
            if isinstance(misbehaviour, Exception):
                raise misbehaviour
            return misbehaviour
        return super().decide(graph, snapshot, current, state)


def test_step_runs_policy_then_plan():
    autoscaler = Autoscaler(ThresholdPolicy(), Planner(PlanConfig(max_parallelism=2)))
    # backlog 151 > T_out 150: the policy says 3, the Plan step bounds it to 2
    (d,) = autoscaler.step(GRAPH, snap(151), {FN: 2}, now=0.0).decisions
    assert (d.proposed, d.new, d.changed) == (3, 2, False) and "bounded to [1, 2]" in d.reason


def test_policy_state_is_handed_back_next_period():
    autoscaler = Autoscaler(Counting())
    for period, k in ((1, 1), (2, 2), (3, 3)):
        (d,) = autoscaler.step(GRAPH, snap(0), {FN: k}, now=30.0 * period).decisions
        assert d.reason == f"period {period}" and d.new == k + 1
    assert autoscaler.policy_state == 3 and autoscaler.errors == 0


def test_plan_state_is_kept_between_periods():
    autoscaler = Autoscaler(Counting(), Planner(PlanConfig(cooldown_s=60)))
    assert autoscaler.step(GRAPH, snap(0), {FN: 1}, now=0.0).decisions[0].new == 2
    (d,) = autoscaler.step(GRAPH, snap(0), {FN: 2}, now=30.0).decisions
    assert d.new == 2 and "cooldown" in d.reason


@pytest.mark.parametrize(
    "misbehaviour, needle",
    [
        (ZeroDivisionError("oops"), "scripted: ZeroDivisionError: oops at "),
        ({FN: 3}, "returned dict, not a Proposal"),
        (Proposal({FN: -1}, {}), "parallelism -1 for t/n/f"),
        (Proposal({FN: 0}, {}), "parallelism 0 for t/n/f"),
        (Proposal({FN: 2.5}, {}), "non-integer parallelism 2.5 for t/n/f"),
        (Proposal({FN: True}, {}), "non-integer parallelism True for t/n/f"),
        (Proposal({"t/n/ghost": 2}, {}), "unknown function 't/n/ghost'"),
    ],
)
def test_a_misbehaving_policy_is_contained(misbehaviour, needle):
    autoscaler = Autoscaler(Scripted({2: misbehaviour}), Planner(PlanConfig(cooldown_s=60)))
    assert autoscaler.step(GRAPH, snap(0), {FN: 1}, now=0.0).decisions[0].new == 2  # period 1: fine
    plan_state = autoscaler.plan_state
    result = autoscaler.step(GRAPH, snap(0), {FN: 2}, now=30.0)  # period 2: misbehaves
    assert result.decisions == [] and needle in result.error
    assert autoscaler.errors == 1
    assert autoscaler.policy_state == 1 and autoscaler.plan_state is plan_state  # nothing moved on
    # the loop goes on: period 2 again, now well-behaved, sees the state from period 1
    (d,) = autoscaler.step(GRAPH, snap(0), {FN: 2}, now=90.0).decisions
    assert d.reason == "period 2" and d.new == 3 and autoscaler.errors == 1


def test_error_location_points_into_the_policy():
    autoscaler = Autoscaler(Scripted({1: KeyError("x")}))
    error = autoscaler.step(GRAPH, snap(0), {FN: 1}, now=0.0).error
    assert __file__ in error and error.startswith("scripted: KeyError: 'x' at ")
