"""End-to-end scenarios shared by tests (which assert on them) and bench/ (which reports them)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pulsar

from pulsar_autoscale.admin.client import FunctionsAdmin

EXAMPLES = Path(__file__).resolve().parents[2] / "functions" / "examples"
KEYED_COUNT = EXAMPLES / "keyed_count.py"


def keyed_count(name: str, src: str, **fields) -> dict:
    """The FunctionConfig of the keyed count example (functions/examples/keyed_count.py) in public/default:
    keyedState, EFFECTIVELY_ONCE, from the earliest record; `fields` adds to or overrides it."""
    return {
        "tenant": "public",
        "namespace": "default",
        "name": name,
        "className": "keyed_count.KeyedCount",
        "inputs": [src],
        "keyedState": True,
        "processingGuarantees": "EFFECTIVELY_ONCE",
        "subscriptionPosition": "Earliest",
        **fields,
    }


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.02):
    """Poll predicate until it returns a truthy value; fail with `what` after timeout_s. A predicate that raises
    LookupError (a status view without the instance or key yet, in the middle of a change) has not happened
    yet; the last such error is in the timeout's message. Any other exception ends the wait."""
    deadline = time.monotonic() + timeout_s
    missing: LookupError | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except LookupError as exc:
            missing, value = exc, None
        if value:
            return value
        time.sleep(interval_s)
    last = f" (last: {type(missing).__name__}: {missing})" if missing is not None else ""
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what() if callable(what) else what}{last}")


class LiteStall(AssertionError):
    """A wait that ran out while the worker's stall fence reported its input dead on pulsar-lite (B12, in the
    function's status): the broker holds the backlog and dispatches none of it, whatever the consumer does
    (docs/dev/pulsar-lite-defects.md). Tests expect it through `lite_defect(raises=LiteStall)`, never on Apache."""


def stall_verdict(status: dict) -> str:
    """The B12 failure an instance of this function status reports ("" when none does)."""
    errors = (i["status"].get("error") or "" for i in status.get("instances", []))
    return next((e for e in errors if e.startswith("stalled: pulsar-lite B12")), "")


def lead(elector, timeout_s: float = 30):
    """Make a lone elector leader. One try can fail on a loaded machine (the lock client's subscribe has a
    1 s operation timeout), so tests that only need leadership retry until the lock is theirs."""
    return wait_until(elector.try_acquire, timeout_s, f"{elector.identity} to take the free leader lock", interval_s=0.1)


def keyed_settled(view: dict, groups: dict[str, int]) -> bool:
    """A keyedState status view (FunctionsAdmin.keyed_state) with every group where `groups` says and no migration
    under way: a poll asks for the view once, since each status call gathers every worker's view."""
    return view.get("groupsPerInstance") == groups and not view.get("migrating")


class OutputCollector:
    """Consumes a topic in the background and counts every payload, so duplicates and losses show."""

    def __init__(self, client: pulsar.Client, topic: str):
        self._counts: dict[bytes, int] = {}
        self._properties: list[dict] = []
        self._times: list[float] = []  # time.monotonic() of each arrival (gaps in processing)
        self._lags_ms: list[int] = []  # each arrival's wall-clock ms after its event time (end-to-end latency)
        # Shared, not the default Exclusive: pulsar-lite duplicates deliveries on Exclusive (B1).
        self._consumer = client.subscribe(
            topic,
            f"collector-{uuid.uuid4().hex[:8]}",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Earliest,
        )
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                msg = self._consumer.receive(100)
            except pulsar.Timeout:
                continue
            except pulsar.AlreadyClosed:  # the test closed the client first: nothing more can arrive
                return
            with self._lock:
                self._counts[msg.data()] = self._counts.get(msg.data(), 0) + 1
                self._properties.append(msg.properties())
                self._times.append(time.monotonic())
                self._lags_ms.append(int(time.time() * 1000) - msg.event_timestamp())
            self._consumer.acknowledge(msg)

    # Readers get copies: a test iterating the live dict while the thread adds to it fails with "dictionary
    # changed size during iteration".
    @property
    def counts(self) -> dict[bytes, int]:
        """Each payload seen, with how many times."""
        with self._lock:
            return dict(self._counts)

    @property
    def properties(self) -> list[dict]:
        with self._lock:
            return list(self._properties)

    @property
    def times(self) -> list[float]:
        with self._lock:
            return list(self._times)

    @property
    def lags_ms(self) -> list[int]:
        with self._lock:
            return list(self._lags_ms)

    def distinct(self) -> int:
        with self._lock:
            return len(self._counts)

    def duplicates(self) -> int:
        with self._lock:
            return sum(c - 1 for c in self._counts.values())

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


@dataclass
class ScalingResult:
    runtime: str
    messages: int
    lost: int
    duplicates: int
    steps: list[int]
    scale_out_latency_ms: dict[int, float] = field(default_factory=dict)  # target -> first message after PUT
    instance0_restarts: int = 0
    instance0_start_changed: bool = False
    seconds: float = 0.0


def run_scaling(
    service_url: str,
    admin_url: str,
    runtime: str,
    messages: int = 5000,
    steps: tuple[int, ...] = (4, 8, 2, 1),
    rate: float = 1000.0,
    service_ms: float = 2.0,
    timeout_s: float = 120.0,
) -> ScalingResult:
    """Produce `messages` at `rate`/s through a sleepy function while PUTting each parallelism in `steps`."""
    admin = FunctionsAdmin(admin_url)
    name = f"scale-{runtime}-{uuid.uuid4().hex[:6]}"
    src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    collector = OutputCollector(client, dst)
    admin.create(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "sleepy.Sleepy",
            "inputs": [src],
            "output": dst,
            "parallelism": 1,
            "instanceRuntime": runtime,
            "userConfig": {"service_ms": service_ms, "dist": "deterministic"},
        },
        str(EXAMPLES / "sleepy.py"),
    )
    started = time.monotonic()

    def status():
        return admin.status("public", "default", name)

    wait_until(lambda: status()["numRunning"] == 1, 30, f"{name} instance 0 running")
    start0 = status()["instances"][0]["status"]["instanceStartTimeMs"]
    producer = client.create_producer(src, batching_enabled=True, batching_max_publish_delay_ms=5, block_if_queue_full=True)

    def produce():
        t0 = time.monotonic()
        for i in range(messages):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            producer.send_async(str(i).encode(), None)
        producer.flush()

    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    result = ScalingResult(runtime=runtime, messages=messages, lost=0, duplicates=0, steps=list(steps))
    current = 1
    period = messages / rate / (len(steps) + 1)
    for target in steps:
        time.sleep(period)  # the load schedule itself, not synchronisation
        admin.set_parallelism("public", "default", name, target)
        put_ms = time.time() * 1000
        if target > current:
            first = wait_until(
                lambda: min((s["status"].get("firstProcessedTimeMs") or 0 for s in status()["instances"][current:]), default=0),
                60,
                f"new instances of {name} to process a message",
            )
            result.scale_out_latency_ms[target] = max(first - put_ms, 0.0)
        current = target
    sender.join(timeout_s)
    try:
        wait_until(
            lambda: collector.distinct() >= messages,
            timeout_s,
            lambda: (
                f"all {messages} outputs of {name} (got {collector.distinct()} distinct; "
                f"function stats {admin.stats('public', 'default', name)['autoscale']})"
            ),
        )
    except AssertionError as exc:
        verdict = stall_verdict(status())
        if verdict:
            raise LiteStall(f"{exc}; the worker reports: {verdict}") from exc
        raise
    final = status()["instances"][0]["status"]
    result.lost = messages - collector.distinct()
    result.duplicates = collector.duplicates()
    result.instance0_restarts = final["numRestarts"]
    result.instance0_start_changed = final["instanceStartTimeMs"] != start0
    result.seconds = time.monotonic() - started
    admin.delete("public", "default", name)
    collector.close()
    producer.close()
    client.close()
    return result


_KEYED_LOAD = """
import signal, sys, time
done = []
signal.signal(signal.SIGUSR1, lambda *_: done.append(True))
import pulsar
url, topic, n, keys, rate, batched = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), sys.argv[6] == "1"
c = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
batching = {"batching_max_publish_delay_ms": 2} if batched else {"batching_enabled": False}
p = c.create_producer(topic, block_if_queue_full=True, send_timeout_millis=0, **batching)
t0 = time.monotonic()
sent = 0
while sent < n and not (done and sent % keys == 0):
    delay = t0 + sent / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    p.send_async(b"x", None, partition_key="k%d" % (sent % keys))
    sent += 1
# Ignored from here: at exit Python resets a handled signal to its default action (which ends the process), so a
# finish() that came as the last record went out would kill it before it reported what it sent.
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
p.flush()
c.close()
print(sent, flush=True)
"""


class KeyedLoad(subprocess.Popen):
    """A keyed load's process; `finish` ends it early, after a whole round of keys, so every key has as many
    records: a test under load sends for as long as its changes take, not for a fixed time."""

    def finish(self, timeout_s: float) -> int:
        """Stop sending after the current round; the number of records sent (all of them if it had ended)."""
        if self.poll() is None:
            self.send_signal(signal.SIGUSR1)
        out, _ = self.communicate(timeout=timeout_s)
        assert self.returncode == 0, f"the keyed load exited {self.returncode}"
        return int(out.split()[-1])


def start_keyed_load(service_url: str, topic: str, n: int, keys: int, rate: float, batched: bool) -> KeyedLoad:
    """`n` records keyed k0..k{keys-1} in turn at `rate`/s, from a process of their own (a fault test kills workers,
    not its load)."""
    return KeyedLoad(
        [sys.executable, "-c", _KEYED_LOAD, service_url, topic, str(n), str(keys), str(rate), "1" if batched else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
