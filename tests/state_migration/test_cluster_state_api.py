"""querystate/putstate of a keyedState function on a cluster answer on any worker, as every other admin call
does (docs/cluster.md): a key's state lives on the worker whose instance holds its key group, and a worker
that does not hold it asks the others. 3 workers, 2 instances spread over two of them, the third hosting
none."""

from __future__ import annotations

import uuid

import pytest
import requests

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from scenario import wait_until

from cluster.harness import WorkerCluster
from state_migration.test_cluster import _counts, _create_paced
from state_migration.test_recreate import KEYS, _send

pytestmark = pytest.mark.slow


def test_querystate_and_putstate_answer_on_every_worker(broker, client, tmp_path):
    name = f"qs-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as cluster:
        cluster.wait_ready()
        placed = _create_paced(cluster, name, src, parallelism=2)
        idle = next(w for w in cluster.live() if w.worker_id not in placed.values())
        _send(client, src, 4)
        want = {f"k{k}": 4 for k in range(KEYS)}
        counted = lambda: {k: v for k, v in _counts(cluster, name).items() if k in want}  # noqa: E731 (from the holders)
        wait_until(lambda: counted() == want, 60, lambda: f"every record counted: {counted()}")
        for w in cluster.live():
            admin = FunctionsAdmin(w.url)
            got = {f"k{k}": admin.get_state("public", "default", name, f"k{k}")["numberValue"] for k in range(KEYS)}
            assert got == want, f"querystate on {w.worker_id} (hosts {sorted(i for i, o in placed.items() if o == w.worker_id)})"
            with pytest.raises(AdminError, match="404.*nokey"):
                admin.get_state("public", "default", name, "nokey")
        for k in range(KEYS):   # written through the worker that hosts nothing, read back everywhere
            FunctionsAdmin(idle.url).put_state("public", "default", name, {"key": f"k{k}", "numberValue": 100 + k})
        for w in cluster.live():
            got = [FunctionsAdmin(w.url).get_state("public", "default", name, f"k{k}")["numberValue"]
                   for k in range(KEYS)]
            assert got == [100 + k for k in range(KEYS)], f"after putstate, querystate on {w.worker_id}: {got}"
        # The forward asks the others with scope=local; a worker that holds no instance of the key's group says so
        # (421) rather than pretend the key does not exist.
        local = requests.get(f"{idle.url}/admin/v3/functions/public/default/{name}/state/k0", params={"scope": "local"},
                             timeout=5)
        assert local.status_code == 421, (local.status_code, local.text)
