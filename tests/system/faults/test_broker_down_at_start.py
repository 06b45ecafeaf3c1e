"""A worker (re)started while its broker is down: the API answers at once, status says why nothing
runs, and the saved functions process as soon as the broker is back (docs/reliability.md)."""

from __future__ import annotations

import time

import pytest
import requests

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.netutil import free_port
from tests.support.fault_scenarios import EXAMPLES, Collector, start_broker, start_worker, stop, wait


@pytest.mark.slow
def test_a_worker_started_while_the_broker_is_down_runs_its_functions_once_it_is_back(tmp_path, broker_kind):
    port, metrics_port, worker_port = free_port(), free_port(), free_port()
    service_url, metrics_url = f"pulsar://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
    url, name = f"http://127.0.0.1:{worker_port}", "exclaim-down"
    src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
    broker = start_broker(port, metrics_port, str(tmp_path / "broker"), broker_kind)
    args = (service_url, metrics_url, worker_port, str(tmp_path / "worker"), "process", tmp_path / "worker.log")
    worker = start_worker(*args)
    try:
        wait(lambda: _healthy(url), 30, "the worker's API")
        admin = FunctionsAdmin(url)
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "exclaim.Exclaim",
                "inputs": [src],
                "output": dst,
                "parallelism": 2,
            },
            str(EXAMPLES / "exclaim.py"),
        )
        wait(lambda: admin.status("public", "default", name)["numRunning"] == 2, 60, "2 running instances")
        stop(worker)
        stop(broker)

        worker = start_worker(*args)  # the broker is down
        wait(lambda: _healthy(url), 15, "the API of a worker whose broker is down")
        status = admin.status("public", "default", name)
        assert status["numRunning"] == 0
        assert all("waiting for" in i["status"]["error"] for i in status["instances"]), status
        time.sleep(3)  # longer than a metrics request's timeout: the worker keeps waiting, never guesses
        assert worker.poll() is None, "the worker exited while its broker was down"

        broker = start_broker(port, metrics_port, str(tmp_path / "broker"), broker_kind)
        back = broker.port_open_at
        collector = Collector(service_url, dst)
        try:
            wait(
                lambda: admin.status("public", "default", name)["numRunning"] == 2,
                30,
                "the restored instances to run once the broker is back",
            )
            running_after = time.monotonic() - back
            _send(service_url, src, 200)
            wait(lambda: len(collector.counts) == 200, 30, "200 outputs")
        finally:
            collector.close()
        print(f"\nrunning again {running_after:.1f} s after the broker was back")
    finally:
        for p in (worker, broker):
            if p.poll() is None:
                stop(p)


def _healthy(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=0.5).ok
    except requests.RequestException:
        return False


def _send(service_url: str, topic: str, n: int) -> None:
    import pulsar

    c = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    p = c.create_producer(topic)
    for i in range(n):
        p.send(b"m%d" % i)
    c.close()
