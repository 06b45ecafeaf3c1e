"""Placement rules (functions/cluster/scheduler.py) and the controller's capacity cap: pure, fast."""

from __future__ import annotations

import pytest

from pulsar_autoscale.controller.capacity import ClusterCapacity, cap_to_capacity
from pulsar_autoscale.controller.planner import Decision
from pulsar_autoscale.functions.cluster.scheduler import WorkerLoad, counts, rebalance, schedule

W = [WorkerLoad("a", 4), WorkerLoad("b", 4), WorkerLoad("c", 4)]


def test_round_robin_spreads_and_a_scale_out_keeps_every_placement():
    one, _ = schedule({}, {"f": 1}, W)
    six, unplaced = schedule(one, {"f": 6}, W)
    assert unplaced == 0
    assert six["f"][0] == one["f"][0]
    assert sorted(counts(six).values()) == [2, 2, 2]


def test_scale_in_drops_the_highest_ids_and_moves_nothing_else():
    six, _ = schedule({}, {"f": 6}, W)
    two, _ = schedule(six, {"f": 2}, W)
    assert two["f"] == {0: six["f"][0], 1: six["f"][1]}


def test_a_dead_workers_instances_go_to_survivors_only():
    six, _ = schedule({}, {"f": 6}, W)
    after, _ = schedule(six, {"f": 6}, W[:2])
    assert set(after["f"].values()) <= {"a", "b"}
    assert all(after["f"][i] == w for i, w in six["f"].items() if w != "c")


def test_rebalance_leaves_pinned_functions_where_they_are():
    """keyedState functions: their instances spread like any other's, but a rebalance does not move them
    (a move would hand their key groups over)."""
    keyed = frozenset({"k"})
    lopsided = {"k": {0: "a", 1: "a", 2: "a"}, "f": {0: "a", 1: "a"}}
    balanced = rebalance(lopsided, W, keyed)
    assert balanced["k"] == lopsided["k"]
    assert set(balanced["f"].values()) == {"b", "c"}
    spread, _ = schedule({}, {"k": 3}, W)
    assert sorted(spread["k"].values()) == ["a", "b", "c"]


def test_a_joining_worker_gets_nothing_until_rebalance():
    six, _ = schedule({}, {"f": 6}, W[:2])
    joined, _ = schedule(six, {"f": 6}, W)
    assert joined == six
    balanced = rebalance(joined, W)
    assert sorted(counts(balanced).values()) == [2, 2, 2]
    assert sum(balanced["f"][i] != six["f"][i] for i in range(6)) == 2  # the fewest moves


def test_capacity_leaves_the_rest_unplaced():
    placed, unplaced = schedule({}, {"f": 5}, [WorkerLoad("a", 2), WorkerLoad("b", 1)])
    assert len(placed["f"]) == 3 and unplaced == 2


def test_least_loaded_prefers_the_idle_worker():
    busy = [WorkerLoad("a", 8, busy_rate=1.5), WorkerLoad("b", 8, busy_rate=0.1)]
    placed, _ = schedule({"f": {0: "a", 1: "a", 2: "b"}}, {"f": 4}, busy, "least-loaded")
    assert placed["f"][3] == "b"
    with pytest.raises(ValueError, match="unknown scheduler"):
        schedule({}, {"f": 1}, busy, "random")


def test_controller_caps_scale_outs_at_the_clusters_capacity_and_says_so():
    ds = cap_to_capacity(
        [Decision("a", 2, 8, 8, "queueing"), Decision("b", 1, 3, 3, "queueing")], ClusterCapacity(total=9, in_use=5, workers=3)
    )
    assert [d.new for d in ds] == [6, 1]
    assert "cluster capacity: 9 instances on 3 workers, 5 in use: capped at 6" in ds[0].reason
    assert cap_to_capacity(ds, None) == ds
