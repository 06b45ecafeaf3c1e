"""A deleted function's state topics are deleted from the broker, as Pulsar drops a deleted function's state table,
when the worker has the broker's admin REST API (`--web-service-url`). pulsar-lite has none (B7), so the broker
here is pulsar-lite for the binary protocol and the admin API is the contract-checked fake of a stock cluster
(tests/support/contracts): it lists the namespace's topics and takes the deletes, and records anything the published
document does not allow."""

from __future__ import annotations

import logging
import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.state.changelog import changelog_of, state_topic
from pulsar_autoscale.netutil import free_port
from tests.support.cluster_harness import WorkerCluster
from tests.support.contracts.fake_cluster import FakeCluster
from tests.support.keyed import create_counting, expect_per_key, send_per_key
from tests.support.scenario import wait_until

pytestmark = pytest.mark.slow
NS = "persistent://public/default/"


@pytest.fixture
def admin_api():
    fake = FakeCluster()
    host = fake.add_host("broker-admin")
    yield fake.state, host.url
    fake.close()


def _topics_of(cfg: FunctionConfig) -> set[str]:
    """Every name a function's state can have: changelog shards and, on a cluster, assignment, control, routes."""
    log = changelog_of(cfg)
    return {log.shard_topic(s) for s in range(log.shards)} | {
        state_topic(cfg.tenant, cfg.namespace, cfg.name, cfg.stateId, w) for w in ("assignment", "control", "route-0", "route-11")
    }


def _as_topics(state, names: set[str], partitioned: bool) -> None:
    """As the broker holds them: a partitioned topic is its metadata and a topic per partition (both listed)."""
    for t in names:
        if partitioned:
            state.partitions[t] = 2
            state.topics.update({f"{t}-partition-{i}": {} for i in range(2)})
        else:
            state.topics[t] = {}


@pytest.mark.parametrize("partitioned", [False, True], ids=["topics", "partitioned-topics"])
def test_deleting_a_function_deletes_its_state_topics_and_no_other(broker, client, tmp_path, admin_api, partitioned):
    """Partitioned: a broker whose allowAutoTopicCreationType is `partitioned` creates every state topic so."""
    state, url = admin_api
    name = f"gone-{uuid.uuid4().hex[:6]}"
    with WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url, web_service_url=url) as w:
        admin = FunctionsAdmin(w.url)
        src = f"{NS}{name}-in"
        create_counting(admin, name, src, 1)
        send_per_key(client, src, 2)
        expect_per_key(admin, name, 2, "the function counted")
        cfg = FunctionConfig.from_dict(admin.get("public", "default", name))
        mine = _topics_of(cfg)
        older = FunctionConfig.from_dict({**admin.get("public", "default", name), "stateId": "0123456789ab"})
        longer = FunctionConfig.from_dict({**admin.get("public", "default", name), "name": f"{name}-{cfg.stateId}"})
        others = (
            {src, f"{NS}{name}-out", f"{NS}__state-{name}-changelog"}  # a config saved before stateId
            | _topics_of(older)
            | _topics_of(longer)
        )
        _as_topics(state, mine | others, partitioned)
        left = set(state.topics) - ({f"{t}-partition-{i}" for t in mine for i in range(2)} if partitioned else mine)
        admin.delete("public", "default", name)
        wait_until(
            lambda: {t for t, _ in state.deleted} == mine,
            60,
            lambda: f"the {len(mine)} state topics deleted, saw {sorted(t for t, _ in state.deleted)}",
        )
    assert all(force for _, force in state.deleted), state.deleted
    assert set(state.topics) == left and set(state.partitions) == (others if partitioned else set())
    assert state.violations == []


def test_without_the_admin_api_the_delete_still_goes_through_and_says_what_stays(broker, client, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pulsar_autoscale.functions.worker.worker")
    name = f"kept-{uuid.uuid4().hex[:6]}"
    unreachable = f"http://127.0.0.1:{free_port()}"
    with WorkerServer(
        broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url, web_service_url=unreachable
    ) as w:
        admin = FunctionsAdmin(w.url)
        create_counting(admin, name, f"{NS}{name}-in", 1)
        state_id = admin.get("public", "default", name)["stateId"]
        admin.delete("public", "default", name)
        assert name not in admin.list("public", "default")
        wait_until(
            lambda: any(f"__state-{name}-{state_id}-" in r.getMessage() for r in caplog.records),
            60,
            "a warning naming the state topics that stay",
        )
    warning = next(r for r in caplog.records if f"__state-{name}-{state_id}-" in r.getMessage())
    assert warning.levelno == logging.WARNING and unreachable in warning.getMessage(), warning.getMessage()


def test_on_a_cluster_each_worker_that_ran_instances_deletes_after_its_drain(broker, client, tmp_path, admin_api):
    state, url = admin_api
    name = f"gone-{uuid.uuid4().hex[:6]}"
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path, n=2, extra_args=("--web-service-url", url)) as cluster:
        admin = FunctionsAdmin(cluster.workers[0].url)
        create_counting(admin, name, f"{NS}{name}-in", 1)
        admin.update({"tenant": "public", "namespace": "default", "name": name, "parallelism": 2})
        wait_until(
            lambda: (
                len(
                    {
                        i["status"]["workerId"]
                        for i in admin.status("public", "default", name)["instances"]
                        if i["status"]["running"]
                    }
                )
                == 2
            ),
            60,
            "an instance on each worker",
        )
        cfg = FunctionConfig.from_dict(admin.get("public", "default", name))
        mine = _topics_of(cfg)
        state.topics.update({t: {} for t in mine | {f"{NS}{name}-in"}})
        admin.delete("public", "default", name)
        lists = "/admin/v2/persistent/public/default"
        wait_until(
            lambda: sum(1 for r in state.requests if r[1] == "GET" and r[2] == lists) == 2,
            60,
            lambda: f"a listing from each of the 2 workers, saw {[r[:3] for r in state.requests]}",
        )
    assert {t for t, _ in state.deleted} == mine and set(state.topics) == {f"{NS}{name}-in"}
    assert state.violations == []
