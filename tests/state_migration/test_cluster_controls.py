"""pulsar-admin's restart, stop and start of one instance and of all instances of a keyedState function on a
cluster, under load: a stopped instance's keys wait while the others go on, and counts end exact under
EFFECTIVELY_ONCE."""

from __future__ import annotations

import time
import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.functions.keygroups import key_group
from scenario import wait_until

from cluster.harness import WorkerCluster
from state_migration.test_cluster import _assert_exact, _counts, _create_paced, _load, _placement

pytestmark = pytest.mark.slow


def test_restart_stop_and_start_of_instances_under_load(broker, tmp_path):
    name = f"kr-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as cluster:
        cluster.wait_ready()
        _create_paced(cluster, name, src, 3)
        admin = FunctionsAdmin(cluster.live()[1].url)
        with _load(broker, src) as producer:
            time.sleep(2)
            admin.action("public", "default", name, "restart", 1)
            time.sleep(3)
            admin.action("public", "default", name, "restart", 0)   # the front's instance
            time.sleep(3)
            admin.action("public", "default", name, "stop", 2)
            wait_until(lambda: 2 not in _placement(cluster, name), 30, "instance 2 stopped")
            before = _counts(cluster, name)
            time.sleep(3)
            after = _counts(cluster, name)
            waiting = {k for k in before if key_group(k, 128) >= 86}   # instance 2's groups of 3 (uniform)
            assert waiting and all(after[k] == before[k] for k in waiting), (before, after)
            assert all(after[k] > before[k] for k in set(before) - waiting), (before, after)
            admin.action("public", "default", name, "start", 2)
            wait_until(lambda: 2 in _placement(cluster, name), 30, "instance 2 started again")
            time.sleep(2)
            admin.action("public", "default", name, "restart")   # every instance
            time.sleep(3)
            admin.action("public", "default", name, "stop")
            wait_until(lambda: not _placement(cluster, name), 30, "every instance stopped")
            admin.action("public", "default", name, "start")
            assert producer.wait(90) == 0
        _assert_exact(cluster, name)
