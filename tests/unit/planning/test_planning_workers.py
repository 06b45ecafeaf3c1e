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
from pulsar_autoscale.planning.workers import ProbePoint, WorkerCeiling, balanced, fit_handoff


def _lock(handoff=0.0, slots=4, cpu=None, service=None):
    cpu = cpu or {"f": 0.01, "g": 0.01}
    return WorkerCeiling(slots, tuple(cpu), cpu, service or {f: 0.0 for f in cpu}, handoff)


def _rate_by_bisection(w: WorkerCeiling, par: dict, gains: dict) -> float:
    """The model's definition, solved the slow way: the largest r at which every worker's lock is held less
    than all the time and every thread is busy less than all the time (its service and an M/G/1 wait)."""
    fns = [f for f in w.order for _ in range(par[f])]
    n_w = w.workers(len(fns))
    on = [i % n_w for i in range(len(fns))]
    threads = [on.count(j) for j in range(n_w)]

    def keeps_up(r: float) -> bool:
        x = [r * gains[f] / par[f] for f in fns]
        hold = [w.cpu_per_msg[f] * (1 + w.handoff * (threads[on[i]] - 1)) for i, f in enumerate(fns)]
        for j in range(n_w):
            mine = [i for i in range(len(fns)) if on[i] == j]
            if sum(x[i] * hold[i] for i in mine) >= 1:
                return False
            for i in mine:
                others = [m for m in mine if m != i]
                wait = sum(x[m] * hold[m] * hold[m] / 2 for m in others) / (1 - sum(x[m] * hold[m] for m in others))
                if x[i] * (w.service_s[fns[i]] + wait) >= 1:
                    return False
        return True

    lo, hi = 0.0, 1e6
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if keeps_up(mid) else (lo, mid)
    return lo


def test_model_places_round_robin_and_binds_on_the_busiest_worker():
    w = _lock(slots=4)
    gains = {"f": 1.0, "g": 1.0}
    # no service time, no hand-off: the lock alone. 4 instances, 1 worker: 0.02 s per source message -> 50/s
    assert w.rate({"f": 2, "g": 2}, gains)[0] == pytest.approx(50.0)
    # 5 instances -> 2 workers: worker 0 holds f0, f2, g4; worker 1 f1, g3
    r, j = w.rate({"f": 3, "g": 2}, gains)
    assert r == pytest.approx(1.0 / (2 / 3 * 0.01 + 0.5 * 0.01)) and j == 0


def test_a_lone_thread_sustains_its_service_rate_and_neighbours_add_their_holds():
    w = _lock(service={"f": 0.004, "g": 0.004}, cpu={"f": 0.002, "g": 0.002})
    assert w.rate({"f": 1, "g": 1}, {"f": 1.0, "g": 1.0}, workers=2)[0] == pytest.approx(250.0)
    together = w.rate({"f": 1, "g": 1}, {"f": 1.0, "g": 1.0}, workers=1)[0]
    assert together < 250.0  # each waits for the other's holds


@pytest.mark.parametrize(
    "par, handoff",
    [({"f": 2, "g": 2}, 0.0), ({"f": 3, "g": 2}, 0.05), ({"f": 1, "g": 6}, 0.1), ({"f": 5, "g": 4}, 0.06)],
)
def test_closed_form_rate_is_the_model_solved_by_bisection(par, handoff):
    w = _lock(handoff, cpu={"f": 0.0015, "g": 0.002}, service={"f": 0.003, "g": 0.017})
    gains = {"f": 1.0, "g": 1.0}
    assert w.rate(par, gains)[0] == pytest.approx(_rate_by_bisection(w, par, gains), rel=1e-6)


def test_more_threads_on_a_worker_cost_the_hand_off():
    gains = {"f": 1.0, "g": 1.0}
    par = {"f": 2, "g": 2}
    assert _lock(0.1).rate(par, gains)[0] < _lock(0.0).rate(par, gains)[0]


def test_handoff_fit_recovers_the_cost_that_made_the_probe():
    truth = _lock(0.06, slots=8, cpu={"f": 0.0015, "g": 0.002}, service={"f": 0.003, "g": 0.017})
    gains = {"f": 1.0, "g": 1.0}
    pts = [
        ProbePoint(t, par, truth.rate(par, gains, workers=1)[0], 1e9, 1, 1.0)
        for t, par in ((2, {"f": 1, "g": 1}), (4, {"f": 1, "g": 3}), (6, {"f": 2, "g": 4}), (8, {"f": 2, "g": 6}))
    ]
    handoff, error = fit_handoff(pts, _lock(0.0, slots=8, cpu=truth.cpu_per_msg, service=truth.service_s), gains)
    assert handoff == pytest.approx(0.06, abs=0.0025) and error < 0.01


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
    # the fitted lock reproduces what one worker sustains at t threads, and its hand-off is the simulator's
    # (0.06 per other thread) within what an open queue's wait makes of a closed system's
    assert 0.03 < prof.workers.handoff < 0.1 and prof.workers.fit_error < 0.03
    for p in prof.probe:
        truth = tb.true_mst(TestConfig(p.parallelism, 1))
        assert prof.workers.rate(p.parallelism, prof.gains(), workers=1)[0] == pytest.approx(truth, rel=0.05)


def test_probe_finds_no_ceiling_on_a_process_app():
    prof = profile_app(SimTestbed(APPS["linear"]), 2)
    assert prof.workers is None and prof.probe and not any(p.bound for p in prof.probe)


def test_worker_model_predicts_thread_deployments():
    tb = SimTestbed(APPS["interpreter"])
    prof = profile_app(tb, 4)
    gains = prof.gains()
    for par in (
        {"decode": 6, "score": 20, "publish": 6},
        {"decode": 10, "score": 40, "publish": 14},
        {"decode": 7, "score": 35, "publish": 7},
        {"decode": 11, "score": 28, "publish": 10},
    ):
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
