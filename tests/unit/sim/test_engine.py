"""The simulator against closed forms, its bookkeeping, the stock-Pulsar restart mode and the CLI."""

from __future__ import annotations

import math

import pytest

from pulsar_autoscale.configparse import parse_params
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.sim.apps import ServiceTime, SimApp, SimFunction, load_app, topic
from pulsar_autoscale.sim.cli import build_autoscaler
from pulsar_autoscale.sim.engine import SimConfig, simulate
from pulsar_autoscale.sim.workloads import StepWorkload, load_workload


def station_app(service: ServiceTime) -> SimApp:
    return SimApp("one", (topic("in"),), (SimFunction("public/default/f", (topic("in"),), None, service),))


def fixed(k: int):
    """The threshold policy with thresholds no backlog reaches keeps k instances."""
    return build_autoscaler("threshold", {"t_in": -1.0, "t_out": 1e12}, 15), SimConfig(initial_parallelism=k)


def erlang_c(k: int, a: float) -> float:
    """Probability of waiting in M/M/k with offered load a = lambda / mu."""
    top = a**k / math.factorial(k) * k / (k - a)
    return top / (sum(a**i / math.factorial(i) for i in range(k)) + top)


@pytest.mark.parametrize("k, lam, mu", [(1, 0.8, 1.0), (4, 3.2, 1.0)])
def test_mmk_mean_response_time_matches_closed_form(k, lam, mu):
    autoscaler, config = fixed(k)
    result = simulate(station_app(ServiceTime("exponential", mean=1 / mu)), StepWorkload(((100_000.0, lam),)), autoscaler, config)
    expected = 1 / mu + erlang_c(k, lam / mu) / (k * mu - lam)
    assert result.lost == 0 and result.drained
    assert result.avg_instances == pytest.approx(k, rel=1e-3)
    assert result.mean_rt_s == pytest.approx(expected, rel=0.05)


def test_messages_are_conserved_through_fan_out_fan_in_and_scaling():
    result = simulate(load_app("dag6"), load_workload("burst"), build_autoscaler("predictive", {}, 15), SimConfig(seed=3))
    assert result.drained
    assert result.lost == 0
    assert result.completed == result.produced > 0
    assert result.scaling_actions > 0


def test_same_seed_same_run_other_seed_other_run():
    run = lambda seed: simulate(
        load_app("paper-image"),
        load_workload("burst"),  # noqa: E731
        build_autoscaler("ds2", {}, 15),
        SimConfig(seed=seed),
    ).summary()
    assert run(1) == run(1)
    assert run(1) != run(2)


def test_stock_restart_mode_redelivers_and_costs_response_time():
    app, workload = load_app("paper-image"), load_workload("burst")
    free = simulate(app, workload, build_autoscaler("threshold", {}, 15), SimConfig(seed=1))
    stock = simulate(app, workload, build_autoscaler("threshold", {}, 15), SimConfig(seed=1, restart_s=5.0))
    assert stock.lost == 0 and stock.drained
    assert stock.redelivered > 0 and free.redelivered == 0
    assert stock.mean_rt_s > free.mean_rt_s


def test_gauges_refreshed_every_5_s_delay_a_rate_driven_policy():
    """pulsar-lite's gauges: the controller sees a step up late, so queueing answers it late."""
    app, workload = load_app("demo-image"), load_workload("demo")
    run = lambda refresh: simulate(
        app,
        workload,
        build_autoscaler("queueing", {}, 8),  # noqa: E731
        SimConfig(period_s=5.0, start_s=0.01, gauge_refresh_s=refresh, seed=1),
    )
    exact, gauges = run(0.0), run(5.0)
    assert gauges.lost == exact.lost == 0
    assert gauges.mean_rt_s > 1.3 * exact.mean_rt_s, (gauges.mean_rt_s, exact.mean_rt_s)
    assert gauges.avg_instances == pytest.approx(exact.avg_instances, rel=0.1)


def test_efficiency_is_one_when_exactly_the_lower_bound_runs():
    autoscaler, config = fixed(1)
    app = station_app(ServiceTime("deterministic", mean=0.5))
    result = simulate(app, StepWorkload(((6000.0, 1.0),)), autoscaler, config)
    assert result.efficiency == pytest.approx(1.0, rel=0.02)
    # M/D/1, Pollaczek-Khinchine: T = S + rho S / (2 (1 - rho)) = 0.5 + 0.25
    assert result.mean_rt_s == pytest.approx(0.75, rel=0.1)


def test_bad_inputs_name_the_problem():
    with pytest.raises(ConfigError, match="unknown app"):
        load_app("nope")
    with pytest.raises(ConfigError, match="unknown workload"):
        load_workload("nope")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_params(["oops"])
    with pytest.raises(ConfigError, match="unknown policy"):
        build_autoscaler("nope", {}, 15)
    with pytest.raises(ConfigError, match="kind"):
        ServiceTime("gamma", mean=1.0)


def test_trace_workload_of_rates_and_of_timestamps(tmp_path):
    rates = tmp_path / "rates.csv"
    rates.write_text("time,rate\n0,2\n100,4\n200,0\n")
    w = load_workload(f"trace:{rates}")
    assert w.duration_s == 200 and list(w.rate_at([50, 150])) == [2, 4]
    stamps = tmp_path / "stamps.csv"
    stamps.write_text("10\n10.5\n12\n")
    assert list(load_workload(f"trace:{stamps}").arrival_times(None)) == [0, 0.5, 2]
    bad = tmp_path / "bad.csv"
    bad.write_text("time,rate\n0,x\n")
    with pytest.raises(ConfigError, match="bad.csv"):
        load_workload(f"trace:{bad}")
