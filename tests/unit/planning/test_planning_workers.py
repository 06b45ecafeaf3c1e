"""The per-worker ceiling (the interpreter lock a thread-runtime worker's instances share): the probe,
the model, the allocation path with a shared bound, the rate-cost family, the sustain check."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pulsar_autoscale.planning.allocate import _improve, best_within, bounded_path
from pulsar_autoscale.planning.extrapolate import select
from pulsar_autoscale.planning.profile import profile_app
from pulsar_autoscale.planning.simbed import APPS, SimCluster, SimFn, SimPlanApp, SimTestbed
from pulsar_autoscale.planning.sustain import exhaustive_min
from pulsar_autoscale.planning.testbed import TestConfig
from pulsar_autoscale.planning.workers import ProbePoint, WorkerCeiling, balanced, fit_inverse


def _ceiling(a=1.0, b=0.0, slots=4, cpu=None):
    cpu = cpu or {"f": 0.01, "g": 0.01}
    return WorkerCeiling(slots, tuple(cpu), cpu, a, b)


def test_model_places_round_robin_and_binds_on_the_busiest_worker():
    w = _ceiling(slots=4)
    gains = {"f": 1.0, "g": 1.0}
    # 4 instances, 1 worker: 0.02 CPU s per source message, a ceiling of 1 -> 50/s
    assert w.rate({"f": 2, "g": 2}, gains)[0] == pytest.approx(50.0)
    # 5 instances -> 2 workers: f0 g1 on worker 0 with f2... each worker's load from its own instances
    r, j = w.rate({"f": 3, "g": 2}, gains)
    # worker 0: f(0), f(2), g(4) -> 2/3*0.01 + 0.5*0.01; worker 1: f(1), g(3) -> 1/3*0.01 + 0.5*0.01
    assert r == pytest.approx(1.0 / (2 / 3 * 0.01 + 0.5 * 0.01)) and j == 0


def test_ceiling_falls_with_threads_and_keeps_measured_lower_bounds():
    w = _ceiling(a=0.9, b=0.05)
    assert w.ceiling(1) > w.ceiling(4)
    assert w.ceiling(4) == pytest.approx(1 / 1.1)
    pts = (ProbePoint(2, {}, 100.0, 100.0, 0.012, 1, 1.0),)  # not bound: 1.2 is a lower bound
    w = WorkerCeiling(4, ("f",), {"f": 0.01}, 0.9, 0.05, pts)
    assert w.ceiling(2) == pytest.approx(1.2)


def test_inverse_ceiling_fit_uses_bound_points_only():
    pts = [ProbePoint(t, {}, 1 / (0.94 + 0.06 * t) / 0.01, 1e9, 0.01, 1, 1.0) for t in (4, 6, 8)]
    pts.append(ProbePoint(3, {}, 10.0, 10.0, 0.01, 1, 1.0))  # not bound: ignored by the fit
    a, b = fit_inverse(pts)
    assert a == pytest.approx(0.94) and b == pytest.approx(0.06)
    a, b = fit_inverse(pts[:1])
    assert b == 0.0 and a == pytest.approx(0.94 + 0.24)


def test_balanced_allocation_covers_the_slow_function():
    assert balanced(5, {"a": 1.0, "b": 1.0}, {"a": 100.0, "b": 25.0}, ("a", "b")) == {"a": 1, "b": 4}
    assert balanced(3, {"a": 1.0, "b": 2.0}, {"a": 100.0, "b": 100.0}, ("a", "b")) == {"a": 1, "b": 2}


def test_bounded_path_stops_adding_where_the_shared_bound_binds():
    curves = {"a": lambda k: 10.0 * k, "b": lambda k: 10.0 * k}
    gains = {"a": 1.0, "b": 1.0}
    shared = lambda k: 30.0 - (sum(k.values()) - 2)  # more instances: more contention  # noqa: E731
    path = bounded_path(curves, gains, 12, shared)
    rates = [p.rate for p in path]
    best = best_within(path, 12)
    assert best.rate == pytest.approx(max(rates)) and best.used < 12
    assert best.limited_by == "workers"


def test_probe_finds_the_lock_and_profiles_spread_on_a_thread_app():
    tb = SimTestbed(APPS["interpreter"])
    prof = profile_app(tb, 4)
    assert prof.workers is not None
    assert any(p.bound for p in prof.probe) and not all(p.bound for p in prof.probe)
    # the per-function curves are the functions' own (one instance per worker): score scales linearly
    score = prof.functions["score"]
    assert score.capacity(4) == pytest.approx(4 * score.capacity(1), rel=0.03)
    # the fitted ceiling is close to the simulator's: what one worker sustains at t threads, in CPU under the
    # lock (below 1 / (1 + 0.06 (t - 1)), the hand-off alone: a busy thread also waits for the others' holds)
    for p in prof.probe:
        if p.bound:
            truth = tb.true_mst(TestConfig(p.parallelism, 1)) * p.demand
            assert prof.workers.ceiling(p.threads) == pytest.approx(truth, rel=0.05)
            assert truth < 1 / (1 + 0.06 * (p.threads - 1))


def test_probe_finds_no_ceiling_on_a_process_app():
    prof = profile_app(SimTestbed(APPS["linear"]), 2)
    assert prof.workers is None and prof.probe and not any(p.bound for p in prof.probe)


def test_worker_model_predicts_thread_deployments():
    tb = SimTestbed(APPS["interpreter"])
    prof = profile_app(tb, 4)
    gains = prof.gains()
    for par in ({"decode": 6, "score": 20, "publish": 6}, {"decode": 10, "score": 40, "publish": 14}):
        model = min(prof.workers.rate(par, gains)[0], min(prof.functions[f].capacity(k) / gains[f] for f, k in par.items()))
        assert model == pytest.approx(tb.true_mst(TestConfig(par)), rel=0.03)


def test_rate_cost_family_only_where_plain_families_miss():
    k = np.array([1, 2, 4, 8], dtype=float)
    a, b = 0.002, 2e-6
    y = (-a + np.sqrt(a * a + 4 * b * k)) / (2 * b)  # a per-message cost that grows with rate
    best, _ = select(k, y, ("linear", "log", "sqrt", "rate-cost"))
    assert best.family == "rate-cost" and best.predict(64) == pytest.approx(
        (-a + math.sqrt(a * a + 4 * b * 64)) / (2 * b), rel=1e-6
    )
    best, _ = select(k, 100 * k * (1 + np.array([0.0, 0.004, -0.003, 0.002])), ("linear", "rate-cost"))
    assert best.family == "linear"


def test_exhaustive_min_counts_the_fewest_instances():
    fns = (
        SimFn("f", source_share=1.0, cpu_s=0.0, wait_s=0.01, overhead_s=0.0),
        SimFn("g", ("f",), cpu_s=0.0, wait_s=0.02, overhead_s=0.0),
    )
    tb = SimTestbed(SimPlanApp("two", fns, SimCluster(cores_per_worker=64, slots_per_worker=64)))
    assert exhaustive_min(tb, 290.0) == 3 + 6
    capped = SimTestbed(APPS["zipf"])
    assert exhaustive_min(capped, 1e6, limit=256) is None


def test_moves_between_functions_never_take_one_below_its_floor():
    """A move that leaves a function at one instance is the last one from it: the next would leave it none."""

    def rate(k):  # fewer instances of a and more of the others: always better, as long as a has one
        return 1.0 / k["a"] + k["b"] + k["c"], "x"

    k, r, _ = _improve({"a": 2, "b": 1, "c": 1}, 2.5, "x", rate, {})
    assert k == {"a": 1, "b": 2, "c": 1} and r == 4.0
