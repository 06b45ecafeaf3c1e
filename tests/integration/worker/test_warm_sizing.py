"""The controller sizes warm pools (controller/warm_sizing.py) and the worker keeps what it is told
(PUT/GET .../warm-pool): the sizing rule, the pool's resize without overshoot, the REST contract, and a
controller that scales a process-runtime function out and then asks its worker for a standby."""

from __future__ import annotations

import contextlib
import threading
import uuid

import pytest

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.controller.warm_sizing import WarmPoolConfig, WarmPoolSizer, pool_size
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.functions.runtimes.warm_pool import WarmPool
from tests.support.controller import TOGGLE, config
from tests.support.scenario import wait_until

CFG = WarmPoolConfig(enabled=True, min=0, max=4, window_s=100)


def test_the_pool_is_sized_for_the_largest_recent_step_or_the_way_back_to_the_peak():
    assert pool_size([(0, 2)], 10, CFG) == 0  # never scaled out: min
    assert pool_size([(0, 1), (10, 3), (20, 4)], 30, CFG) == 2  # largest step 1 -> 3
    assert pool_size([(0, 1), (10, 4), (20, 2)], 30, CFG) == 3  # step 3, back to the peak 2
    assert pool_size([(0, 1), (10, 10)], 30, CFG) == 4  # bounded by max
    assert pool_size([(0, 1), (10, 3)], 500, CFG) == 0  # the step left the window
    assert pool_size([(0, 2)], 10, WarmPoolConfig(min=1, max=4)) == 1


def test_the_sizer_sends_changes_only_and_asks_again_after_a_failure():
    sizer = WarmPoolSizer(CFG)
    sizer.observe("a", 1, 0)
    assert sizer.changes(0) == {"a": 0}
    sizer.sent("a", 0)
    sizer.observe("a", 1, 30)
    assert sizer.changes(30) == {}
    sizer.observe("a", 3, 60)
    assert sizer.changes(60) == {"a": 2}
    sizer.sent("a", None)  # the worker did not answer
    assert sizer.changes(90) == {"a": 2}
    sizer.sent("a", 2)
    sizer.observe("a", 3, 200)  # the step (at 60) leaves the 100 s window
    assert sizer.changes(200) == {"a": 0}
    sizer.forget(set())
    assert sizer.changes(200) == {}


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="min <= max"):
        WarmPoolConfig(min=3, max=2)
    with pytest.raises(ConfigError, match="mode: worker"):
        ControllerConfig(
            service_url="pulsar://127.0.0.1:1", admin_url="http://127.0.0.1:1", mode="stock", warm_pool={"enabled": True}
        )


class _FakeStandby:
    """What WarmPool needs of a standby, without an interpreter."""

    class _Proc:
        @staticmethod
        def is_alive() -> bool:
            return True

    def __init__(self, made: list):
        self.proc, self.closed = self._Proc(), False
        made.append(self)

    def ready(self, timeout_s: float = 0.0) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def test_the_pool_refills_once_and_resizes_without_overshoot(monkeypatch):
    monkeypatch.setattr("pulsar_autoscale.functions.runtimes.warm_pool.REFILL_DELAY_S", 0.05)
    made: list[_FakeStandby] = []
    pool = WarmPool(3, lambda: _FakeStandby(made))
    taken = [pool.take() for _ in range(3)]  # a scale-out by 3: one refill, after the delay
    assert all(taken) and pool.standby == 0, "the refill must wait, so it does not compete with the scale-out"
    wait_until(lambda: pool.standby == 3, 5, "the pool to refill")
    assert len(made) == 6
    pool.resize(1)
    assert pool.standby == 1 and sum(s.closed for s in made) == 2
    pool.resize(4)
    wait_until(lambda: pool.standby == 4, 5, "the pool to grow")
    threading.Event().wait(0.2)
    assert pool.standby == 4 and len(made) == 9
    pool.close()
    assert all(s.closed for s in made if s not in taken)


@contextlib.contextmanager
def process_worker_with_a_function(broker, tmp_path):
    """A process-runtime worker (no --warm-pool) hosting a noop function: (server, admin, name)."""
    with WorkerServer(
        broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url, runtime="process"
    ) as server:
        admin, name = FunctionsAdmin(server.url), f"wp-{uuid.uuid4().hex[:6]}"
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "inputs": [f"{name}-in"],
                "className": "pulsar_autoscale.functions.examples.noop.noop",
            }
        )
        yield server, admin, name


def test_the_worker_keeps_the_size_it_is_told(broker, tmp_path):
    with process_worker_with_a_function(broker, tmp_path) as (server, admin, name):
        assert admin.warm_pool("public", "default", name) == {"size": 0, "held": 0, "ready": 0, "runtime": "process"}
        assert admin.set_warm_pool("public", "default", name, 2)["size"] == 2
        wait_until(lambda: admin.warm_pool("public", "default", name)["ready"] == 2, 60, "two warm standbys")
        procs = [s.proc for s in server.worker._functions[f"public/default/{name}"].warm_pool._standbys]
        admin.set_warm_pool("public", "default", name, 0)
        assert admin.warm_pool("public", "default", name)["held"] == 0
        wait_until(lambda: not any(p.is_alive() for p in procs), 10, "the standbys to exit")
        for bad in (-1, 10**6, "2", True):
            with pytest.raises(AdminError, match="standbys must be an integer") as info:
                admin.set_warm_pool("public", "default", name, bad)
            assert info.value.status == 400
        with pytest.raises(AdminError) as info:
            admin.set_warm_pool("public", "default", "nope", 1)
        assert info.value.status == 404


def test_the_controller_sizes_the_pool_after_a_scale_out(broker, tmp_path):
    policy = tmp_path / "toggle.py"
    policy.write_text(TOGGLE)  # 1 -> 2 -> 1 ...: a scale-out step of 1 every other period
    with process_worker_with_a_function(broker, tmp_path) as (server, admin, name):
        controller = Controller(
            config(broker, server, tmp_path, policy=str(policy), period_s=1.0, warm_pool={"enabled": True, "max": 3})
        ).start()
        try:
            view = wait_until(
                lambda: (lambda v: v if v["size"] == 1 else None)(admin.warm_pool("public", "default", name)),
                30,
                "the controller to ask for one standby",
            )
            assert view["runtime"] == "process"
        finally:
            controller.stop()
