"""Fault scenarios with real processes, killed by pid: used by the fault tests and, looped, by hand.

    .venv/bin/python -m tests.support.fault_scenarios worker-kill --runtime thread --runs 5
    .venv/bin/python -m tests.support.fault_scenarios broker-kill --runs 2
    .venv/bin/python -m tests.support.fault_scenarios broker-stop --pause 30 --runs 3
    .venv/bin/python -m tests.support.fault_scenarios broker-kill --broker apache

(--broker apache: an Apache Pulsar standalone of the scenario's own instead of pulsar-lite) prints one JSON line per run (lost, duplicates, seconds until outputs flow again).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pulsar
import requests

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.apache import ApacheStandalone
from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.netutil import free_port, wait_for_port
from tests.support.commands import CLI, worker_command
from tests.support.scenario import wait_until as wait

EXAMPLES = Path(__file__).resolve().parents[2] / "functions" / "examples"
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@dataclass
class Outcome:
    scenario: str
    runtime: str
    sent: int
    lost: int
    duplicates: int
    killed_at: int  # outputs seen when the fault struck
    recovery_s: float | None  # from the restart (or the broker's port open again) to the next new output
    status_seen: list[str] = field(default_factory=list)  # broker-stop: each change of `status` during the pause
    outage_s: float | None = None  # broker-kill: from the kill to the restarted broker's port open


class Collector:
    """Counts the function's outputs ("m<i>!": a bare number would be deserialized as an int) on a subscription of its own, created before any input."""

    def __init__(self, service_url: str, topic: str):
        self._client = pulsar.Client(service_url, logger=QUIET)
        self._consumer = self._client.subscribe(topic, "fault-collector", consumer_type=pulsar.ConsumerType.Shared)
        self._counts: dict[int, int] = {}
        self.times: list[float] = []
        self._lock = threading.Lock()
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
            with self._lock:
                self._counts[i] = self._counts.get(i, 0) + 1
                self.times.append(time.monotonic())
            self._consumer.acknowledge(msg)

    @property
    def counts(self) -> dict[int, int]:
        """A copy: iterating the live dict while the thread adds to it fails."""
        with self._lock:
            return dict(self._counts)

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


@contextmanager
def own_broker(kind: str = "lite", data_dir: str | None = None, keep_alive_s: int | None = None, **lite):
    """A broker of the scenario's own, to stop or kill by pid: pulsar-lite, or (kind "apache") an Apache Pulsar
    standalone without its functions worker (our worker runs the functions). keep_alive_s: how soon the broker
    drops a client that stopped answering (pulsar-lite adds its liveness timeout: `lite`'s liveness_timeout_s)."""
    if kind == "apache":
        props = {"keepAliveIntervalSeconds": keep_alive_s} if keep_alive_s else {}
        with ApacheStandalone(data_dir=data_dir, functions_worker=False, properties=props) as broker:
            yield broker
        return
    if keep_alive_s:
        lite["keep_alive_s"] = keep_alive_s
    with EmbeddedBroker(data_dir=data_dir, **lite) as broker:
        yield broker


def broker_pid(broker) -> int:
    """The pid that is the broker itself: pulsar-lite (not its relay or wrapper), or Apache Pulsar's JVM."""
    return broker.pid if isinstance(broker, ApacheStandalone) else broker.lite_pid


def start_producer(service_url: str, topic: str, n: int, rate: float) -> subprocess.Popen:
    """Inputs from a process of their own, as in production (send_timeout 0: it outlives a broker outage)."""
    return subprocess.Popen([sys.executable, "-c", PRODUCER, service_url, topic, str(n), str(rate)])


def start_worker(service_url: str, metrics_url: str, port: int, data_dir: str, runtime: str, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "ab")
    return subprocess.Popen(
        worker_command(service_url, metrics_url, str(port), data_dir, "--runtime", runtime),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def start_broker(port: int, metrics_port: int, data_dir: str, kind: str = "lite") -> subprocess.Popen:
    """`pulsar-autoscale broker [--kind apache]` as a process of its own (its children die with it); returns once
    ready, with `port_open_at` set: when its service port first accepted a connection (clients are served from
    then on; Apache Pulsar's standalone says ready seconds later, once its own functions worker leads). On Apache,
    metrics_port is the standalone's web port (its /metrics)."""
    errors = Path(f"{data_dir}.stderr")  # why a broker that never said ready gave up (its last lines)
    with errors.open("ab") as err:
        proc = subprocess.Popen(
            [
                *CLI,
                "broker",
                "--port",
                str(port),
                "--metrics-port",
                str(metrics_port),
                "--data-dir",
                data_dir,
                "--kind",
                kind,
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    wait_for_port("127.0.0.1", port, 180, alive=lambda: proc.poll() is None)
    proc.port_open_at = time.monotonic()
    line = proc.stdout.readline()
    if not line.startswith("apache pulsar" if kind == "apache" else "broker ready") or "ready" not in line:
        tail = "\n".join(errors.read_text(errors="replace").splitlines()[-30:])
        raise AssertionError(f"broker did not start: {line!r}; its stderr ends:\n{tail}")
    return proc


def stop(proc: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM, then SIGKILL after timeout_s: a process the caller started."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _reachable(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=0.5).ok
    except requests.RequestException:
        return False


def _deploy_exclaim(url: str, name: str, src: str, dst: str, parallelism: int) -> FunctionsAdmin:
    """exclaim.py at `parallelism` on the worker at `url`, once its API answers; returns once every instance runs."""
    wait(lambda: _reachable(url), 30, "the worker's API")
    admin = FunctionsAdmin(url)
    admin.create(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "exclaim.Exclaim",
            "inputs": [src],
            "output": dst,
            "parallelism": parallelism,
        },
        str(EXAMPLES / "exclaim.py"),
    )
    wait(lambda: admin.status("public", "default", name)["numRunning"] == parallelism, 30, "the instances to run")
    return admin


def worker_kill(
    runtime: str = "thread",
    n: int = 5000,
    rate: float = 500.0,
    kill_at: int = 2500,
    down_s: float = 2.0,
    parallelism: int = 3,
    relay: bool = True,
    kind: str = "lite",
    broker=None,
) -> Outcome:
    """The worker kill -9 scenario of docs/reliability.md: exclaim at parallelism 3, n messages at `rate` from a producer process,
    the worker killed with -9 at about `kill_at` outputs and restarted `down_s` later on the same
    port and data dir. relay=False: clients reach pulsar-lite directly (B10 unfenced, for comparison). `broker`: a
    running one to use (a test session's) instead of one of its own of `kind`; nothing here stops or kills it."""
    with (
        tempfile.TemporaryDirectory(prefix="fault-") as tmp,
        _given_or_own(broker, kind, **({} if kind == "apache" else {"relay": relay})) as broker,
    ):
        name = f"exclaim-{int(time.time() * 1000) % 10**8}"
        src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
        port, data_dir, log_path = free_port(), str(Path(tmp, "worker")), Path(tmp, "worker.log")
        worker = start_worker(broker.service_url, broker.metrics_url, port, data_dir, runtime, log_path)
        url = f"http://127.0.0.1:{port}"
        collector = None
        try:
            admin = _deploy_exclaim(url, name, src, dst, parallelism)
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
            return Outcome(
                "worker-kill",
                runtime,
                n,
                n - len(collector.counts),
                sum(c - 1 for c in collector.counts.values()),
                killed_at,
                collector.first_output_after(restarted),
            )
        finally:
            if collector is not None:
                collector.close()
            stop(worker)


def broker_kill(
    runtime: str = "thread",
    n: int = 5000,
    rate: float = 500.0,
    kill_at: int = 2500,
    down_s: float = 2.0,
    parallelism: int = 3,
    kind: str = "lite",
) -> Outcome:
    """The broker (`pulsar-autoscale broker`) killed with -9 at about `kill_at` outputs and restarted on
    its port and data dir `down_s` later; the worker and the producer stay up."""
    with tempfile.TemporaryDirectory(prefix="fault-") as tmp:
        port, metrics_port, worker_port = free_port(), free_port(), free_port()
        service_url, metrics_url = f"pulsar://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics"
        name = f"exclaim-{int(time.time() * 1000) % 10**8}"
        src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
        broker = start_broker(port, metrics_port, str(Path(tmp, "broker")), kind)
        worker = start_worker(service_url, metrics_url, worker_port, str(Path(tmp, "worker")), runtime, Path(tmp, "worker.log"))
        url, collector, producer = f"http://127.0.0.1:{worker_port}", None, None
        try:
            _deploy_exclaim(url, name, src, dst, parallelism)
            collector = Collector(service_url, dst)
            producer = start_producer(service_url, src, n, rate)
            wait(lambda: collector.total() >= kill_at, 60, f"{kill_at} outputs")
            killed_at, killed = collector.total(), time.monotonic()
            broker.kill()
            broker.wait()
            time.sleep(down_s)
            broker = start_broker(port, metrics_port, str(Path(tmp, "broker")), kind)
            back = broker.port_open_at
            producer.wait(120)
            try:
                wait(lambda: len(collector.counts) >= n, 60, "every output")
            except AssertionError:
                pass
            time.sleep(1.0)
            return Outcome(
                "broker-kill",
                runtime,
                n,
                n - len(collector.counts),
                sum(c - 1 for c in collector.counts.values()),
                killed_at,
                collector.first_output_after(back),
                outage_s=back - killed,
            )
        finally:
            if collector is not None:
                collector.close()
            for proc in (producer, worker, broker):
                if proc is not None:
                    stop(proc)


@contextmanager
def _given_or_own(broker, kind: str, **lite):
    if broker is not None:
        yield broker
        return
    with own_broker(kind, **lite) as own:
        yield own


def _status_line(admin: FunctionsAdmin, name: str) -> str:
    """numRunning and the instances' distinct errors, or why the worker did not answer."""
    try:
        st = admin.status("public", "default", name)
    except Exception as exc:  # the worker not answering is a finding too
        return f"status failed: {exc}"
    errors = sorted({i["status"].get("error") or "" for i in st["instances"]} - {""})
    return f"numRunning={st['numRunning']}" + (f" error={errors}" if errors else "")


def broker_stop(
    runtime: str = "thread",
    n: int = 10000,
    rate: float = 400.0,
    stop_at: int = 2000,
    pause_s: float = 30.0,
    parallelism: int = 3,
    kind: str = "lite",
) -> Outcome:
    """The broker (pulsar-lite itself, not the relay or the wrapper; or Apache Pulsar's JVM) stopped with SIGSTOP at about
    `stop_at` outputs and continued `pause_s` later; the worker and the producer stay up. Samples the
    worker's `status` every 0.5 s during the pause and records each change (seconds after SIGSTOP)."""
    with tempfile.TemporaryDirectory(prefix="fault-") as tmp, own_broker(kind) as broker:
        name = f"exclaim-{int(time.time() * 1000) % 10**8}"
        src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
        port, log_path = free_port(), Path(tmp, "worker.log")
        worker = start_worker(broker.service_url, broker.metrics_url, port, str(Path(tmp, "worker")), runtime, log_path)
        url, collector, producer, lite_pid = f"http://127.0.0.1:{port}", None, None, None
        try:
            admin = _deploy_exclaim(url, name, src, dst, parallelism)
            collector = Collector(broker.service_url, dst)
            producer = start_producer(broker.service_url, src, n, rate)
            wait(lambda: collector.total() >= stop_at, 60, f"{stop_at} outputs")
            stopped_at, lite_pid = collector.total(), broker_pid(broker)
            os.kill(lite_pid, signal.SIGSTOP)
            stopped, seen = time.monotonic(), []
            while (elapsed := time.monotonic() - stopped) < pause_s:
                line = _status_line(admin, name)
                if not seen or seen[-1].split(" ", 1)[1] != line:
                    seen.append(f"{elapsed:.1f}s {line}")
                time.sleep(min(0.5, max(pause_s - (time.monotonic() - stopped), 0)))
            os.kill(lite_pid, signal.SIGCONT)
            lite_pid, resumed = None, time.monotonic()
            wait(lambda: collector.first_output_after(resumed) is not None, 120, "outputs after SIGCONT")
            seen.append(f"+{time.monotonic() - stopped:.1f}s after SIGCONT {_status_line(admin, name)}")
            producer.wait(120)
            try:
                wait(lambda: len(collector.counts) >= n, 60, "every output")
            except AssertionError:
                pass
            time.sleep(1.0)  # late duplicates
            seen.append(f"at the end {_status_line(admin, name)}")
            return Outcome(
                "broker-stop",
                runtime,
                n,
                n - len(collector.counts),
                sum(c - 1 for c in collector.counts.values()),
                stopped_at,
                collector.first_output_after(resumed),
                seen,
            )
        finally:
            if lite_pid is not None:  # never leave the broker we stopped frozen
                os.kill(lite_pid, signal.SIGCONT)
            if collector is not None:
                collector.close()
            for proc in (producer, worker):
                if proc is not None:
                    stop(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("scenario", choices=["worker-kill", "broker-kill", "broker-stop"])
    p.add_argument("--runtime", default="thread", choices=["thread", "process"])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--pause", type=float, default=30.0, help="broker-stop: seconds between SIGSTOP and SIGCONT")
    p.add_argument("--no-relay", action="store_true", help="clients reach pulsar-lite directly (B10 unfenced)")
    p.add_argument("--broker", default="lite", choices=["lite", "apache"], help="the broker each run starts")
    args = p.parse_args()
    for _ in range(args.runs):
        if args.scenario == "broker-kill":
            outcome = broker_kill(args.runtime, kind=args.broker)
        elif args.scenario == "broker-stop":
            outcome = broker_stop(args.runtime, pause_s=args.pause, kind=args.broker)
        else:
            outcome = worker_kill(args.runtime, relay=not args.no_relay, kind=args.broker)
        print(json.dumps(asdict(outcome)), flush=True)


if __name__ == "__main__":
    main()
