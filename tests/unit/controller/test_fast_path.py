"""The fast path: consumer-measured figures, the scale-out-only gate, and the policy interface."""

from __future__ import annotations

import pytest

from pulsar_autoscale.controller.autoscaler import Autoscaler
from pulsar_autoscale.controller.fast import FastConfig, admit, consumer_snapshot
from pulsar_autoscale.controller.planner import PlanConfig, Planner
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies import Policy, Proposal
from pulsar_autoscale.snapshot import FunctionCounters, FunctionSnapshot, Snapshot

F = "t/n/f"
GRAPH = AppGraph.build([FunctionNode(F, ("persistent://t/n/in",), None)])


def counters(t, received, wait_s, newest, busy=None):
    return FunctionCounters(
        time=t,
        arrived=None,
        received=received,
        processed=received,
        busy_s=busy if busy is not None else received * 0.25,
        wait_s=wait_s,
        newest_publish_s=newest,
    )


def test_consumer_rate_is_the_publish_rate_while_falling_behind():
    # 2 instances take 8 msg/s for 2 s, but what they took was published within 0.4 s: 40 msg/s arrive
    fs = consumer_snapshot(F, 2, counters(100.0, 100, 10.0, 99.9), counters(102.0, 116, 10.0 + 16 * 1.5, 100.3), 2)
    assert fs.arrival_rate == pytest.approx(16 / 0.4)
    assert fs.backlog == pytest.approx(40 * 1.5)  # Little: rate x mean wait
    assert fs.service_rate == pytest.approx(4.0)


def test_consumer_rate_when_idle_and_when_keeping_up():
    idle = consumer_snapshot(F, 1, counters(0.0, 10, 0.0, 0.0), counters(2.0, 10, 0.0, 0.0), 1)
    assert idle.arrival_rate == 0.0
    steady = consumer_snapshot(F, 1, counters(0.0, 10, 0.0, 0.0), counters(2.0, 14, 0.2, 1.9), 1)
    assert steady.arrival_rate == pytest.approx(4 / 1.9)
    assert steady.backlog == pytest.approx(4 / 1.9 * 0.05)


def snap(fs: FunctionSnapshot, check="fast") -> Snapshot:
    return Snapshot(10.0, 2.0, {F: fs}, check=check)


def test_admit_keeps_only_scale_outs_of_functions_falling_behind():
    cfg = FastConfig(enabled=True)
    behind = FunctionSnapshot(F, 2, arrival_rate=40.0, backlog=60.0, service_rate=4.0)
    keeping_up = FunctionSnapshot(F, 2, arrival_rate=7.0, backlog=60.0, service_rate=4.0)  # rho 0.875 < 0.9
    short_backlog = FunctionSnapshot(F, 2, arrival_rate=9.0, backlog=3.0, service_rate=4.0)  # 3 < 1 s x 8/s
    assert admit(Proposal({F: 11}), snap(behind), {F: 2}, cfg).targets == {F: 11}
    assert admit(Proposal({F: 11}), snap(keeping_up), {F: 2}, cfg).targets == {F: 2}
    assert admit(Proposal({F: 11}), snap(short_backlog), {F: 2}, cfg).targets == {F: 2}
    assert admit(Proposal({F: 1}), snap(behind), {F: 2}, cfg).targets == {F: 2}  # never scale in


class Remembering(Policy):
    """An old-style plugin: knows nothing of fast checks, keeps a counter in its state."""

    name = "remembering"

    def decide(self, graph, snapshot, current, state):
        return Proposal({F: 8}, {F: "more"}, (state or 0) + 1)


class PeriodOnly(Remembering):
    fast = False


def test_fast_check_applies_a_scale_out_and_drops_the_policy_state():
    a = Autoscaler(Remembering(), Planner(PlanConfig(scale_in_stabilization_s=30.0)), FastConfig(enabled=True))
    a.step(GRAPH, snap(FunctionSnapshot(F, 2), check="period"), {F: 2}, 0.0)
    assert a.policy_state == 1
    behind = FunctionSnapshot(F, 2, arrival_rate=40.0, backlog=60.0, service_rate=4.0)
    [d] = a.step(GRAPH, snap(behind), {F: 2}, 1.0).decisions
    assert (d.old, d.new) == (2, 8) and d.reason.startswith("fast:")
    assert a.policy_state == 1  # a fast check does not advance the policy's memory


def test_fast_keeps_do_not_block_scale_in_but_fast_scale_outs_do():
    planner = Planner(PlanConfig(scale_in_stabilization_s=30.0))
    from pulsar_autoscale.controller.planner import PlanState

    state = PlanState()
    quiet = Snapshot(0.0, 30.0, {F: FunctionSnapshot(F, 4, backlog=0.0)})
    for t in range(1, 29):  # fast checks that keep 4 leave no trace in the window
        _, state = planner.plan(Proposal({F: 4}), quiet, {F: 4}, state, float(t), fast=True)
    [d], state = planner.plan(Proposal({F: 2}), quiet, {F: 4}, state, 30.0)
    assert d.new == 2
    [d], state = planner.plan(Proposal({F: 6}), quiet, {F: 2}, state, 31.0, fast=True)
    assert d.new == 6
    [d], _ = planner.plan(Proposal({F: 2}), quiet, {F: 6}, state, 60.0)
    assert d.new == 6 and "stabilization" in d.reason


def test_a_policy_can_opt_out_of_fast_checks():
    a = Autoscaler(PeriodOnly(), Planner(), FastConfig(enabled=True))
    assert (
        a.step(GRAPH, snap(FunctionSnapshot(F, 2, arrival_rate=40.0, backlog=60.0, service_rate=4.0)), {F: 2}, 1.0).decisions
        == []
    )


def test_fast_config_is_validated():
    with pytest.raises(ConfigError, match="window_s"):
        FastConfig(enabled=True, period_s=2.0, window_s=1.0)
    assert FastConfig(enabled=True).stabilization({}, 30.0) == {"scale_in_stabilization_s": 30.0, "fast_scale_in_hold_s": 60.0}
    assert FastConfig(enabled=True).stabilization({}, 5.0, 10.0) == {
        "scale_in_stabilization_s": 10.0,
        "fast_scale_in_hold_s": 15.0,
    }
    assert FastConfig().stabilization({}, 30.0) == {}


def test_demo_table_fits_80_columns_with_short_decisions():
    from types import SimpleNamespace

    from rich.console import Console

    from pulsar_autoscale.cli.demo import STAGES, render
    from pulsar_autoscale.cli.demo_report import Recorder, Sample

    long = "fast: lambda 39.3/s, backlog 78 vs 10 x mu 3.79/s; " + "x" * 300
    decisions = [
        {"function": f"public/default/{st.name}", "kind": "fast", "old": 1, "new": 12, "time": 130.0, "reason": long}
        for st in STAGES
    ]
    controller = SimpleNamespace(
        config=SimpleNamespace(policy="predictive"), last_observation=None, history=[SimpleNamespace(decisions=decisions)]
    )
    sample = Sample(130.0, 40.0, {st.name: 12 for st in STAGES}, {}, 0.4, 1.9)
    console = Console(width=200, record=True)
    console.print(render(controller, Recorder(), sample, 130.0, t0=100.0))
    lines = console.export_text().splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    rows = [line for line in lines if "fast 1->12 @30s" in line]
    assert len(rows) == len(STAGES), "each function's decision on one line"
