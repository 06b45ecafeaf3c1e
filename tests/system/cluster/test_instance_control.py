"""Pulsar's per-instance start/stop/restart on a cluster: any worker accepts the call, the worker
that runs the instance acts, and a stopped instance stays stopped wherever it is placed."""

from __future__ import annotations

import subprocess

import pytest
import requests

from tests.support.cluster_harness import WorkerCluster
from tests.support.cluster_scenarios import Flow, per_worker
from tests.support.commands import CLI
from tests.support.scenario import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(broker, tmp_path):
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as c:
        yield c


def _instances(flow: Flow, via: int = 0) -> dict[int, dict]:
    return {s["instanceId"]: s["status"] for s in flow.status(via)["instances"]}


def _cli(url: str, *args: str) -> None:
    subprocess.run(
        [*CLI, "functions", *args, "--admin-url", url],
        check=True,
        timeout=60,
        capture_output=True,
    )


def test_start_stop_restart_of_one_instance_through_any_worker(broker, cluster):
    flow = Flow(broker.service_url, [w.url for w in cluster.live()], parallelism=3)
    name = ["--tenant", "public", "--namespace", "default", "--name", flow.name]
    try:
        flow.create()
        assert sorted(per_worker(flow.wait_running(3)).values()) == [1, 1, 1]
        before = _instances(flow)
        owner = before[1]["workerId"]
        other = next(w for w in cluster.live() if w.worker_id != owner)

        # stop instance 1 through a worker that does not run it
        _cli(other.url, "stop", *name, "--instance-id", "1")
        st = wait_until(lambda: (s := _instances(flow, 2))[1]["running"] is False and s, 20, "instance 1 stopped")
        assert st[1]["error"] == "stopped" and st[1]["workerId"] == owner
        assert all(st[i]["running"] and st[i]["instanceStartTimeMs"] == before[i]["instanceStartTimeMs"] for i in (0, 2))

        # it stays stopped across a parallelism change; the new instance runs
        flow.scale(4, via=1)
        # (the status may list three instances for a moment after the change returns)
        st = wait_until(lambda: len(s := _instances(flow)) == 4 and s[3]["running"] and s, 30, "instance 3 running")
        assert st[1]["running"] is False and st[1]["error"] == "stopped"

        # start it again through a third worker: it runs where it was placed
        _cli(cluster.live()[2].url, "start", *name, "--instance-id", "1")
        st = wait_until(lambda: (s := _instances(flow))[1]["running"] and s, 20, "instance 1 running again")
        assert st[1]["workerId"] == owner

        # restart instance 0 through a worker that does not run it: only it restarts
        st = _instances(flow)
        target = next(w for w in cluster.live() if w.worker_id != st[0]["workerId"])
        _cli(target.url, "restart", *name, "--instance-id", "0")
        after = wait_until(
            lambda: (s := _instances(flow))[0]["numRestarts"] == 1 and s[0]["running"] and s, 20, "instance 0 restarted"
        )
        assert after[0]["instanceStartTimeMs"] > st[0]["instanceStartTimeMs"]
        assert all(
            after[i]["numRestarts"] == 0 and after[i]["instanceStartTimeMs"] == st[i]["instanceStartTimeMs"] for i in (1, 2, 3)
        )

        # the whole function: stop, then start, through different workers
        _cli(cluster.live()[1].url, "stop", *name)
        wait_until(lambda: flow.status(2)["numRunning"] == 0, 20, "every instance stopped")
        _cli(cluster.live()[2].url, "start", *name)
        flow.wait_running(4, timeout_s=30)

        bad = requests.post(f"{other.url}/admin/v3/functions/public/default/{flow.name}/7/stop", timeout=10)
        assert bad.status_code == 404 and "instance 7" in bad.json()["reason"]
    finally:
        flow.close()
