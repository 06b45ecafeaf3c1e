"""A fast scale-out is not undone by the next regular period, whose window still holds the time before
the burst; once a period's window lies after it, that period may scale in (the load has fallen)."""

from __future__ import annotations

from pulsar_autoscale.controller.autoscaler import Autoscaler
from pulsar_autoscale.controller.fast import FastConfig
from pulsar_autoscale.controller.planner import PlanConfig, Planner, PlanState
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies import Policy, Proposal
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot

F = "t/n/f"
# the demo's period 5 s and window 10 s give a hold of 15 s after each fast scale-out (test_fast_path checks
# FastConfig.stabilization); here the hold alone, without the stabilization window beside it
CONFIG = PlanConfig(fast_scale_in_hold_s=15.0)


def step(planner: Planner, state: PlanState, target: int, old: int, now: float, fast: bool = False):
    snap = Snapshot(now, 10.0, {F: FunctionSnapshot(F, old, backlog=0.0)}, check="fast" if fast else "period")
    [d], state = planner.plan(Proposal({F: target}, {F: "policy"}), snap, {F: old}, state, now, fast=fast)
    return d, state


def test_the_next_periods_keep_a_fast_scale_out():
    planner = Planner(CONFIG)
    d, state = step(planner, PlanState(), 3, 1, 24.0, fast=True)
    assert (d.old, d.new) == (1, 3)
    for now in (30.0, 35.0):  # windows [20, 30] and [25, 35] still hold the time before 24
        d, state = step(planner, state, 2, 3, now)
        assert d.new == 3 and "fast scale-out to 3" in d.reason, d.reason


def test_a_period_after_the_hold_scales_in_when_the_load_has_fallen():
    planner = Planner(CONFIG)
    _, state = step(planner, PlanState(), 3, 1, 24.0, fast=True)
    _, state = step(planner, state, 2, 3, 35.0)
    d, state = step(planner, state, 2, 3, 40.0)  # window [30, 40]: all after the scale-out
    assert d.new == 2 and "fast scale-out" not in d.reason
    assert state.fast_out == {}


def test_the_hold_does_not_block_scale_out_nor_outlive_a_later_change():
    planner = Planner(CONFIG)
    _, state = step(planner, PlanState(), 3, 1, 24.0, fast=True)
    d, state = step(planner, state, 5, 3, 30.0)  # a period scaling further out is free
    assert d.new == 5
    d, state = step(planner, state, 2, 5, 35.0)  # not below the fast scale-out's 3, within its hold
    assert d.new == 3


def test_without_the_fast_path_nothing_is_held():
    planner = Planner(PlanConfig())
    _, state = step(planner, PlanState(), 3, 1, 24.0, fast=True)
    d, _ = step(planner, state, 2, 3, 30.0)
    assert d.new == 2 and state.fast_out == {}


class Steps(Policy):
    """3 at the fast check, then 2 at every period: the flapping a period window that straddles a burst
    produces."""

    name = "steps"

    def decide(self, graph, snapshot, current, state):
        return Proposal({F: 3 if snapshot.check == "fast" else 2}, {F: "steps"}, None)


def test_the_autoscaler_keeps_the_hold_between_steps():
    graph = AppGraph.build([FunctionNode(F, ("persistent://t/n/in",), None)])
    a = Autoscaler(Steps(), Planner(CONFIG), FastConfig(enabled=True))
    behind = FunctionSnapshot(F, 1, arrival_rate=40.0, backlog=60.0, service_rate=4.0)
    [d] = a.step(graph, Snapshot(24.0, 2.0, {F: behind}, check="fast"), {F: 1}, 24.0).decisions
    assert (d.old, d.new) == (1, 3)
    [d] = a.step(graph, Snapshot(30.0, 10.0, {F: FunctionSnapshot(F, 3, backlog=0.0)}), {F: 3}, 30.0).decisions
    assert d.new == 3


def test_with_the_fast_path_a_period_does_not_undo_the_period_before():
    """The demo's settings: scale in only to the highest recommendation of one metrics window, so a
    recommendation that alternates 3, 2, 3, 2 every period keeps 3 instead of flapping."""
    planner = Planner(PlanConfig(**FastConfig(enabled=True).stabilization({}, 5.0, 10.0)))
    state, current = PlanState(), 2
    for now, target in ((75.0, 3), (80.0, 2), (85.0, 3), (90.0, 2)):
        d, state = step(planner, state, target, current, now)
        current = d.new
    assert current == 3
