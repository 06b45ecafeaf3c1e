"""A function scaled to zero (the controller's scale to zero, docs/controller.md) is still a function: it survives
a restart of its worker, and on a cluster every worker accepts the update. Before, a worker restarted while a
function slept refused the saved config ("parallelism must be a positive number") and dropped the function,
and on a cluster every worker refused the update's metadata record, so the update answered 400 after 15 s."""

from __future__ import annotations

import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from tests.support.cluster_harness import WorkerCluster
from tests.support.keyed import WorkerProcess
from tests.support.scenario import EXAMPLES, OutputCollector, wait_until

pytestmark = pytest.mark.slow


def _create(admin: FunctionsAdmin, name: str) -> None:
    admin.create(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "exclaim.Exclaim",
            "inputs": [f"persistent://public/default/{name}-in"],
            "output": f"persistent://public/default/{name}-out",
            "parallelism": 2,
        },
        str(EXAMPLES / "exclaim.py"),
    )


def _wakes_and_processes(admin: FunctionsAdmin, client, name: str) -> None:
    """Nothing published while it slept is lost: back at parallelism 1 it processes it."""
    collector = OutputCollector(client, f"persistent://public/default/{name}-out")
    try:
        admin.set_parallelism("public", "default", name, 1)
        wait_until(lambda: admin.status("public", "default", name)["numRunning"] == 1, 60, "1 instance running again")
        wait_until(lambda: collector.distinct() == 1, 30, lambda: f"the message sent while asleep: {collector.counts}")
        assert collector.counts == {b"asleep!": 1}
    finally:  # a failure must not leave its thread reading after the module's client closes
        collector.close()


def _sleep(admin: FunctionsAdmin, client, name: str) -> None:
    # The input subscription exists once an instance has run: drained before it subscribed, the function
    # would start from its subscriptionPosition (Latest) and rightly skip what was sent while it slept.
    wait_until(lambda: admin.status("public", "default", name)["numRunning"] == 2, 60, "2 instances running")
    admin.set_parallelism("public", "default", name, 0)
    status = admin.status("public", "default", name)
    assert (status["numInstances"], admin.get("public", "default", name)["parallelism"]) == (0, 0), status
    wait_until(lambda: admin.status("public", "default", name)["numRunning"] == 0, 30, "every instance drained")
    producer = client.create_producer(f"persistent://public/default/{name}-in")
    producer.send(b"asleep")
    producer.close()


def test_a_function_scaled_to_zero_survives_a_worker_restart(broker, client, tmp_path):
    name = f"z-{uuid.uuid4().hex[:6]}"
    with WorkerProcess(broker, tmp_path) as worker:
        admin = FunctionsAdmin(worker.url)
        _create(admin, name)
        _sleep(admin, client, name)
        worker.stop(kill=False)
        worker.start()
        assert name in admin.list("public", "default")
        assert admin.get("public", "default", name)["parallelism"] == 0
        _wakes_and_processes(admin, client, name)


def test_a_cluster_scales_a_function_to_zero_and_back(broker, client, tmp_path):
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path, n=2) as cluster:
        cluster.wait_ready()
        admin = FunctionsAdmin(cluster.workers[0].url)
        name = f"z-{uuid.uuid4().hex[:6]}"
        _create(admin, name)
        _sleep(admin, client, name)
        other = FunctionsAdmin(cluster.workers[1].url)
        assert other.get("public", "default", name)["parallelism"] == 0
        _wakes_and_processes(other, client, name)
