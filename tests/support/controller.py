"""What the controller tests share: a slow function and a load on it, the controller configs (a worker's, a stock
cluster's), and a policy that decides every period."""

from __future__ import annotations

import threading
import uuid

import pulsar

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.controller.config import ControllerConfig

TOGGLE = '''
from pulsar_autoscale.policies import Policy, Proposal

class Toggle(Policy):
    """Flips every function between 1 and 2 instances each period: a decision every period."""
    name = "toggle"

    def decide(self, graph, snapshot, current, state):
        return Proposal({fn: 3 - k for fn, k in current.items()}, {fn: "toggle" for fn in current}, state)
'''


def make_function(worker, service_ms: float) -> str:
    name = f"ctl-{uuid.uuid4().hex[:6]}"
    FunctionsAdmin(worker.url).create(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "inputs": [f"{name}-in"],
            "className": "pulsar_autoscale.functions.examples.sleepy.Sleepy",
            "receiverQueueSize": 5,
            "userConfig": {"service_ms": service_ms, "dist": "deterministic"},
        }
    )
    return name


def load(broker, topic: str, rate: float, stop: threading.Event) -> None:
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(topic, batching_enabled=False, block_if_queue_full=True)
    while not stop.wait(1.0 / rate):
        producer.send_async(b"x", None)
    producer.flush()
    client.close()


def config(broker, worker, tmp_path, **overrides) -> ControllerConfig:
    base = dict(
        service_url=broker.service_url,
        admin_url=worker.url,
        metrics_url=broker.metrics_url,
        policy="queueing",
        period_s=2.0,
        window_s=4.0,
        http_port=0,
        lock_topic=f"persistent://public/default/lock-{uuid.uuid4().hex[:6]}",
        decision_log=str(tmp_path / "decisions.jsonl"),
        plan={"max_parallelism": 6},
    )
    return ControllerConfig(**{**base, **overrides})


IN_TOPIC = "persistent://public/default/raw"


def base(broker, tmp_path) -> dict:
    return {
        "service_url": broker.service_url,
        "policy": "threshold",
        "period_s": 10.0,
        "window_s": 10.0,
        "http_port": 0,
        "lock_topic": f"persistent://public/default/lock-{uuid.uuid4().hex[:6]}",
        "decision_log": str(tmp_path / "decisions.jsonl"),
    }
