"""Warm standbys for the process runtime: a scale-out runs in a standby that was already warm, the
pool refills, nothing is lost, and the worker cleans the standbys up."""

from __future__ import annotations

import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.api.server import WorkerServer
from tests.support.keyed import state_counts
from tests.support.scenario import KEYED_COUNT, keyed_count, run_scaling, wait_until


def test_scale_out_takes_a_warm_standby_and_the_pool_refills(broker, tmp_path):
    with WorkerServer(
        broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url, runtime="process", warm_pool=1
    ) as server:
        admin = FunctionsAdmin(server.url)
        name = f"warm-{uuid.uuid4().hex[:6]}"
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "inputs": [f"{name}-in"],
                "className": "pulsar_autoscale.functions.examples.noop.noop",
            }
        )
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


def test_a_keyed_function_scales_out_into_a_warm_standby_with_exact_counts(broker, client, tmp_path):
    """A keyedState process instance's input and state share one pipe (functions/runtimes/remote_state.py), so a standby,
    which has its pipe before it knows its instance id, can be one."""
    with WorkerServer(
        broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url, runtime="process", warm_pool=1
    ) as server:
        admin = FunctionsAdmin(server.url)
        name = f"warm-keyed-{uuid.uuid4().hex[:6]}"
        src = f"persistent://public/default/{name}-in"
        producer = client.create_producer(src)
        admin.create(keyed_count(name, src), str(KEYED_COUNT))
        fn = server.worker._functions[f"public/default/{name}"]
        pool = fn.warm_pool
        assert pool is not None, "a keyedState process function got no warm pool"
        wait_until(lambda: pool._standbys and pool._standbys[0].ready(), 60, "the standby to warm up")
        standby = pool._standbys[0]
        for i in range(100):
            producer.send(b"x", partition_key=f"k{i % 10}")
        admin.set_parallelism("public", "default", name, 2)
        assert fn.instances[1]._proc is standby.proc, "instance 1 did not run in the warm standby"
        for i in range(100):
            producer.send(b"x", partition_key=f"k{i % 10}")
        wait_until(
            lambda: (
                admin.status("public", "default", name)["autoscale"]["keyedState"].get("groupsPerInstance") == {"0": 64, "1": 64}
            ),
            60,
            "half the key groups to move to instance 1",
        )
        for i in range(100):  # k3, k5, k7, k9 are in groups 64-127, instance 1's now
            producer.send(b"x", partition_key=f"k{i % 10}")
        wait_until(
            lambda: state_counts(admin, name, 10) == {f"k{k}": 30 for k in range(10)},
            60,
            lambda: f"30 per key, saw {state_counts(admin, name, 10)}",
        )
        status = admin.status("public", "default", name)
        assert [i["status"]["running"] for i in status["instances"]] == [True, True], status
        # a process instance reports its figures every 0.25 s: the counts above can come first
        wait_until(
            lambda: admin.status("public", "default", name)["instances"][1]["status"]["numReceived"] > 0,
            10,
            "instance 1 to report a record processed",
        )


@pytest.mark.slow
def test_scaling_with_a_warm_pool_loses_nothing(broker, tmp_path):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url, warm_pool=4) as server:
        result = run_scaling(broker.service_url, server.url, "process")
    assert result.lost == 0 and result.instance0_restarts == 0
    assert set(result.scale_out_latency_ms) == {4, 8}


def test_negative_pool_size_is_refused(broker, tmp_path):
    with pytest.raises(ConfigError, match="warm pool"):
        WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), warm_pool=-1)
