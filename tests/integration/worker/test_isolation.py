"""Isolation of user code: code is validated in a child process, put in place only
once valid, a function cannot take the worker down or hold its API, and status tells the truth."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests

from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.functions.api.server import WorkerServer
from tests.support.scenario import EXAMPLES, wait_until

HANGS = (
    "import threading\nfrom pulsar import Function\n\nclass Hang(Function):\n"
    "    def process(self, input, context):\n        threading.Event().wait()\n"
)
EXITS = "import os\nos._exit(1)\n"


@pytest.fixture(scope="module")
def server(broker, tmp_path_factory):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path_factory.mktemp("iso")), metrics_url=broker.metrics_url) as w:
        yield w


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def url(server, name: str, suffix: str = "", tenant: str = "public", namespace: str = "default") -> str:
    return f"{server.url}/admin/v3/functions/{tenant}/{namespace}/{name}{suffix}"


def send(
    server, method: str, name: str, cfg: dict | None = None, code: tuple[str, str | bytes] | None = None, timeout: float = 60
):
    files = {"functionConfig": (None, json.dumps(cfg or {}))}
    if code:
        files["data"] = code
    return requests.request(method, url(server, name), files=files, timeout=timeout)


def fn_config(name: str, class_name: str, **extra) -> dict:
    return {"tenant": "public", "namespace": "default", "name": name, "className": class_name, "inputs": [f"{name}-in"], **extra}


def exclaim(server, name: str, **extra):
    return send(
        server, "POST", name, fn_config(name, "exclaim.Exclaim", **extra), ("exclaim.py", (EXAMPLES / "exclaim.py").read_bytes())
    )


def status(server, name: str) -> dict:
    return requests.get(url(server, name, "/status"), timeout=10).json()


def healthy(server) -> bool:
    return requests.get(server.url + "/healthz", timeout=5).status_code == 200


def fn_dir(server, name: str) -> Path:
    return server.worker.data_dir / "functions" / "public" / "default" / name


# ---- validation in a child process ------------------------------------------------------------------


def test_code_that_exits_at_import_is_refused_and_leaves_nothing(server):
    name = unique("exits")
    resp = send(server, "POST", name, fn_config(name, "exits.F"), ("exits.py", EXITS))
    assert resp.status_code == 400, resp.text
    assert "exit code 1 while being imported" in resp.json()["reason"]
    assert healthy(server)
    assert not fn_dir(server, name).exists()
    assert requests.get(url(server, name), timeout=5).status_code == 404


def test_refused_update_keeps_the_good_code(server):
    name = unique("keep")
    assert exclaim(server, name).status_code == 204
    code_path = Path(server.worker._functions[f"public/default/{name}"].code_path)
    before = code_path.read_bytes()
    for bad in ("def broken(:\n", EXITS):
        resp = send(server, "PUT", name, {}, ("exclaim.py", bad))
        assert resp.status_code == 400, resp.text
        assert code_path.read_bytes() == before
        assert server.worker._functions[f"public/default/{name}"].code_path == str(code_path)
    assert sorted(p.name for p in (fn_dir(server, name) / "code").iterdir()) == [code_path.parent.name]


def test_a_good_update_replaces_the_code(server):
    name = unique("repl")
    assert exclaim(server, name).status_code == 204
    old = Path(server.worker._functions[f"public/default/{name}"].code_path)
    code = b"from pulsar import Function\n\nclass Exclaim(Function):\n    def process(self, i, c):\n        return i + '?'\n"
    assert send(server, "PUT", name, {}, ("exclaim.py", code)).status_code == 204
    new = Path(server.worker._functions[f"public/default/{name}"].code_path)
    assert new.read_bytes() == code and not old.exists()
    wait_until(lambda: status(server, name)["numRunning"] == 1, 20, "the updated function to run")


def test_slow_import_does_not_block_the_api(server):
    name = unique("slow")
    code = "import time\ntime.sleep(4)\n\ndef f(x):\n    return x\n"
    result = {}
    creator = threading.Thread(
        target=lambda: result.update(resp=send(server, "POST", name, fn_config(name, "slow.f"), ("slow.py", code)))
    )
    creator.start()
    time.sleep(0.5)  # the create is importing the code in its child now
    started = time.monotonic()
    assert healthy(server)
    assert requests.get(url(server, "", "").rstrip("/"), timeout=5).status_code == 200
    assert time.monotonic() - started < 1.0
    creator.join(60)
    assert result["resp"].status_code == 204, result["resp"].text


def test_import_past_the_timeout_is_refused(server):
    server.worker.validate_timeout_s = 1.0
    try:
        name = unique("slower")
        code = "import time\ntime.sleep(30)\n\ndef f(x):\n    return x\n"
        started = time.monotonic()
        resp = send(server, "POST", name, fn_config(name, "slower.f"), ("slower.py", code))
        assert resp.status_code == 400 and "did not finish within 1 s" in resp.json()["reason"]
        assert time.monotonic() - started < 10
        assert not fn_dir(server, name).exists()
    finally:
        server.worker.validate_timeout_s = 30.0


@pytest.mark.parametrize(
    "case, cfg, code, needle",
    [
        ("os-system", {"className": "os.system"}, None, "allowed installed package"),
        ("subprocess", {"className": "subprocess.getoutput"}, None, "allowed installed package"),
        ("etc-passwd", {"className": "passwd.x", "py": "/etc/passwd"}, None, "py may only name uploaded code"),
        ("host-py", {"className": "exclaim.Exclaim", "py": str(EXAMPLES / "exclaim.py")}, None, "py may only name uploaded code"),
        ("imported-builtin", {"className": "evil.system"}, ("evil.py", "from os import system\n"), "is not defined in"),
        (
            "not-a-function-class",
            {"className": "evil.C"},
            ("evil.py", "class C:\n    def process(self, x):\n        return x\n"),
            "does not derive",
        ),
    ],
)
def test_entry_point_rule(server, case, cfg, code, needle):
    name = unique(case)
    resp = send(server, "POST", name, {**fn_config(name, "x.y"), **cfg}, code)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["reason"]
    assert not fn_dir(server, name).exists()


# ---- no request waits on user code -----------------------------------------------------------------


def test_hanging_process_does_not_hold_delete_or_scale_in(server, client):
    server.worker.drain_timeout_s = 1.0
    server.worker.stall_after_s = 1.0
    try:
        name = unique("hang")
        assert send(server, "POST", name, fn_config(name, "hang.Hang", parallelism=2), ("hang.py", HANGS)).status_code == 204
        wait_until(lambda: status(server, name)["numRunning"] == 2, 20, "2 running instances")
        producer = client.create_producer(f"persistent://public/default/{name}-in")

        def both_stalled() -> bool:
            # one message more each time: an instance whose consumer joined after the first ones were dispatched
            # (to the other, which prefetches) still gets one
            producer.send(b"x")
            return status(server, name)["numRunning"] == 0

        wait_until(both_stalled, 30, "both instances reported stalled", interval_s=0.25)
        producer.close()
        errors = {i["status"]["error"] for i in status(server, name)["instances"]}
        assert all(e.startswith("stalled:") for e in errors), errors

        started = time.monotonic()
        resp = send(server, "PUT", name, {"parallelism": 1})
        assert resp.status_code == 204 and time.monotonic() - started < 2.0, resp.text
        wait_until(lambda: status(server, name)["autoscale"]["abandonedInstances"] == 1, 10, "one abandoned drain")

        other = unique("other")  # another function is served meanwhile
        assert exclaim(server, other).status_code == 204

        started = time.monotonic()
        assert requests.delete(url(server, name), timeout=10).status_code == 204
        assert time.monotonic() - started < 2.0
        assert requests.get(url(server, name), timeout=5).status_code == 404
        wait_until(lambda: not any((server.worker.data_dir / "deleted").iterdir()), 10, "the deleted files removed")
    finally:
        server.worker.drain_timeout_s = 30.0
        server.worker.stall_after_s = 30.0


# ---- a worker restarts whatever its functions' code does ---------------------------------------------


def test_restart_with_code_that_exits_at_import(broker, tmp_path):
    data = tmp_path / "worker"
    name = unique("restored")
    with WorkerServer(broker.service_url, data_dir=str(data), metrics_url=broker.metrics_url) as w:
        assert exclaim(w, name).status_code == 204
        assert send(w, "PUT", name, {}, ("exclaim.py", EXITS)).status_code == 400
    with WorkerServer(broker.service_url, data_dir=str(data), metrics_url=broker.metrics_url) as w:
        wait_until(lambda: status(w, name)["numRunning"] == 1, 20, "the good code restored and running")
        saved = json.loads((fn_dir(w, name) / "config.json").read_text())
        Path(saved["code_path"]).write_text(EXITS)  # changed on disk behind the worker's back
    with WorkerServer(broker.service_url, data_dir=str(data), metrics_url=broker.metrics_url) as w:
        st = status(w, name)
        assert st["numRunning"] == 0 and "exit code 1 while being imported" in st["autoscale"]["failure"]
        assert "exit code 1" in st["instances"][0]["status"]["error"]
        assert healthy(w)
        resp = requests.post(url(w, name, "/restart"), timeout=10)
        assert resp.status_code == 400 and "cannot start" in resp.json()["reason"]
        assert exclaim(w, name).status_code == 400  # exists (failed): update it instead
        assert send(w, "PUT", name, {}, ("exclaim.py", (EXAMPLES / "exclaim.py").read_bytes())).status_code == 204
        wait_until(lambda: status(w, name)["numRunning"] == 1, 20, "the repaired function running")


# ---- honest errors: 4xx, never 500 -----------------------------------------------------------------


@pytest.mark.parametrize("body", ["[1]", "null", '"text"'])
def test_json_body_that_is_not_an_object(server, body):
    resp = requests.post(url(server, unique("body")), data=body, headers={"Content-Type": "application/json"}, timeout=10)
    assert resp.status_code == 400 and "must be an object" in resp.json()["reason"], resp.text


@pytest.mark.parametrize(
    "method, path, expected",
    [
        ("POST", "/admin/v3/functions/public/default/" + "n" * 256, 400),
        ("POST", "/admin/v3/functions/public/default/%2E%2E", 400),
        ("GET", "/admin/v3/functions/no-such-tenant/no-such-ns", 200),
        ("GET", "/admin/v3/functions/no-such-tenant/no-such-ns/f/status", 404),
        ("GET", "/admin/v3/functions/public/default/f/-1/status", 404),
        ("GET", "/admin/v3/functions/public/default/f/abc/stats", 404),
        ("PATCH", "/admin/v3/functions/public/default/f", 405),
        ("POST", "/admin/v3/functions/public/default/f/burst", 400),
    ],
)
def test_bad_requests_are_4xx(server, method, path, expected):
    files = (
        {
            "functionConfig": (None, json.dumps({"className": "exclaim.Exclaim", "inputs": ["a"]})),
            "data": ("exclaim.py", (EXAMPLES / "exclaim.py").read_bytes()),
        }
        if method == "POST"
        else None
    )
    resp = requests.request(method, server.url + path, files=files, timeout=10)
    assert resp.status_code == expected, resp.text
    if expected >= 400:
        assert "reason" in resp.json()
        assert str(server.worker.data_dir) not in resp.text


def test_burst_with_bad_numbers(server):
    name = unique("burst")
    assert exclaim(server, name).status_code == 204
    resp = requests.post(url(server, name, "/burst"), json={"messages": "many"}, timeout=10)
    assert resp.status_code == 400 and "messages must be a positive integer" in resp.json()["reason"]


# ---- honest status: a broker that is gone --------------------------------------------------------------


@pytest.mark.slow
def test_status_says_not_running_while_the_broker_is_down(tmp_path):
    b = EmbeddedBroker(data_dir=str(tmp_path / "broker")).start()
    try:
        with WorkerServer(b.service_url, data_dir=str(tmp_path / "worker"), metrics_url=b.metrics_url) as w:
            name = unique("outage")
            assert exclaim(w, name).status_code == 204
            wait_until(lambda: status(w, name)["numRunning"] == 1, 20, "running before the outage")
            os.kill(b._proc.pid, signal.SIGKILL)  # the broker this test started
            b._proc.wait(10)
            st = wait_until(lambda: (s := status(w, name))["numRunning"] == 0 and s, 15, "running: false once the broker is gone")
            assert "not connected to the broker" in st["instances"][0]["status"]["error"]
            assert healthy(w)
            b.stop()  # its relay (pulsar_autoscale.broker.relay) still holds the port
            b = EmbeddedBroker(port=b.port, metrics_port=b.metrics_port, data_dir=b.data_dir).start()
            wait_until(lambda: status(w, name)["numRunning"] == 1, 60, "running again once the broker is back")
    finally:
        b.stop()
