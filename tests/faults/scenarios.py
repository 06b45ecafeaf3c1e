"""Fault scenarios with real processes, killed by pid: used by the fault tests and, looped, by hand.

    .venv/bin/python -m tests.faults.scenarios worker-kill --runtime thread --runs 5
    .venv/bin/python -m tests.faults.scenarios broker-kill --runs 2

prints one JSON line per run (lost, duplicates, seconds until outputs flow again).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pulsar
import requests

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.netutil import free_port

EXAMPLES = Path(__file__).resolve().parents[2] / "functions" / "examples"
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@dataclass
class Outcome:
    scenario: str
    runtime: str
    sent: int
    lost: int
    duplicates: int
    killed_at: int            # outputs seen when the fault struck
    recovery_s: float | None  # from the restart (or the broker's return) to the next new output


class Collector:
    """Counts the function's outputs ("m<i>!": a bare number would be deserialized as an int) on a subscription of its own, created before any input."""

    def __init__(self, service_url: str, topic: str):
        self._client = pulsar.Client(service_url, logger=QUIET)
        self._consumer = self._client.subscribe(topic, "fault-collector", consumer_type=pulsar.ConsumerType.Shared)
        self.counts: dict[int, int] = {}
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self._consumer.receive(200)
            except pulsar.Timeout:
                continue
            except pulsar.PulsarException:
                time.sleep(0.2)  # the broker is down: the client reconnects
                continue
            i = int(msg.data()[1:].rstrip(b"!"))
            self.counts[i] = self.counts.get(i, 0) + 1
            self.times.append(time.monotonic())
            self._consumer.acknowledge(msg)

    def total(self) -> int:
        return sum(self.counts.values())

    def first_output_after(self, t: float) -> float | None:
        return next((x - t for x in list(self.times) if x > t), None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()


PRODUCER = """
import sys, time, pulsar
url, topic, n, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
c = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error), operation_timeout_seconds=60)
p = c.create_producer(topic, block_if_queue_full=True, send_timeout_millis=0)
start = time.monotonic()
for i in range(n):
    p.send_async(b"m%d" % i, None)
    delay = start + i / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)
p.flush()
c.close()
"""


def start_producer(service_url: str, topic: str, n: int, rate: float) -> subprocess.Popen:
    """Inputs from a process of their own, as in production (send_timeout 0: it outlives a broker outage)."""
    return subprocess.Popen([sys.executable, "-c", PRODUCER, service_url, topic, str(n), str(rate)])


def start_worker(service_url: str, metrics_url: str, port: int, data_dir: str, runtime: str,
                 log_path: Path) -> subprocess.Popen:
    log = open(log_path, "ab")
    return subprocess.Popen([sys.executable, "-m", "pulsar_autoscale.cli", "worker", "--service-url", service_url,
                             "--metrics-url", metrics_url, "--port", str(port), "--data-dir", data_dir,
                             "--runtime", runtime], stdout=log, stderr=subprocess.STDOUT)


def start_broker(port: int, metrics_port: int, data_dir: str) -> subprocess.Popen:
    """`pulsar-autoscale broker` as a process of its own (its children die with it); returns once ready."""
    proc = subprocess.Popen([sys.executable, "-m", "pulsar_autoscale.cli", "broker", "--port", str(port),
                             "--metrics-port", str(metrics_port), "--data-dir", data_dir],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    if not line.startswith("broker ready"):
        raise AssertionError(f"broker did not start: {line!r}")
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait(probe, timeout_s: float, what: str, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _reachable(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=0.5).ok
    except requests.RequestException:
        return False


def worker_kill(runtime: str = "thread", n: int = 5000, rate: float = 500.0, kill_at: int = 2500,
                down_s: float = 2.0, parallelism: int = 3, relay: bool = True) -> Outcome:
    """Issue 14's scenario: exclaim at parallelism 3, n messages at `rate` from a producer process,
    the worker killed with -9 at about `kill_at` outputs and restarted `down_s` later on the same
    port and data dir. relay=False: clients reach pulsar-lite directly (B10 unfenced, for comparison)."""
    with tempfile.TemporaryDirectory(prefix="fault-") as tmp, EmbeddedBroker(relay=relay) as broker:
        name = f"exclaim-{int(time.time() * 1000) % 10**8}"
        src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
        port, data_dir, log_path = free_port(), str(Path(tmp, "worker")), Path(tmp, "worker.log")
        worker = start_worker(broker.service_url, broker.metrics_url, port, data_dir, runtime, log_path)
        url = f"http://127.0.0.1:{port}"
        collector = None
        try:
            wait(lambda: _reachable(url), 30, "the worker's API")
            admin = FunctionsAdmin(url)
            admin.create({"tenant": "public", "namespace": "default", "name": name, "className": "exclaim.Exclaim",
                          "inputs": [src], "output": dst, "parallelism": parallelism}, str(EXAMPLES / "exclaim.py"))
            wait(lambda: admin.status("public", "default", name)["numRunning"] == parallelism, 30,
                 "the instances to run")
            collector = Collector(broker.service_url, dst)
            producer = start_producer(broker.service_url, src, n, rate)
            try:
                wait(lambda: collector.total() >= kill_at, 60, f"{kill_at} outputs")
            except AssertionError:
                print(log_path.read_text()[-3000:], admin.status("public", "default", name), file=sys.stderr)
                raise
            killed_at = collector.total()
            worker.kill()
            worker.wait()
            time.sleep(down_s)
            restarted = time.monotonic()
            worker = start_worker(broker.service_url, broker.metrics_url, port, data_dir, runtime, log_path)
            producer.wait(60)
            try:
                wait(lambda: len(collector.counts) >= n, 60, "every output")
            except AssertionError:
                pass
            time.sleep(1.0)  # late duplicates
            return Outcome("worker-kill", runtime, n, n - len(collector.counts),
                           sum(c - 1 for c in collector.counts.values()), killed_at,
                           collector.first_output_after(restarted))
        finally:
            if collector is not None:
                collector.close()
            if worker.poll() is None:
                worker.terminate()
                try:
                    worker.wait(30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()


def broker_kill(runtime: str = "thread", n: int = 5000, rate: float = 500.0, kill_at: int = 2500,
                down_s: float = 2.0, parallelism: int = 3) -> Outcome:
    """The broker (`pulsar-autoscale broker`) killed with -9 at about `kill_at` outputs and restarted on
    its port and data dir `down_s` later; the worker and the producer stay up."""
    with tempfile.TemporaryDirectory(prefix="fault-") as tmp:
        port, metrics_port, worker_port = free_port(), free_port(), free_port()
        service_url, metrics_url = f"pulsar://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
        name = f"exclaim-{int(time.time() * 1000) % 10**8}"
        src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
        broker = start_broker(port, metrics_port, str(Path(tmp, "broker")))
        worker = start_worker(service_url, metrics_url, worker_port, str(Path(tmp, "worker")), runtime,
                              Path(tmp, "worker.log"))
        url, collector, producer = f"http://127.0.0.1:{worker_port}", None, None
        try:
            wait(lambda: _reachable(url), 30, "the worker's API")
            admin = FunctionsAdmin(url)
            admin.create({"tenant": "public", "namespace": "default", "name": name, "className": "exclaim.Exclaim",
                          "inputs": [src], "output": dst, "parallelism": parallelism}, str(EXAMPLES / "exclaim.py"))
            wait(lambda: admin.status("public", "default", name)["numRunning"] == parallelism, 30,
                 "the instances to run")
            collector = Collector(service_url, dst)
            producer = start_producer(service_url, src, n, rate)
            wait(lambda: collector.total() >= kill_at, 60, f"{kill_at} outputs")
            killed_at = collector.total()
            broker.kill()
            broker.wait()
            time.sleep(down_s)
            broker = start_broker(port, metrics_port, str(Path(tmp, "broker")))
            back = time.monotonic()
            producer.wait(120)
            try:
                wait(lambda: len(collector.counts) >= n, 60, "every output")
            except AssertionError:
                pass
            time.sleep(1.0)
            return Outcome("broker-kill", runtime, n, n - len(collector.counts),
                           sum(c - 1 for c in collector.counts.values()), killed_at,
                           collector.first_output_after(back))
        finally:
            if collector is not None:
                collector.close()
            for proc in (producer, worker, broker):
                if proc is not None:
                    stop(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("scenario", choices=["worker-kill", "broker-kill"])
    p.add_argument("--runtime", default="thread", choices=["thread", "process"])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--no-relay", action="store_true", help="clients reach pulsar-lite directly (B10 unfenced)")
    args = p.parse_args()
    for _ in range(args.runs):
        if args.scenario == "broker-kill":
            outcome = broker_kill(args.runtime)
        else:
            outcome = worker_kill(args.runtime, relay=not args.no_relay)
        print(json.dumps(asdict(outcome)), flush=True)


if __name__ == "__main__":
    main()
