"""A keyedState function deleted and created again under the same name starts with empty state, as Pulsar's
delete drops the function's state table: its state topics are the new function's own (FunctionConfig
stateId), so neither a restore after kill -9 (one worker) nor the restore of every group on a cluster
finds the deleted function's changelog."""

from __future__ import annotations

import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from tests.support.cluster_harness import WorkerCluster
from tests.support.keyed import WorkerProcess, create_counting, expect_per_key, send_per_key
from tests.support.scenario import wait_until

pytestmark = pytest.mark.slow


def _delete_and_create_again(admin: FunctionsAdmin, client, name: str) -> str:
    """The first function counts 4 per key; the second, of the same name on a new input, starts at 0."""
    create_counting(admin, name, f"persistent://public/default/{name}-in-1", 1)
    send_per_key(client, f"persistent://public/default/{name}-in-1", 4)
    expect_per_key(admin, name, 4, "the first function")
    admin.delete("public", "default", name)
    src = f"persistent://public/default/{name}-in-2"
    create_counting(admin, name, src, 1)
    send_per_key(client, src, 1)
    expect_per_key(admin, name, 1, "the function created again (the deleted one's state is not its state)")
    return src


def test_one_worker_kill9_restores_only_the_new_functions_state(broker, client, tmp_path):
    worker = WorkerProcess(broker, tmp_path)
    worker.start()
    try:
        admin = FunctionsAdmin(worker.url)
        name = f"again-{uuid.uuid4().hex[:6]}"
        src = _delete_and_create_again(admin, client, name)
        worker.stop(kill=True)
        worker.start()  # every group restores from the changelog (an unclean stop)
        send_per_key(client, src, 1)
        expect_per_key(admin, name, 2, "after kill -9 and the restore from the changelog")
    finally:
        worker.stop(kill=False)


def test_cluster_restores_only_the_new_functions_state(broker, client, tmp_path):
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path, n=1) as cluster:
        _delete_and_create_again(FunctionsAdmin(cluster.workers[0].url), client, f"again-{uuid.uuid4().hex[:6]}")


def _deleted_while_its_worker_was_down(cluster: WorkerCluster, client, name: str, src: str):
    """Parallelism 2 on 2 workers, 4 records per key; the worker of instance 1 is killed -9, the function deleted,
    the worker started again: (an admin client of the other worker, the worker back, its data dir's files of
    the deleted function)."""
    admin = FunctionsAdmin(cluster.workers[0].url)
    create_counting(admin, name, src, parallelism=2)
    wait_until(
        lambda: len(set(cluster.placement(name).values())) == 2, 60, lambda: f"one instance per worker: {cluster.placement(name)}"
    )
    send_per_key(client, src, 4)
    expect_per_key(admin, name, 4, "the first function")
    crashed = cluster.by_id(cluster.placement(name)[1])
    files = cluster.base_dir / crashed.worker_id / "functions" / "public" / "default" / name
    assert any(files.rglob("*.sqlite*")), f"no state files of {name} under {files}"
    admin = FunctionsAdmin(next(w for w in cluster.workers if w is not crashed).url)
    cluster.kill(crashed)
    admin.delete("public", "default", name)
    back = cluster.restart(crashed)
    cluster.wait_ready()
    return admin, back, files


def test_a_worker_back_from_a_crash_holds_no_state_of_a_function_deleted_meanwhile(broker, client, tmp_path):
    """kill -9 of the worker that ran instance 1 (its files stay on its disk); the function is deleted while it
    is down; back, it runs instance 1 of a function created again under the same name: the files it kept of the
    deleted one are not that function's state."""
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path, n=2) as cluster:
        name = f"again-{uuid.uuid4().hex[:6]}"
        first, second = (f"persistent://public/default/{name}-in-{n}" for n in (1, 2))
        admin, back, _ = _deleted_while_its_worker_was_down(cluster, client, name, first)
        create_counting(admin, name, second, parallelism=2)
        wait_until(
            lambda: cluster.placement(name).get(1) == back.worker_id,
            60,
            lambda: f"instance 1 on the worker back from the crash: {cluster.placement(name)}",
        )
        send_per_key(client, second, 1)
        expect_per_key(admin, name, 1, "the function created again, instance 1 on the worker back from the crash")


def test_a_worker_back_from_a_crash_removes_the_files_of_a_function_deleted_meanwhile(broker, client, tmp_path):
    """Its instance's key-group files (the first function's state) would otherwise stay on its disk for good."""
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path, n=2) as cluster:
        name = f"gone-{uuid.uuid4().hex[:6]}"
        _, back, files = _deleted_while_its_worker_was_down(cluster, client, name, f"persistent://public/default/{name}-in")
        wait_until(
            lambda: not files.exists(),
            30,
            lambda: (
                f"{files} still there 30 s after the worker came back: {sorted(files.rglob('*'))[:5]} "
                f"(log: {back.log_path.read_text()[-1500:]})"
            ),
        )
