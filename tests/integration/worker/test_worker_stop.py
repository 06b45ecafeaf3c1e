"""A worker's stop is bounded: an instance stuck in user code (or a broker that is gone) cannot keep a stopping
worker alive. Past --shutdown-timeout it exits (1) and logs what the stop waited on; a second signal exits at once.
CI saw a SIGTERM'd worker still alive after 60 s (its stop waited on a group file lock that was never freed)."""

from __future__ import annotations

import signal
import subprocess
import uuid
from pathlib import Path

import pytest
import requests

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.netutil import free_port
from tests.support.commands import worker_command
from tests.support.scenario import EXAMPLES, wait_until

DRAIN_TIMEOUT_S = 30  # functions/worker/worker.py: what a stop waits for a busy instance without the bound


class Worker:
    def __init__(self, broker, tmp_path: Path, shutdown_timeout_s: float, *options: str):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = tmp_path / "worker.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                worker_command(
                    broker.service_url,
                    broker.metrics_url,
                    self.url.rsplit(":", 1)[1],
                    tmp_path / "data",
                    "--shutdown-timeout",
                    str(shutdown_timeout_s),
                    *options,
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(self._healthy, 60, lambda: f"the worker to answer; its log: {self.log.read_text()[-2000:]}")

    def _healthy(self) -> bool:
        try:
            return requests.get(self.url + "/healthz", timeout=0.5).ok
        except requests.RequestException:
            return False

    def stuck_in_user_code(self, client) -> None:
        """A function whose process() takes 10 minutes, with one message in it."""
        admin, name = FunctionsAdmin(self.url), f"stuck-{uuid.uuid4().hex[:6]}"
        src = f"persistent://public/default/{name}-in"
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "sleepy.Sleepy",
                "inputs": [src],
                "parallelism": 1,
                "subscriptionPosition": "Earliest",
                "userConfig": {"service_ms": 600_000, "dist": "deterministic"},
            },
            str(EXAMPLES / "sleepy.py"),
        )
        producer = client.create_producer(src)
        producer.send(b"x")
        producer.close()
        wait_until(
            lambda: admin.status("public", "default", name)["instances"][0]["status"]["numReceived"] == 1,
            30,
            "the instance to take the message",
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def worker_factory(broker, tmp_path):
    started: list[Worker] = []

    def start(shutdown_timeout_s: float) -> Worker:
        started.append(Worker(broker, tmp_path, shutdown_timeout_s))
        return started[-1]

    yield start
    for w in started:
        w.stop()


def test_a_stop_that_cannot_drain_ends_after_the_shutdown_timeout(worker_factory, client):
    worker = worker_factory(shutdown_timeout_s=2)
    worker.stuck_in_user_code(client)
    worker.proc.send_signal(signal.SIGTERM)
    try:  # without the bound the drain alone waits DRAIN_TIMEOUT_S for the instance
        rc = worker.proc.wait(DRAIN_TIMEOUT_S - 5)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the worker was still stopping {DRAIN_TIMEOUT_S - 5} s after SIGTERM, "
            f"with --shutdown-timeout 2: {worker.log.read_text()[-2000:]}"
        )
    log = worker.log.read_text()
    assert rc == 1, log[-2000:]
    assert "not done after 2 s (--shutdown-timeout)" in log and "sleepy.py" in log, log[-3000:]


def test_a_second_signal_ends_the_stop_at_once(worker_factory, client):
    worker = worker_factory(shutdown_timeout_s=600)
    worker.stuck_in_user_code(client)
    worker.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "draining instances..." in worker.log.read_text(), 30, "the stop to begin")
    worker.proc.send_signal(signal.SIGTERM)
    try:
        rc = worker.proc.wait(DRAIN_TIMEOUT_S - 5)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a second SIGTERM did not end the stop: {worker.log.read_text()[-2000:]}")
    assert rc == 1 and "stop: a second signal" in worker.log.read_text(), worker.log.read_text()[-2000:]


def test_a_cluster_worker_stopped_while_the_broker_is_down_exits_with_a_clear_error(tmp_path):
    """Its leave cannot reach the broker (the last heartbeat's send times out): one line naming the broker and
    exit 1, not a traceback from the Pulsar client and an abort in the interpreter's teardown (exit -6)."""
    broker = EmbeddedBroker(data_dir=str(tmp_path / "broker")).start()
    worker = Worker(broker, tmp_path, 600, "--cluster", f"c{uuid.uuid4().hex[:6]}")
    try:
        broker.stop()
        worker.proc.send_signal(signal.SIGTERM)
        try:  # the heartbeat's send timeout (two heartbeat timeouts: 5 s), well before --shutdown-timeout's 600 s
            rc = worker.proc.wait(60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker was still stopping 60 s after SIGTERM: {worker.log.read_text()[-2000:]}")
        log = worker.log.read_text()
        assert rc == 1, log[-3000:]
        assert f"stop: the broker at {broker.service_url} did not answer" in log, log[-3000:]
        assert "Traceback" not in log and "Fatal Python error" not in log, log[-3000:]
    finally:
        worker.stop()
        broker.stop()
