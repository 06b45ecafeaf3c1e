"""keda, hpa-cpu, flink-ds2 and predictive against hand-computed values; state in, state out."""

from __future__ import annotations

import math

import pytest

from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies import load_policy
from pulsar_autoscale.policies.predictive import holt, quantile_response_time
from pulsar_autoscale.policies.queueing import Station
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot

F, G = "public/default/f", "public/default/g"
CHAIN = AppGraph.build(
    [
        FunctionNode(F, ("persistent://public/default/in",), "persistent://public/default/mid"),
        FunctionNode(G, ("persistent://public/default/mid",), None),
    ]
)
ONE = AppGraph.build([FunctionNode(F, ("persistent://public/default/in",), None)])


def snap(t: float, **figures) -> Snapshot:
    return Snapshot(t, 30.0, {F: FunctionSnapshot(F, parallelism=figures.pop("k", 1), **figures)})


def run(policy, snapshots, k=1):
    """Feed snapshots through decide(), threading the state; returns the targets of each period."""
    state, out = None, []
    for s in snapshots:
        p = policy.decide(ONE, s, {F: k}, state)
        state, k = p.state, p.targets[F]
        out.append(k)
    return out


def test_keda_backlog_over_threshold_then_stabilized_scale_down():
    keda = load_policy("keda")
    # backlog 95 / 10 -> 10; then 0 -> 1, but only after 300 s of lower recommendations
    snaps = [snap(0, backlog=95.0)] + [snap(30 * i, backlog=0.0) for i in range(1, 12)]
    assert run(keda, snaps) == [10] * 10 + [1, 1]


def test_keda_between_polls_keeps_the_last_recommendation():
    keda = load_policy("keda", {"polling_s": 60.0})
    assert run(keda, [snap(0, backlog=40.0), snap(30, backlog=400.0), snap(60, backlog=400.0)]) == [
        4,
        4,
        40,
    ]  # ceil(4 * 400 / (10 * 4)); the Plan step bounds it


def test_hpa_cpu_formula_tolerance_and_stabilization():
    hpa = load_policy("hpa-cpu")
    # 4 instances 100% busy: ceil(4 * 1.0 / 0.8) = 5; 0.84 / 0.8 within 10%: keep
    assert hpa.decide(ONE, snap(0, utilization=1.0), {F: 4}, None).targets[F] == 5
    assert hpa.decide(ONE, snap(0, utilization=0.84), {F: 4}, None).targets[F] == 4
    snaps = [snap(0, utilization=1.0)] + [snap(30 * i, utilization=0.1) for i in range(1, 11)]
    assert run(hpa, snaps, k=4)[-2:] == [5, 1]


def test_flink_ds2_bounds_catch_up_and_scale_down_interval():
    fl = load_policy("flink-ds2")
    # rate 10/s + backlog 300 / 300 s = 11/s; true rate 4/s: utilization 11 / 8 > 1 -> ceil(11 / 2.8) = 4
    s = snap(0, k=2, arrival_rate=10.0, backlog=300.0, true_processing_rate=4.0)
    assert fl.decide(ONE, s, {F: 2}, None).targets[F] == 4
    # utilization 0.5 within [0.4, 1.0]: keep
    s = snap(0, k=5, arrival_rate=10.0, backlog=0.0, true_processing_rate=4.0)
    assert fl.decide(ONE, s, {F: 5}, None).targets[F] == 5
    low = [snap(30 * i, arrival_rate=1.0, backlog=0.0, true_processing_rate=4.0) for i in range(12)]
    assert run(fl, low, k=5) == [5] * 10 + [1, 1]  # ceil(1 / 2.8) = 1, after 300 s of lower asks


def test_holt_follows_a_trend():
    s = None
    for rate in (10, 12, 14, 16, 18):
        s = holt(s, rate, 0.5, 0.3)
    assert 18 < s.level + s.trend < 22


def test_quantile_response_time_is_above_the_mean_and_infinite_when_unstable():
    st = Station(lam=14.0, mu=4.0, ca2=1.0, cs2=0.25)
    assert quantile_response_time(st, 4, 0.99) > st.t(4)
    assert quantile_response_time(st, 3, 0.99) == float("inf")
    # M/M/1 at rho 0.5: P(W > t) = P_k e^{-t / 2}, P_k = 0.5^sqrt(2) (paper eq. 2); plus the mean service 1
    expected = 1 + 2 * math.log(0.5 ** math.sqrt(2) / 0.01)
    assert quantile_response_time(Station(0.5, 1.0, 1.0, 1.0), 1, 0.99) == pytest.approx(expected)


def test_predictive_sizes_for_p99_drains_backlog_and_holds_before_scale_in():
    pred = load_policy("predictive", {"p99_s": 2.0})
    base = dict(arrival_rate=14.0, service_rate=4.0, ca2=1.0, cs2=0.25, true_processing_rate=4.0, true_output_rate=4.0)
    # k 3 is unstable; k 4: rho 0.875, P_k 0.73, p99 ln(73) 1.25 / 4 + 0.25 = 1.59 s <= 2 s, mean 0.48 s
    quiet = pred.decide(ONE, snap(0, backlog=4.0, **base), {F: 1}, None)
    assert quiet.targets[F] == 4
    # 300 - 14 * 0.48 waiting messages gone within 10 s: (14 + 29.3) / 4 -> 11
    busy = pred.decide(ONE, snap(0, backlog=300.0, **base), {F: 1}, None)
    assert busy.targets[F] == 11
    # the rate drops to 6/s: Holt still forecasts 8.8/s (k 3), then 6/s (k 2); 4 is held for one
    # period, then it goes to the highest of the two lower asks
    low = dict(base, arrival_rate=6.0)
    p1 = pred.decide(ONE, snap(30, backlog=1.0, **low), {F: 4}, quiet.state)
    p2 = pred.decide(ONE, snap(60, backlog=1.0, **low), {F: 4}, p1.state)
    assert (p1.targets[F], p2.targets[F]) == (4, 3)


def test_predictive_drain_upstream_reaches_downstream():
    pred = load_policy("predictive", {"p99_s": 2.0})
    fig = dict(arrival_rate=10.0, service_rate=50.0, true_processing_rate=50.0, true_output_rate=50.0)
    s = Snapshot(
        0,
        30.0,
        {
            F: FunctionSnapshot(F, 1, backlog=600.0, **fig),
            G: FunctionSnapshot(G, 1, backlog=0.0, **dict(fig, service_rate=4.0, true_processing_rate=4.0)),
        },
    )
    # f drains 600 messages in 10 s: g gets 10 + 60 msg/s, more than 15 instances serve: the cap.
    # Without f's backlog g needs 4 (k 3: rho 0.83, p99 2.1 s with c^2 = 1, over 0.926 of 2 s).
    assert pred.decide(CHAIN, s, {F: 1, G: 1}, None).targets[G] == 15
    quiet = Snapshot(0, 30.0, {**s.functions, F: FunctionSnapshot(F, 1, backlog=0.0, **fig)})
    assert pred.decide(CHAIN, quiet, {F: 1, G: 1}, None).targets[G] == 4
