"""Stock mode end to end on a real Apache Pulsar: a Python function deployed through our CLI to the standalone's
own functions worker (process runtime, our venv's python), a backlog produced, and our controller scaling it
up through Apache's REST API alone; every message must come out. The stock adapter's calls are also checked
against the live API and its answers against Pulsar's published documents (the fake cluster's contract)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pulsar
import pytest

from pulsar_autoscale.admin.stock import StockPulsarAdmin
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.loop import Controller
from tests.support.contracts.fake_cluster import Contract
from tests.support.contracts.published import broker_doc, functions_doc
from tests.support.controller import base
from tests.support.scenario import lead, wait_until

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "pulsar-autoscale"
N = 400
SERVICE_MS = 50  # 20 messages/s per instance: one instance needs 20 s for the backlog


@pytest.fixture(autouse=True)
def _apache_only(broker_kind):
    if broker_kind != "apache":
        pytest.skip("stock mode needs Apache Pulsar's functions worker: run with --broker apache")


def deploy(broker, name: str, parallelism: int = 1) -> None:
    """`pulsar-autoscale functions create` against the standalone's own functions worker."""
    cmd = [
        str(CLI),
        "functions",
        "create",
        "--admin-url",
        broker.admin_url,
        "--name",
        name,
        "--py",
        str(REPO / "functions" / "examples" / "sleepy.py"),
        "--classname",
        "sleepy.Sleepy",
        "-i",
        f"persistent://public/default/{name}-in",
        "-o",
        f"persistent://public/default/{name}-out",
        "--parallelism",
        str(parallelism),
        "--user-config",
        json.dumps({"service_ms": SERVICE_MS, "dist": "deterministic"}),
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"functions create failed: {done.stdout}{done.stderr}"


def running(admin: StockPulsarAdmin, name: str) -> int:
    try:
        return admin.status("public", "default", name).get("numRunning", 0)
    except Exception:  # noqa: BLE001 - the worker answers 4xx/5xx while it (re)schedules instances
        return 0


# The stock worker starts a Python process per instance; beside the pass's other standalone, on 2 cores, one start
# was seen to take over 90 s. The failure names the last status the worker gave.
START_S = 180


def wait_running(admin: StockPulsarAdmin, name: str, n: int, what: str) -> None:
    def status() -> str:
        try:
            return str(admin.status("public", "default", name))[:1500]
        except Exception as exc:  # noqa: BLE001 - what the worker answered is the message
            return f"{type(exc).__name__}: {exc}"

    wait_until(lambda: running(admin, name) == n, START_S, lambda: f"{what}; last status: {status()}")


def test_controller_scales_a_stock_function_up_under_load_and_loses_nothing(broker, tmp_path):
    assert not broker.python_missing, f"the process runtime's python lacks {broker.python_missing}"
    name = f"sleepy-{uuid.uuid4().hex[:6]}"
    fqfn = f"public/default/{name}"
    admin = StockPulsarAdmin(broker.admin_url, timeout_s=30)
    deploy(broker, name)
    wait_running(admin, name, 1, "the instance running (python process runtime)")
    client = pulsar.Client(
        broker.service_url, operation_timeout_seconds=30, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    try:
        out = client.subscribe(
            f"persistent://public/default/{name}-out", "check", initial_position=pulsar.InitialPosition.Earliest
        )
        producer = client.create_producer(
            f"persistent://public/default/{name}-in", batching_enabled=False, block_if_queue_full=True
        )
        for i in range(N):
            producer.send_async(str(i).encode(), None)
        producer.flush()
        config = ControllerConfig.from_mapping({**base(broker, tmp_path), "mode": "stock", "admin_url": broker.admin_url})
        controller = Controller(config)
        lead(controller.elector)
        t0 = time.monotonic()
        try:
            decision = None
            while decision is None and time.monotonic() - t0 < 30:
                it = controller.iterate()
                decision = next((d for d in it.decisions if d["function"] == fqfn and d["applied"]), None)
                if decision is None:
                    time.sleep(2)
        finally:
            controller.elector.release()
        assert decision is not None, "the controller did not scale the function under a backlog of 400"
        assert decision["old"] == 1 and decision["new"] > 1, decision
        assert "restart_cost_s" in decision  # stock mode records what the restart costs
        assert admin.get("public", "default", name)["parallelism"] == decision["new"]
        wait_running(admin, name, decision["new"], "the new instances running")
        counts: dict[bytes, int] = {}
        deadline = time.monotonic() + 120
        while len(counts) < N and time.monotonic() < deadline:
            try:
                msg = out.receive(2000)
            except pulsar.Timeout:
                continue
            counts[msg.data()] = counts.get(msg.data(), 0) + 1
            out.acknowledge(msg)
        lost = N - len(counts)
        duplicates = sum(c - 1 for c in counts.values())
        print(
            f"\nstock mode on apache: parallelism {decision['old']} -> {decision['new']} after "
            f"{decision['time'] - it.time + time.monotonic() - t0:.0f}s of control, reason {decision['reason']!r}, "
            f"restart_cost_s {decision['restart_cost_s']}, lost {lost}, duplicates {duplicates}"
        )
        assert lost == 0, f"lost {lost} of {N} (e.g. {sorted(set(str(i).encode() for i in range(N)) - set(counts))[:5]})"
    finally:
        client.close()
        subprocess.run(
            [str(CLI), "functions", "delete", "--admin-url", broker.admin_url, "--name", name],
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )


def test_stock_adapter_against_the_live_rest_api(broker):
    """What the contract tests check on the fake cluster, on the real one: each call the adapter makes is served,
    and the answers match Pulsar's published documents (with the errata tests/support/contracts apply)."""
    name = f"sleepy-{uuid.uuid4().hex[:6]}"
    admin = StockPulsarAdmin(broker.admin_url, timeout_s=30)
    deploy(broker, name, parallelism=2)
    try:
        wait_running(admin, name, 2, "two instances running")
        assert name in admin.list("public", "default")
        config = admin.get("public", "default", name)
        assert config["parallelism"] == 2 and config["className"] == "sleepy.Sleepy"
        functions = Contract(functions_doc(), "functions")
        stats = admin.stats("public", "default", name)
        status = admin.status("public", "default", name)
        problems = (
            functions.check({"$ref": "#/definitions/FunctionConfig"}, config, "get")
            + functions.check({"$ref": "#/definitions/FunctionStatus"}, status, "status")
            + functions.check({"$ref": "#/definitions/FunctionStatsImpl"}, stats, "stats")
        )
        # Where the live server differs from the published documents: userConfig values are any JSON (published
        # as objects), and an instance that has processed nothing reports null latencies and times
        errata = [p for p in problems if "(at userConfig/" in p or p.split(": ", 1)[1].startswith("None is not of type")]
        print(f"\nlive answers outside the published documents (errata): {errata}")
        assert [p for p in problems if p not in errata] == [], problems
        counters, reported = admin.counters_and_running("public", "default", name, time.time())
        assert reported == 2 and counters.processed == 0
        topic = f"persistent://public/default/{name}-in"
        assert admin.partitions(topic) == 0
        wait_until(
            lambda: admin.topic_stats(topic).backlog_of(f"public/default/{name}") is not None,
            30,
            "the function's subscription in the topic stats",
        )
        raw = admin._call("GET", admin._topic_url(topic, "stats"))
        topic_problems = Contract(broker_doc(), "broker").check({"$ref": "#/definitions/TopicStats"}, raw, "topic stats")
        print(f"topic stats outside the published document: {topic_problems}")
        # chunkedMessageRate: published as an integer, served as a rate (0.0)
        assert [p for p in topic_problems if "(at subscriptions/" not in p or "chunkedMessageRate" not in p] == [], topic_problems
        assert admin.max_useful_parallelism(config) is None  # Shared: no cap
        admin.set_parallelism("public", "default", name, 2)  # "Update contains no change": a no-op
        admin.set_parallelism("public", "default", name, 3)
        assert admin.get("public", "default", name)["parallelism"] == 3
        wait_running(admin, name, 3, "three instances running after the update")
        cost = admin.restart_cost_s()
        assert cost is None or cost > 0
        print(f"\nrestart_cost_s from the worker's metrics: {cost}")
    finally:
        subprocess.run(
            [str(CLI), "functions", "delete", "--admin-url", broker.admin_url, "--name", name],
            cwd=REPO,
            capture_output=True,
            timeout=60,
        )


def test_a_batched_backlog_reads_in_messages(broker):
    """Apache's msgBacklog counts entries: 100 messages sent in batches of 10 are a backlog of 10. The adapter
    scales it by the subscription's consumers' avgMessagesPerEntry; an unbatched topic stays exact."""
    admin = StockPulsarAdmin(broker.admin_url, timeout_s=30)
    name = uuid.uuid4().hex[:8]
    c = pulsar.Client(broker.service_url)
    readings = {}
    try:
        for batched in (True, False):
            topic = f"persistent://public/default/backlog-{name}-{'batched' if batched else 'single'}"
            consumer = c.subscribe(topic, "sub", receiver_queue_size=1)
            producer = c.create_producer(
                topic, batching_enabled=batched, batching_max_messages=10, batching_max_publish_delay_ms=1000
            )
            for i in range(100):
                producer.send_async(f"m{i}".encode(), None)
            producer.flush()
            consumer.receive(10_000)  # a dispatch gives the consumer its messages-per-entry figure; nothing acked
            wait_until(
                lambda t=topic: admin.topic_stats(t).backlog_of("sub") == 100,
                30,
                lambda t=topic, b=batched: (
                    f"batched={b}: a backlog of 100 messages, read {admin.topic_stats(t).backlog_of('sub')}"
                ),
            )
            raw = admin._call("GET", admin._topic_url(topic, "stats"))
            readings[batched] = raw["subscriptions"]["sub"]["msgBacklog"]
    finally:
        c.close()
    assert readings == {True: 10, False: 100}, f"the broker's own msgBacklog (entries): {readings}"
