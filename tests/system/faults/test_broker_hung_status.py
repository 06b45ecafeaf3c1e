"""A hung broker (SIGSTOP, connections open) makes `status` honest within seconds: no instance says
`running` while the broker does not answer, and all run again once it does (docs/reliability.md,
functions/worker/broker_watch.py). The test stops and continues only the broker it started, by pid (pulsar-lite
itself, or Apache Pulsar's JVM with --broker apache)."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pulsar

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.functions.worker.broker_watch import SILENT_AFTER_S
from tests.support.fault_scenarios import broker_pid, own_broker
from tests.support.scenario import wait_until


def test_status_says_not_running_within_seconds_of_a_hung_broker(tmp_path, broker_kind):
    with (
        own_broker(broker_kind, data_dir=str(tmp_path / "broker")) as broker,
        WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url) as server,
    ):
        admin, name = FunctionsAdmin(server.url), f"hung-{uuid.uuid4().hex[:6]}"
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "inputs": [f"{name}-in"],
                "output": f"{name}-out",
                "parallelism": 2,
                "className": "pulsar_autoscale.functions.examples.exclaim.Exclaim",
            }
        )
        status = lambda: admin.status("public", "default", name)  # noqa: E731
        wait_until(lambda: status()["numRunning"] == 2, 30, "2 running instances")
        lite_pid = broker_pid(broker)
        os.kill(lite_pid, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            hung = wait_until(
                lambda: (lambda s: s if s["numRunning"] == 0 else None)(status()),
                15,
                "status to say no instance runs while the broker is stopped",
            )
            honest_after = time.monotonic() - stopped
        finally:
            os.kill(lite_pid, signal.SIGCONT)
        resumed = time.monotonic()
        assert all("the broker has not answered" in i["status"]["error"] for i in hung["instances"]), hung
        assert honest_after < SILENT_AFTER_S + 4, f"status said running for {honest_after:.1f} s of a hung broker"
        wait_until(lambda: status()["numRunning"] == 2, 30, "the instances to run again after SIGCONT")
        running_again = time.monotonic() - resumed
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        try:
            consumer = client.subscribe(f"{name}-out", "check", initial_position=pulsar.InitialPosition.Earliest)
            client.create_producer(f"{name}-in").send(b"back")
            assert consumer.receive(timeout_millis=30000).data() == b"back!"
        finally:
            client.close()
        print(f"\nrunning false {honest_after:.1f} s after SIGSTOP; running again {running_again:.1f} s after SIGCONT")
