"""The fast path live: a burst on a real broker and worker is answered by a `kind: fast` decision
seconds after it starts, long before the regular period."""

from __future__ import annotations

import threading
import time

import pytest

from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.errors import ConfigError
from tests.support.controller import config, load, make_function
from tests.support.scenario import wait_until


def test_fast_check_scales_out_within_seconds(broker, worker, tmp_path):
    name = make_function(worker, service_ms=50)  # mu = 20/s per instance
    fqfn = f"public/default/{name}"
    # a 600 s period: only the first one (at start) runs during the test
    controller = Controller(
        config(broker, worker, tmp_path, period_s=600.0, fast={"enabled": True, "period_s": 0.5, "window_s": 1.0})
    )
    controller.start()
    wait_until(controller.iterate, 20, "leadership and the period that gives the fast path its graph")
    stop = threading.Event()
    started = time.monotonic()
    producer = threading.Thread(target=load, args=(broker, f"{name}-in", 60.0, stop), daemon=True)  # rho 3 at k=1
    producer.start()
    try:

        def fast_decisions():
            return [r for r in controller.log.read() if r["function"] == fqfn and r.get("kind") == "fast"]

        first = wait_until(fast_decisions, 30, f"a fast decision for {fqfn}")[0]
        assert first["new"] > first["old"] == 1 and first["applied"] and first["epoch"] == 1
        assert first["reason"].startswith("fast:")
        assert time.monotonic() - started < 20, "the fast path took longer than it should"
        assert not [r for r in controller.log.read() if r.get("kind") == "fast" and r["new"] < r["old"]]
    finally:
        stop.set()
        controller.stop()


def test_bad_fast_settings_fail_at_start(broker, worker, tmp_path):
    with pytest.raises(ConfigError, match="fast"):
        config(broker, worker, tmp_path, fast={"enabled": True, "period_s": 0})
    with pytest.raises(ConfigError, match="fast"):
        config(broker, worker, tmp_path, fast={"speed": 1})
