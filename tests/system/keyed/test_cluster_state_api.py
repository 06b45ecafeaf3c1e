"""querystate/putstate of a keyedState function on a cluster answer on any worker, as every other admin call
does (docs/cluster.md): a key's state lives on the worker whose instance holds its key group, and a worker
that does not hold it asks the others. 3 workers, 2 instances spread over two of them, the third hosting
none."""

from __future__ import annotations

import uuid

import pytest
import requests

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from pulsar_autoscale.functions.model.keygroups import key_group
from tests.support.cluster_harness import WorkerCluster, key_counts
from tests.support.keyed import PER_KEY_KEYS, create_paced, send_per_key
from tests.support.scenario import EXAMPLES, wait_until

pytestmark = pytest.mark.slow


def test_querystate_and_putstate_answer_on_every_worker(broker, client, tmp_path):
    name = f"qs-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as cluster:
        cluster.wait_ready()
        placed = create_paced(cluster, name, src, parallelism=2)
        idle = next(w for w in cluster.live() if w.worker_id not in placed.values())
        send_per_key(client, src, 4)
        want = {f"k{k}": 4 for k in range(PER_KEY_KEYS)}
        counted = lambda: key_counts(cluster, name, PER_KEY_KEYS)  # noqa: E731 (from the holders)
        wait_until(lambda: counted() == want, 60, lambda: f"every record counted: {counted()}")
        for w in cluster.live():
            admin = FunctionsAdmin(w.url)
            got = {f"k{k}": admin.get_state("public", "default", name, f"k{k}")["numberValue"] for k in range(PER_KEY_KEYS)}
            assert got == want, f"querystate on {w.worker_id} (hosts {sorted(i for i, o in placed.items() if o == w.worker_id)})"
            with pytest.raises(AdminError, match="404.*nokey"):
                admin.get_state("public", "default", name, "nokey")
        for k in range(PER_KEY_KEYS):  # written through the worker that hosts nothing, read back everywhere
            FunctionsAdmin(idle.url).put_state("public", "default", name, {"key": f"k{k}", "numberValue": 100 + k})
        for w in cluster.live():
            got = [
                FunctionsAdmin(w.url).get_state("public", "default", name, f"k{k}")["numberValue"] for k in range(PER_KEY_KEYS)
            ]
            assert got == [100 + k for k in range(PER_KEY_KEYS)], f"after putstate, querystate on {w.worker_id}: {got}"
        # The forward asks the others with scope=local; a worker that holds no instance of the key's group says so
        # (421) rather than pretend the key does not exist.
        local = requests.get(
            f"{idle.url}/admin/v3/functions/public/default/{name}/state/k0", params={"scope": "local"}, timeout=5
        )
        assert local.status_code == 421, (local.status_code, local.text)


def test_a_state_key_written_in_another_keys_group_is_found_on_every_worker(broker, client, tmp_path):
    """A function writes state keys while processing a message key's records (poison counts `deliveries:<input>`
    in the message key's group): querystate and putstate of such a key find it on the worker that holds it, also
    when the state key's own group is on another worker (a put there would make a second copy)."""
    name = f"qp-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as cluster:
        cluster.wait_ready()
        FunctionsAdmin(cluster.live()[0].url).create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "poison.Poison",
                "inputs": [src],
                "parallelism": 2,
                "keyedState": True,
                "subscriptionPosition": "Earliest",
            },
            str(EXAMPLES / "poison.py"),
        )
        wait_until(lambda: cluster.spread(name, 2), 60, "2 instances on 2 different workers")
        state_key = "deliveries:hello"
        # instance 0 owns groups 0-63, instance 1 64-127: the message key's group on the other instance
        other_half = key_group(state_key, 128) < 64
        message_key = next(k for k in (f"m{i}" for i in range(1000)) if (key_group(k, 128) >= 64) == other_half)
        client.create_producer(src).send(b"hello", partition_key=message_key)
        for w in cluster.live():
            admin = FunctionsAdmin(w.url)
            wait_until(
                lambda: _number(admin, name, state_key) == 1,
                30,
                lambda: f"querystate {state_key} on {w.worker_id}: {_number(admin, name, state_key)}",
            )
        for value, w in enumerate(cluster.live(), start=10):  # a putstate through any worker updates that key
            FunctionsAdmin(w.url).put_state("public", "default", name, {"key": state_key, "numberValue": value})
            seen = {v.worker_id: _number(FunctionsAdmin(v.url), name, state_key) for v in cluster.live()}
            assert set(seen.values()) == {value}, f"after putstate {value} through {w.worker_id}: {seen}"


def _number(admin: FunctionsAdmin, name: str, key: str) -> int | str:
    try:
        return admin.get_state("public", "default", name, key)["numberValue"]
    except AdminError as exc:
        return str(exc)
