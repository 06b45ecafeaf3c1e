"""A real Apache Pulsar standalone (ApacheStandalone): every broker-facing behaviour is meant to hold on stock
Pulsar too, so this checks that the one-command broker gives what those tests need: the binary protocol, the
admin REST API, /metrics, the functions worker, and no orphaned JVM when the wrapper dies."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pulsar
import pytest
import requests

from pulsar_autoscale.broker.apache import ApacheStandalone
from pulsar_autoscale.broker.apache_dist import DEFAULT_VERSION, cache_root
from pulsar_autoscale.errors import BrokerError

REPO = Path(__file__).resolve().parents[2]
CACHED = (cache_root() / DEFAULT_VERSION / "dist" / "bin" / "pulsar").is_file()
pytestmark = pytest.mark.skipif(
    shutil.which("java") is None or (shutil.which("mvn") is None and not CACHED),
    reason="Apache Pulsar needs java, and mvn unless the distribution is cached",
)


def wait_until(what: str, check, timeout_s: float, every_s: float = 0.25):
    """check() until it returns something truthy; fails naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    pytest.fail(f"{what}: not within {timeout_s:.0f}s (last: {str(last)[:300]})")


@pytest.fixture(scope="module")
def broker(request, broker_kind):
    """The session's standalone of the --broker apache pass. The pass on pulsar-lite skips these tests rather than
    start a standalone of its own: `make test` runs both passes, and a second JVM would only repeat them."""
    _in_the_apache_pass(broker_kind)
    return request.getfixturevalue("session_broker")


def _in_the_apache_pass(broker_kind: str) -> None:
    if broker_kind != "apache":
        pytest.skip("a standalone's own behaviour: runs in the --broker apache pass")


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_functions_worker_takes_a_create_at_once(broker):
    """First in the module: right after start() returns, a create must not meet 503 "Leader not yet ready"."""
    name = topic_name("fn")
    config = {
        "tenant": "public",
        "namespace": "default",
        "name": name,
        "className": "exclaim.Exclaim",
        "inputs": [f"{name}-in"],
        "output": f"{name}-out",
        "runtime": "PYTHON",
        "parallelism": 1,
    }
    url = f"{broker.admin_url}/admin/v3/functions/public/default/{name}"
    code = (REPO / "functions" / "examples" / "exclaim.py").read_bytes()
    r = requests.post(
        url,
        files={
            "functionConfig": (None, json.dumps(config), "application/json"),
            "data": ("exclaim.py", code, "application/octet-stream"),
        },
        timeout=30,
    )
    assert r.status_code in (200, 204), f"{r.status_code} {r.text}"
    try:
        got = requests.get(url, timeout=10).json()
        assert got["className"] == "exclaim.Exclaim" and got["parallelism"] == 1
    finally:
        assert requests.delete(url, timeout=30).status_code in (200, 204)


def test_started_measured(broker):
    assert broker.pid is not None and Path(f"/proc/{broker.pid}/exe").resolve().name == "java"
    assert 0 < broker.start_s < broker.startup_timeout_s
    assert 100 < broker.rss_mb() < 4096


def test_produce_consume(broker):
    topic = f"persistent://public/default/{topic_name('pc')}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic)
        sent = [f"m{i}" for i in range(20)]
        for m in sent:
            producer.send(m.encode())
        got = []
        for _ in sent:
            msg = consumer.receive(timeout_millis=15000)
            got.append(msg.data().decode())
            consumer.acknowledge(msg)
        assert got == sent
    finally:
        client.close()


def test_backlog_in_admin_stats_and_metrics(broker):
    name = topic_name("bl")
    topic = f"persistent://public/default/{name}"
    client = pulsar.Client(broker.service_url, operation_timeout_seconds=30)
    try:
        client.subscribe(topic, "idle").close()  # a durable subscription that reads nothing
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(7):
            producer.send(b"x")
    finally:
        client.close()

    def backlog():
        r = requests.get(f"{broker.admin_url}/admin/v2/persistent/public/default/{name}/stats", timeout=5)
        return r.status_code == 200 and r.json()["subscriptions"]["idle"]["msgBacklog"] == 7 and r.json()

    wait_until("msgBacklog 7 in topic stats", backlog, 30)

    # Apache's name is the same as pulsar-lite's: pulsar_subscription_back_log{topic=..., subscription=...}
    def gauge():
        text = requests.get(broker.metrics_url, timeout=10).text
        lines = [
            ln
            for ln in text.splitlines()
            if ln.startswith("pulsar_subscription_back_log{") and f'topic="{topic}"' in ln and 'subscription="idle"' in ln
        ]
        return lines and float(lines[0].rsplit(" ", 1)[1]) == 7 and lines

    wait_until("pulsar_subscription_back_log 7 in /metrics", gauge, 3 * broker.stats_interval_s + 30, every_s=1)


def test_functions_worker_answers(broker):
    r = requests.get(f"{broker.admin_url}/admin/v3/functions/public/default", timeout=10)
    assert r.status_code == 200 and isinstance(r.json(), list)
    workers = requests.get(f"{broker.admin_url}/admin/v2/worker/cluster", timeout=10).json()
    assert [w["port"] for w in workers] == [broker.web_port]


def test_killed_wrapper_takes_the_jvm(tmp_path, broker_kind):
    """kill -9 of the Python process that started the standalone: the JVM gets SIGKILL too (parent-death signal)."""
    _in_the_apache_pass(broker_kind)
    code = (
        "import threading\n"
        "from pulsar_autoscale.broker.apache import ApacheStandalone\n"
        f"b = ApacheStandalone(data_dir={str(tmp_path)!r}, functions_worker=False).start()\n"
        "print(b.pid, flush=True)\n"
        "threading.Event().wait()\n"
    )
    wrapper = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        with selectors.DefaultSelector() as sel:  # epoll: select() refuses descriptors past 1024 in a long run
            sel.register(wrapper.stdout, selectors.EVENT_READ)
            ready = sel.select(150)
        line = wrapper.stdout.readline().strip() if ready else ""
        assert line.isdigit(), (
            f"the wrapper printed no JVM pid within 150s: {line!r} {wrapper.stderr.read() if wrapper.poll() is not None else ''}"
        )
        jvm = int(line)
        assert Path(f"/proc/{jvm}/exe").resolve().name == "java"
        os.kill(wrapper.pid, signal.SIGKILL)
        wrapper.wait(timeout=10)
        wait_until(f"JVM {jvm} gone after kill -9 of its wrapper", lambda: not Path(f"/proc/{jvm}").exists(), 20)
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def test_missing_java_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there: no java, no mvn
    with pytest.raises(BrokerError) as err:
        ApacheStandalone(data_dir=str(tmp_path / "d")).start()
    assert "`java`" in str(err.value) and "\n" not in str(err.value)

    script = Path(sys.executable).parent / "pulsar-autoscale"  # the installed command; its shebang is absolute
    cli = subprocess.run(
        [str(script), "broker", "--kind", "apache"],
        cwd=REPO,
        env={**os.environ, "PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2
    assert cli.stderr.strip().count("\n") == 0 and "`java`" in cli.stderr, cli.stderr
