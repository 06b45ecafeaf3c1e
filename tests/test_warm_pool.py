"""Warm standbys for the process runtime: a scale-out runs in a standby that was already warm, the
pool refills, nothing is lost, and the worker cleans the standbys up."""

from __future__ import annotations

import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.server import WorkerServer
from scenario import run_scaling, wait_until


def test_scale_out_takes_a_warm_standby_and_the_pool_refills(broker, tmp_path):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url,
                      runtime="process", warm_pool=1) as server:
        admin = FunctionsAdmin(server.url)
        name = f"warm-{uuid.uuid4().hex[:6]}"
        admin.create({"tenant": "public", "namespace": "default", "name": name, "inputs": [f"{name}-in"],
                      "className": "pulsar_autoscale.functions.examples.noop.noop"})
        fn = server.worker._functions[f"public/default/{name}"]
        pool = fn.warm_pool
        wait_until(lambda: pool._standbys and pool._standbys[0].ready(), 60, "the standby to warm up")
        standby = pool._standbys[0]
        admin.set_parallelism("public", "default", name, 2)
        assert fn.instances[1]._proc is standby.proc, "instance 1 did not run in the warm standby"
        wait_until(lambda: fn.instances[1].figures().running, 30, "instance 1 to run")
        wait_until(lambda: pool.standby == 1 and pool._standbys[0].ready(), 60, "the pool to refill")
        procs = [s.proc for s in pool._standbys]
        admin.delete("public", "default", name)
        wait_until(lambda: not any(p.is_alive() for p in procs), 10, "the standbys to exit after delete")


@pytest.mark.slow
def test_scaling_with_a_warm_pool_loses_nothing(broker, tmp_path):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url,
                      warm_pool=4) as server:
        result = run_scaling(broker.service_url, server.url, "process")
    assert result.lost == 0 and result.instance0_restarts == 0
    assert set(result.scale_out_latency_ms) == {4, 8}


def test_negative_pool_size_is_refused(broker, tmp_path):
    with pytest.raises(ConfigError, match="warm pool"):
        WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), warm_pool=-1)
