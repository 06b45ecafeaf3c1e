"""pulsar-admin's restart, stop and start of one instance and of all instances of a keyedState function, and an
update that restarts them, under load, on one worker (mailboxes) and on a 3-worker cluster (route topics): a stopped instance's keys wait while
the others go on, and counts end exact under EFFECTIVELY_ONCE."""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager

import pytest

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from pulsar_autoscale.functions.keygroups import key_group
from scenario import EXAMPLES, wait_until

from cluster.harness import WorkerCluster
from state_migration.test_cluster import KEYS, RECORDS, _load
from state_migration.test_property import WorkerProcess, _counts

pytestmark = pytest.mark.slow


@contextmanager
def _worker_url(broker, tmp_path, cluster: bool):
    if cluster:
        with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as workers:
            workers.wait_ready()
            yield workers.live()[1].url
        return
    worker = WorkerProcess(broker, tmp_path)
    worker.start()
    try:
        yield worker.url
    finally:
        worker.stop(kill=False)


@pytest.mark.parametrize("cluster", [False, True], ids=["one-worker", "cluster"])
def test_restart_stop_and_start_of_instances_under_load(broker, tmp_path, cluster):
    name = f"kr-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    with _worker_url(broker, tmp_path, cluster) as url:
        admin = FunctionsAdmin(url)
        admin.create({"tenant": "public", "namespace": "default", "name": name, "className": "keyed_count.KeyedCount",
                      "inputs": [src], "parallelism": 3, "keyedState": True,
                      "processingGuarantees": "EFFECTIVELY_ONCE", "subscriptionPosition": "Earliest"},
                     str(EXAMPLES / "keyed_count.py"))
        running = lambda: {i["instanceId"] for i in admin.status("public", "default", name)["instances"]  # noqa: E731
                           if i["status"]["running"]}
        wait_until(lambda: running() == {0, 1, 2}, 60, lambda: f"3 instances running: {running()}")
        with _load(broker, src) as producer:
            time.sleep(2)
            admin.action("public", "default", name, "restart", 1)
            time.sleep(3)
            admin.action("public", "default", name, "restart", 0)   # on a cluster the front's instance
            time.sleep(3)
            admin.action("public", "default", name, "stop", 2)
            wait_until(lambda: 2 not in running(), 30, "instance 2 stopped")
            before = _counts(admin, name, KEYS)
            time.sleep(3)
            after = _counts(admin, name, KEYS)
            waiting = {k for k in before if key_group(k, 128) >= 86}   # instance 2's groups of 3 (uniform)
            if cluster:   # the stopped instance's store went with it (it may start on another worker)
                with pytest.raises(AdminError, match="404.*instances \\[2\\] are stopped"):
                    admin.get_state("public", "default", name, min(waiting))
            else:         # its store stays on the worker
                assert waiting and all(after[k] == before[k] for k in waiting), (before, after)
            assert all(after[k] > before[k] for k in set(before) - waiting), "\n".join(f"{k} g{key_group(k, 128)}: {before[k]} -> {after[k]}" for k in sorted(before, key=lambda k: int(k[1:])))
            admin.action("public", "default", name, "start", 2)
            wait_until(lambda: 2 in running(), 30, "instance 2 started again")
            time.sleep(2)
            admin.action("public", "default", name, "restart")   # every instance
            time.sleep(3)
            admin.update({"tenant": "public", "namespace": "default", "name": name,   # restarts them all too
                          "userConfig": {"version": 2}})
            time.sleep(3)
            admin.action("public", "default", name, "stop")
            wait_until(lambda: not running(), 30, "every instance stopped")
            admin.action("public", "default", name, "start")
            assert producer.wait(90) == 0
        want = {f"k{k}": RECORDS // KEYS for k in range(KEYS)}
        wait_until(lambda: _counts(admin, name, KEYS) == want, 120,
                   lambda: f"exact counts {RECORDS // KEYS} per key: {_counts(admin, name, KEYS)}")
