"""One controller config, two clusters: our worker (restart-free) and a stock Pulsar cluster (the
contract-checked fake); only the mode and the admin URL differ. Stock mode plans fewer updates."""

from __future__ import annotations

import uuid

import pulsar

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.metrics import fetch
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.functions.api.server import WorkerServer
from tests.support.contracts.fake_cluster import FakeCluster
from tests.support.controller import IN_TOPIC, base
from tests.support.scenario import lead, wait_until


def test_stock_mode_scales_a_function_of_a_stock_cluster(broker, tmp_path):
    cluster = FakeCluster()
    try:
        host = cluster.add_host("w1")
        cluster.state.functions["public/default/enrich"] = {
            "tenant": "public",
            "namespace": "default",
            "name": "enrich",
            "className": "enrich.Fn",
            "inputs": [IN_TOPIC],
            "parallelism": 2,
            "runtime": "PYTHON",
            "py": "enrich.py",
        }
        cluster.state.topics[IN_TOPIC] = {
            "msgRateIn": 50.0,
            "msgRateOut": 20.0,
            "msgInCounter": 5000,
            "subscriptions": {"public/default/enrich": {"msgBacklog": 900, "type": "Shared", "consumers": []}},
        }
        config = ControllerConfig.from_mapping({**base(broker, tmp_path), "mode": "stock", "admin_url": host.url})
        controller = Controller(config)
        lead(controller.elector)
        it = controller.iterate()
        # threshold asks 2 -> 3; stock mode plans a quarter more (ceil(3 * 1.25) = 4) so the next step
        # up needs no second restart of every instance
        assert [(d["function"], d["old"], d["new"], d["applied"]) for d in it.decisions] == [
            ("public/default/enrich", 2, 4, True)
        ]
        assert "headroom 0.25" in it.decisions[0]["reason"]
        assert cluster.state.functions["public/default/enrich"]["parallelism"] == 4
        assert cluster.state.violations == [], "a request outside Pulsar's documented API"
        # stock mode's longer cooldown (3 periods): the next period does not update again
        it = controller.iterate(now=it.time + 10)
        assert not [d for d in it.decisions if d["applied"]]
        assert "cooldown" in it.decisions[0]["reason"]
        controller.elector.release()
    finally:
        cluster.close()


def test_same_config_in_worker_mode(broker, tmp_path):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url) as w:
        name = f"enrich-{uuid.uuid4().hex[:6]}"
        admin = FunctionsAdmin(w.url)
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "inputs": [f"{name}-in"],
                "className": "pulsar_autoscale.functions.examples.sleepy.Sleepy",
                "parallelism": 2,
                "receiverQueueSize": 1,
                "userConfig": {"service_ms": 1000},
            }
        )
        wait_until(
            lambda: admin.status("public", "default", name)["numRunning"] == 2,
            30,
            "both instances subscribed before the backlog is produced",
        )
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        producer = client.create_producer(f"{name}-in", batching_enabled=False, block_if_queue_full=True)
        for _ in range(900):
            producer.send_async(b"x", None)
        producer.flush()
        topic = f"persistent://public/default/{name}-in"
        wait_until(
            lambda: (fetch(broker.metrics_url, 0).backlog_messages(topic, f"public/default/{name}") or 0) > 150,
            20,
            "the broker's backlog gauge (refreshed every ~5 s) to show the backlog",
        )
        config = ControllerConfig.from_mapping(
            {**base(broker, tmp_path), "mode": "worker", "admin_url": w.url, "metrics_url": broker.metrics_url}
        )
        controller = Controller(config)
        lead(controller.elector)
        fqfn = f"public/default/{name}"
        it = controller.iterate()
        decision = next(d for d in it.decisions if d["function"] == fqfn)
        assert (decision["old"], decision["new"], decision["applied"]) == (2, 3, True)
        assert admin.get("public", "default", name)["parallelism"] == 3
        controller.elector.release()
        client.close()
