"""Three worker processes form one cluster through Pulsar topics (docs/cluster.md)."""

from __future__ import annotations

import time

import pytest
import requests

from tests.support.cluster_harness import WorkerCluster
from tests.support.cluster_scenarios import Flow, per_worker
from tests.support.scenario import wait_until

MESSAGES = 5000


@pytest.fixture(scope="module")
def cluster(broker, tmp_path_factory):
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path_factory.mktemp("cluster")) as c:
        yield c


def test_members_leader_and_assignments_are_real(cluster):
    urls = [w.url for w in cluster.live()]
    ids = {w.worker_id for w in cluster.live()}
    for u in urls:
        assert {m["workerId"] for m in requests.get(u + "/admin/v2/worker/cluster", timeout=5).json()} == ids
    leaders = {requests.get(u + "/admin/v2/worker/cluster/leader", timeout=5).json()["workerId"] for u in urls}
    assert len(leaders) == 1 and leaders <= ids, f"workers disagree on the leader: {leaders}"


def test_create_anywhere_scale_anywhere_no_restarts(broker, cluster):
    """1 -> 6 -> 2 under 5,000 messages, each REST call to a different worker."""
    flow = Flow(broker.service_url, [w.url for w in cluster.live()], rate=500.0, service_ms=5.0)
    try:
        flow.create(via=0)
        first = flow.wait_running(1, via=1)["instances"][0]["status"]
        flow.start_producing(MESSAGES)
        time.sleep(2.0)  # the load schedule, not synchronisation
        flow.scale(6, via=1)
        six = flow.wait_running(6, via=2)
        spread = per_worker(six)
        start_of = {s["instanceId"]: s["status"]["instanceStartTimeMs"] for s in six["instances"]}
        time.sleep(2.0)
        flow.scale(2, via=2)
        two = flow.wait_running(2, via=0)
        lost, dups = flow.finish(MESSAGES)
        final = flow.status(via=1)
        print(
            f"\nlost {lost}, duplicates {dups}, spread at 6: {spread}, final: "
            f"{[(s['instanceId'], s['status']['workerId'], s['status']['numRestarts']) for s in final['instances']]}"
        )
        assert lost == 0, f"{lost} of {MESSAGES} inputs produced no output"
        assert len(spread) == 3, f"6 instances not spread over the 3 workers: {spread}"
        assert [s["status"]["numRestarts"] for s in final["instances"]] == [0, 0]
        assert final["instances"][0]["status"]["instanceStartTimeMs"] == first["instanceStartTimeMs"]
        assert all(s["status"]["instanceStartTimeMs"] == start_of[s["instanceId"]] for s in two["instances"])
        listed = {
            tuple(sorted(requests.get(w.url + "/admin/v3/functions/public/default", timeout=5).json())) for w in cluster.live()
        }
        assert all(flow.name in names for names in listed)
    finally:
        flow.close()
    wait_until(
        lambda: all(
            flow.name not in requests.get(w.url + "/admin/v3/functions/public/default", timeout=5).json() for w in cluster.live()
        ),
        15,
        "the delete to reach every worker",
    )


def test_controller_admin_fails_over_and_reads_the_clusters_capacity(cluster):
    """Item 7: the controller's admin client takes several worker URLs; a dead one is skipped."""
    from pulsar_autoscale.admin.client import FunctionsAdmin
    from pulsar_autoscale.controller.capacity import cluster_capacity
    from pulsar_autoscale.netutil import free_port

    admin = FunctionsAdmin([f"http://127.0.0.1:{free_port()}", cluster.live()[1].url], timeout_s=5)
    cap = cluster_capacity(admin)
    assert admin.admin_url == cluster.live()[1].url
    assert cap is not None and cap.workers == 3 and cap.total == 3 * 32


@pytest.mark.slow
def test_a_burst_drain_runs_on_a_worker_that_hosts_no_instance(broker, cluster):
    """Any worker drains: the one asked takes the config and code from the cluster's topics (its
    SparkSession starts on this first burst, with the worker's interpreter for Spark's Python workers)."""
    n = 2000  # at 100 ms a message the instance alone needs 200 s: the drain (Spark starts in 10-70 s) has work
    flow = Flow(broker.service_url, [w.url for w in cluster.live()], rate=5000.0, service_ms=100.0)
    try:
        flow.create()
        host = flow.wait_running(1)["instances"][0]["status"]["workerId"]
        other = next(w for w in cluster.live() if w.worker_id != host)
        flow.start_producing(n)
        url = f"{other.url}/admin/v3/functions/public/default/{flow.name}/burst"
        resp = requests.post(url, json={"messages": n, "partitions": 2, "threadsPerPartition": 8}, timeout=30)
        assert resp.status_code == 202, resp.text
        report = wait_until(lambda: (r := requests.get(url, timeout=5).json())["finished"] and r, 180, "the drain to finish")[
            "finished"
        ][-1]
        lost, dups = flow.finish(n, timeout_s=120)
        print(
            f"\nburst on {other.worker_id} (instance on {host}): {report['taken']} taken, {report['processed']} "
            f"processed, {report['outputs']} outputs; lost {lost}, duplicates {dups}"
        )
        assert report["error"] is None and report["failed"] == 0
        assert 0 < report["processed"] == report["taken"] == report["outputs"]
        assert lost == 0
    finally:
        flow.close()
