"""The Plan step: bounds with globs, stabilization, draining, max step, cooldown; proposal checks."""

from __future__ import annotations

import pytest

from pulsar_autoscale.controller.planner import Decision, PlanConfig, Planner, PlanState, PolicyError, validate_proposal
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies.base import Proposal
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot

FN = "t/n/f"


def plan(config: PlanConfig, target: int, old: int, backlog=None, state=None, now=100.0, fn=FN):
    snap = Snapshot(now, 30.0, {fn: FunctionSnapshot(fn, old, backlog=backlog)})
    decisions, state = Planner(config).plan(
        Proposal({fn: target}, {fn: "policy says so"}), snap, {fn: old}, state or PlanState(), now
    )
    assert len(decisions) == 1
    return decisions[0], state


def test_decision_records_old_proposed_new_and_inputs():
    d, _ = plan(PlanConfig(), 4, 2, backlog=7.0)
    assert (d.function, d.old, d.proposed, d.new, d.changed) == (FN, 2, 4, 4, True)
    assert d.reason == "policy says so" and d.inputs.backlog == 7.0
    assert not plan(PlanConfig(), 2, 2)[0].changed


def test_bounds_defaults_and_first_matching_glob():
    cfg = PlanConfig(max_parallelism=15, bounds=(("t/n/rec*", 2, 6), ("t/n/*", 1, 3)))
    d = plan(cfg, 20, 1, fn="t/n/recognize")[0]
    assert d.new == 6 and d.proposed == 20 and "bounded to [2, 6]" in d.reason
    assert plan(cfg, 1, 3, fn="t/n/recognize")[0].new == 2  # min of the pattern
    assert plan(cfg, 20, 1, fn="t/n/other")[0].new == 3  # second pattern
    assert plan(cfg, 20, 1, fn="x/y/z")[0].new == 15  # no pattern: the defaults
    assert plan(PlanConfig(min_parallelism=2), 1, 3)[0].new == 2


def test_scale_in_stabilization_uses_the_highest_recent_recommendation():
    cfg = PlanConfig(scale_in_stabilization_s=60)
    d, st = plan(cfg, 5, 5, now=0)  # window: 5@0
    d, st = plan(cfg, 2, 5, state=st, now=30)
    assert d.new == 5 and "highest recommendation in 60s is 5" in d.reason  # window 5@0, 2@30
    d, st = plan(cfg, 3, 5, state=st, now=59)
    assert d.new == 5  # 5@0 still inside: 59 - 0 < 60
    d, st = plan(cfg, 2, 5, state=st, now=60)
    assert d.new == 3  # window 2@30, 3@59, 2@60: max 3
    assert plan(cfg, 9, 5, state=st, now=61)[0].new == 9  # scale-out is never held back


def test_no_scale_in_while_backlog_drains():
    cfg = PlanConfig(draining_backlog=100)
    d = plan(cfg, 1, 4, backlog=500)[0]
    assert d.new == 4 and "no scale-in while backlog 500 > 100 drains" in d.reason
    assert plan(cfg, 1, 4, backlog=100)[0].new == 1  # at the threshold: not draining
    assert plan(cfg, 1, 4, backlog=None)[0].new == 1  # unknown backlog does not block
    assert plan(cfg, 8, 4, backlog=500)[0].new == 8  # scale-out is never blocked by a backlog
    assert plan(PlanConfig(no_scale_in_while_draining=False), 1, 4, backlog=500)[0].new == 1


def test_max_step():
    cfg = PlanConfig(max_step=2)
    assert plan(cfg, 10, 1)[0].new == 3  # 1 + 2
    assert plan(cfg, 1, 10)[0].new == 8  # 10 - 2
    assert plan(cfg, 2, 1)[0].new == 2  # within the step


def test_cooldown_follows_an_applied_change():
    cfg = PlanConfig(cooldown_s=60)
    d, st = plan(cfg, 5, 1, now=0)
    assert d.new == 5
    # applied: current shows 5 at t=30 -> 30 s < 60 s, held
    d, st2 = plan(cfg, 8, 5, state=st, now=30)
    assert d.new == 5 and "cooldown: last change 30s ago < 60s" in d.reason
    # at t=60 the cooldown is over
    assert plan(cfg, 8, 5, state=st2, now=60)[0].new == 8
    # not applied (dry run, failed execution): current still shows 1, so no cooldown
    assert plan(cfg, 5, 1, state=st, now=30)[0].new == 5


def test_bounds_win_over_cooldown_and_step():
    cfg = PlanConfig(max_parallelism=4, cooldown_s=600, max_step=1)
    d, st = plan(cfg, 10, 9, now=0)  # current 9 is above the maximum 4: straight to 4
    assert d.new == 4 and "outside bounds [1, 4]" in d.reason


def test_a_function_without_proposal_keeps_its_parallelism():
    snap = Snapshot(0.0, 30.0, {})
    decisions, _ = Planner().plan(Proposal({"a": 3}, {}), snap, {"a": 1, "b": 2}, PlanState(), 0.0)
    assert [(d.function, d.new, d.inputs) for d in decisions] == [("a", 3, None), ("b", 2, None)]
    assert decisions[1].reason == "no proposal: keep"


def test_plan_state_is_not_mutated():
    cfg = PlanConfig(cooldown_s=60, scale_in_stabilization_s=60)
    _, st = plan(cfg, 5, 1, now=0)
    before = (dict(st.last_change), dict(st.recent))
    plan(cfg, 2, 5, state=st, now=10)
    assert (dict(st.last_change), dict(st.recent)) == before


def test_plan_config_is_checked():
    with pytest.raises(ConfigError, match="bounds 'x\\*'"):
        PlanConfig(bounds=(("x*", 3, 2),))
    with pytest.raises(ConfigError, match="max_step"):
        PlanConfig(max_step=0)


@pytest.mark.parametrize(
    "targets, needle",
    [
        ({"a": 0}, "parallelism 0 for a: must be at least 1"),
        ({"a": -2}, "parallelism -2 for a"),
        ({"a": 2.0}, "non-integer parallelism 2.0 for a"),
        ({"a": True}, "non-integer parallelism True for a"),
        ({"a": "3"}, "non-integer parallelism '3' for a"),
        ({"ghost": 2}, "unknown function 'ghost'"),
    ],
)
def test_validate_proposal_names_the_function_and_value(targets, needle):
    graph = AppGraph.build([FunctionNode("a", ("src",), None)])
    for names in (graph, {"a": 1}, ["a"]):
        with pytest.raises(PolicyError) as err:
            validate_proposal(Proposal(targets, {}), names)
        assert needle in str(err.value) and isinstance(err.value, PulsarAutoscaleError)


def test_validate_proposal_accepts_good_and_refuses_non_proposals():
    validate_proposal(Proposal({"a": 1, "b": 15}, {}), ["a", "b"])
    with pytest.raises(PolicyError, match="returned dict, not a Proposal"):
        validate_proposal({"a": 1}, ["a"])


def test_decision_changed_is_a_field():
    d = Decision("a", 2, 3, 2, "held")
    assert d.changed is False and "changed" in d.__dataclass_fields__


def test_failover_functions_are_capped_at_their_partitions():
    from pulsar_autoscale.controller.planner import Decision, apply_caps

    grow = Decision("t/n/ordered", 1, 6, 6, "policy")
    capped = apply_caps([grow, Decision("t/n/free", 1, 6, 6, "policy")], {"t/n/ordered": 2})
    assert [(d.function, d.new) for d in capped] == [("t/n/ordered", 2), ("t/n/free", 6)]
    assert "FAILOVER: only 2 input partition(s)" in capped[0].reason
    shrink = Decision("t/n/ordered", 4, 3, 3, "policy")  # already above the cap: scaling in is left alone
    assert apply_caps([shrink], {"t/n/ordered": 2})[0].new == 3


def test_restart_aware_plans_fewer_larger_changes():
    from pulsar_autoscale.controller.planner import restart_aware

    cfg = PlanConfig(**restart_aware({}, period_s=30))
    assert (cfg.cooldown_s, cfg.scale_in_stabilization_s, cfg.min_scale_in) == (90, 150, 2)
    d, _ = plan(cfg, 4, 2)
    assert d.new == 5 and "headroom 0.25" in d.reason  # ceil(4 * 1.25) = 5
    d, _ = plan(cfg, 4, 5)
    assert d.new == 5 and "min_scale_in 2" in d.reason  # freeing one instance is not worth a restart
    d, _ = plan(cfg, 3, 5)
    assert d.new == 3
    assert PlanConfig(**restart_aware({"cooldown_s": 5}, period_s=30)).cooldown_s == 5  # explicit settings win
