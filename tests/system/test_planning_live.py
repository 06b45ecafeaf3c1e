"""The capacity estimator on a live worker: a one-function app (sleepy.py, 20 ms deterministic, thread
runtime) whose capacity is known (parallelism / service time), so the bisection is checked against an
analytic answer. Short phases (about a minute per MST): the figures here are checks, not plans."""

from __future__ import annotations

import time

import pytest

from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.planning.livebed import LiveTestbed, analytic_capacity, sleepy_app
from pulsar_autoscale.planning.mst import MstSettings, measure_mst
from pulsar_autoscale.planning.testbed import Phases, TestConfig

pytestmark = pytest.mark.slow

SERVICE_MS = 20.0
SETTINGS = MstSettings(warmup_s=6.0, phases=Phases(cooldown_s=2.0, ramp_s=3.0, observe_s=8.0), step=0.03, bracket=0.1)


@pytest.fixture(scope="module")
def testbed(broker, tmp_path_factory):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path_factory.mktemp("plan-worker")),
                      metrics_url=broker.metrics_url) as w:
        tb = LiveTestbed(sleepy_app(SERVICE_MS), w.url, broker.service_url, broker.metrics_url, max_rate=400.0)
        try:
            yield tb
        finally:
            tb.close()


def test_bisection_finds_the_analytic_capacity(testbed):
    started = time.monotonic()
    msts = {}
    for k in (1, 2):
        res = measure_mst(testbed, TestConfig({"sleepy": k}), SETTINGS)
        expected = analytic_capacity(SERVICE_MS, k)
        trace = "; ".join(f"{s.rate:.1f}:{'pass' if s.passed else 'fail'} ({s.reason})" for s in res.steps)
        print(f"parallelism {k}: MST {res.mst:.1f}/s (analytic {expected:.0f}), {res.runs} steps, "
              f"{res.testbed_s:.0f} s: {trace}")
        assert not res.producer_bound, trace
        assert abs(res.mst - expected) <= 0.15 * expected, trace
        assert all(s.valid for s in res.steps), trace
        msts[k] = res.mst
    assert msts[2] > msts[1] * 1.5
    assert time.monotonic() - started < 170
