"""The clairvoyant bound: no allocation one instance cheaper in any interval meets the SLO, and the
bound meets it in the simulator; plus the fast path and warm pool in the simulator."""

from __future__ import annotations

import pytest

from pulsar_autoscale.controller.fast import FastConfig
from pulsar_autoscale.controller.planner import restart_aware
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.sim.apps import load_app
from pulsar_autoscale.sim.clairvoyant import evaluate, intervals, plan
from pulsar_autoscale.sim.cli import build_autoscaler
from pulsar_autoscale.sim.engine import SimConfig, simulate
from pulsar_autoscale.sim.workloads import load_workload

APP = load_app("paper-image")
SLO = 2.0


@pytest.mark.parametrize("workload", ["burst", "paper"])
def test_no_cheaper_allocation_meets_the_slo(workload):
    w = load_workload(workload)
    for iv, (start, end, alloc) in zip(intervals(w), plan(APP, w, SLO)):
        k = dict(alloc)
        length = iv.end - iv.start
        assert start == iv.start and end >= iv.end
        assert evaluate(APP, iv.rate, length, k) <= SLO
        for fn in k:
            if k[fn] > 1:
                cheaper = {**k, fn: k[fn] - 1}
                assert evaluate(APP, iv.rate, length, cheaper) > SLO, (
                    f"{workload} at {iv.rate}/s: {cheaper} meets the SLO, so the bound {k} is wrong"
                )


def run(policy, workload, seed=0, fast=None, **config):
    w = load_workload(workload)
    a = build_autoscaler(policy, {}, 15, None, fast, 30.0, (APP, w, SLO, config.get("start_s", 1.0)))
    return simulate(APP, w, a, SimConfig(seed=seed, **config))


def test_clairvoyant_meets_the_slo_in_the_simulator():
    r = run("clairvoyant", "burst", seed=0)
    assert r.p99_rt_s <= SLO and r.lost == 0 and r.scaling_actions == 5


def test_clairvoyant_needs_the_workload():
    with pytest.raises(ConfigError, match="simulator only"):
        build_autoscaler("clairvoyant", {}, 15)


def test_fast_path_cuts_the_burst_tail():
    slow = run("queueing", "burst")
    fast = run("queueing", "burst", fast=FastConfig(enabled=True, period_s=1.0, window_s=2.0))
    assert fast.fast_actions > 0 and slow.fast_actions == 0
    assert fast.p99_rt_s < 0.2 * slow.p99_rt_s
    assert fast.instance_seconds < 1.3 * slow.instance_seconds


def test_warm_pool_costs_its_weight_and_starts_faster():
    cold = run("queueing", "burst", fast=FastConfig(enabled=True, period_s=1.0, window_s=2.0), start_s=3.0)
    warm = run(
        "queueing",
        "burst",
        fast=FastConfig(enabled=True, period_s=1.0, window_s=2.0),
        start_s=3.0,
        warm_pool=4,
        standby_weight=0.25,
    )
    assert warm.standby_instance_seconds == pytest.approx(3 * 4 * 0.25 * warm.sim_time_s)
    assert warm.p99_rt_s < cold.p99_rt_s


def test_stock_mode_fast_path_reads_topic_stats_and_cuts_the_burst_tail():
    """Stock Pulsar in the simulator (every update restarts all instances for 3 s, restart-aware Plan): the
    fast check has no consumer counters there and reads the input's topic stats (controller.fast.topic_window),
    as the live controller does in stock mode."""
    w = load_workload("burst")

    def stock(fast):
        a = build_autoscaler("predictive", {}, 15, restart_aware({}, 30.0), fast, 30.0, (APP, w, SLO, 1.0))
        return simulate(APP, w, a, SimConfig(seed=0, restart_s=3.0))

    slow, fast = stock(None), stock(FastConfig(enabled=True, period_s=1.0, window_s=2.0))
    assert fast.fast_actions > 0 and slow.fast_actions == 0 and fast.lost == 0
    assert fast.p99_rt_s < 0.7 * slow.p99_rt_s
    assert fast.instance_seconds < 1.3 * slow.instance_seconds
