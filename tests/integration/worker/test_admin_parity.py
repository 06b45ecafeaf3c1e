"""pulsar-admin parity: trigger, querystate/putstate, upload/download, localrun, produce/consume,
pulsar-admin's flags, unknown endpoints and flags reported as such."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid

import pytest
import requests

from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.cli.main import main
from tests.support.commands import CLI
from tests.support.scenario import EXAMPLES, wait_until

CLI = [*CLI]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def run_cli(capsys, *args) -> tuple[int, str, str]:
    try:
        rc = main(list(args))
    except SystemExit as exc:
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def create(admin, name: str, example: str, class_name: str, **fields) -> None:
    admin.create(
        {"tenant": "public", "namespace": "default", "name": name, "className": class_name, "inputs": [f"{name}-in"], **fields},
        str(EXAMPLES / example),
    )
    wait_until(lambda: admin.status("public", "default", name)["numRunning"] == 1, 30, f"{name} running")


def test_trigger_returns_the_output_of_the_value(admin, worker, capsys):
    name = unique("trig")
    create(admin, name, "exclaim.py", "exclaim.Exclaim", output=f"{name}-out")
    assert admin.trigger("public", "default", name, "hello") == b"hello!"
    rc, out, err = run_cli(capsys, "functions", "trigger", "--name", name, "--trigger-value", "cli", "--admin-url", worker.url)
    assert (rc, out) == (0, "cli!\n"), err
    with pytest.raises(AdminError, match="does not consume from topic") as e:
        admin.trigger("public", "default", name, "x", topic="elsewhere")
    assert e.value.status == 400


def test_querystate_and_putstate(admin, worker, capsys):
    name = unique("wc")
    create(admin, name, "word_count.py", "word_count.WordCount")
    assert admin.trigger("public", "default", name, "a b a") is None  # no output topic: sent only

    def counter_of_a():
        reply = requests.get(f"{worker.url}/admin/v3/functions/public/default/{name}/state/a")
        return reply.json() if reply.ok else None

    # The record's two increments land one after the other: wait for the second, then check none follows.
    wait_until(lambda: counter_of_a() == {"key": "a", "numberValue": 2}, 30, "the counter of 'a' at 2")
    wait_until(
        lambda: admin.get_state("public", "default", name, "b") == {"key": "b", "numberValue": 1}, 30, "the counter of 'b' at 1"
    )
    assert admin.get_state("public", "default", name, "a") == {"key": "a", "numberValue": 2}
    rc, out, _ = run_cli(
        capsys,
        "functions",
        "--admin-url",
        worker.url,
        "putstate",
        "--name",
        name,
        "--state",
        '{"key": "greeting", "stringValue": "hi"}',
    )
    assert rc == 0
    rc, out, _ = run_cli(capsys, "functions", "querystate", "--name", name, "--key", "greeting", "--admin-url", worker.url)
    assert json.loads(out) == {"key": "greeting", "stringValue": "hi"}
    admin.put_state("public", "default", name, {"key": "a", "numberValue": 10})
    assert admin.get_state("public", "default", name, "a")["numberValue"] == 10
    with pytest.raises(AdminError, match="key 'nope' doesn't exist") as e:
        admin.get_state("public", "default", name, "nope")
    assert e.value.status == 404
    with pytest.raises(AdminError, match="exactly one of") as e:
        admin.put_state("public", "default", name, {"key": "k"})
    assert e.value.status == 400


def test_upload_and_download(admin, worker, tmp_path, capsys):
    src = tmp_path / "pkg.py"
    src.write_text("x = 1\n")
    rc, _, err = run_cli(
        capsys, "functions", "upload", "--source-file", str(src), "--path", "team/pkg.py", "--admin-url", worker.url
    )
    assert rc == 0, err
    dst = tmp_path / "back.py"
    rc, _, err = run_cli(
        capsys, "functions", "download", "--path", "team/pkg.py", "--destination-file", str(dst), "--admin-url", worker.url
    )
    assert rc == 0 and dst.read_text() == "x = 1\n", err
    with pytest.raises(AdminError, match="not a relative path") as e:
        admin.upload(str(src), "../../escape.py")
    assert e.value.status == 400
    with pytest.raises(AdminError, match="no file uploaded") as e:
        admin.download("team/none.py")
    assert e.value.status == 404
    name = unique("code")
    create(admin, name, "exclaim.py", "exclaim.Exclaim")
    assert admin.download(function=("public", "default", name)) == (EXAMPLES / "exclaim.py").read_bytes()


def test_unknown_endpoint_is_not_function_not_found(worker):
    r = requests.get(f"{worker.url}/admin/v3/functions/public/default/f/nonsense/path")
    assert r.status_code == 404 and "endpoint not supported by this worker" in r.json()["reason"]
    r = requests.get(f"{worker.url}/admin/v3/functions/public/default/missing")
    assert r.status_code == 404 and "doesn't exist" in r.json()["reason"]
    r = requests.get(f"{worker.url}/admin/v3/functions/connectors")
    assert r.status_code == 404 and "endpoint not supported" in r.json()["reason"]


def test_url_part_is_refused(worker):
    form = {
        "functionConfig": (None, json.dumps({"className": "exclaim.Exclaim", "inputs": ["x"]})),
        "url": (None, "http://example.com/f.py"),
    }
    r = requests.post(f"{worker.url}/admin/v3/functions/public/default/{unique('url')}", files=form)
    assert r.status_code == 400 and "`url`" in r.json()["reason"]


def test_pulsar_admin_flags_reach_the_config(admin, worker, capsys):
    name = unique("flags")
    rc, _, err = run_cli(
        capsys,
        "functions",
        "create",
        "--name",
        name,
        "--py",
        str(EXAMPLES / "exclaim.py"),
        "--classname",
        "exclaim.Exclaim",
        "-i",
        f"{name}-in",
        "-o",
        f"{name}-out",
        "--cpu",
        "0.5",
        "--ram",
        "1000",
        "--disk",
        "2000",
        "--max-message-retries",
        "3",
        "--dead-letter-topic",
        f"{name}-dlq",
        "--subs-position",
        "Earliest",
        "--timeout-ms",
        "30000",
        "--auto-ack",
        "true",
        "--custom-serde-inputs",
        json.dumps({f"{name}-in": "serde.IdentitySerDe"}),
        "--admin-url",
        worker.url,
    )
    assert rc == 0, err
    got = admin.get("public", "default", name)
    assert got["resources"] == {"cpu": 0.5, "ram": 1000, "disk": 2000}
    assert (got["maxMessageRetries"], got["deadLetterTopic"]) == (3, f"persistent://public/default/{name}-dlq")
    assert (got["subscriptionPosition"], got["timeoutMs"], got["autoAck"]) == ("Earliest", 30000, True)
    assert got["customSerdeInputs"] == {f"persistent://public/default/{name}-in": "serde.IdentitySerDe"}
    rc, _, err = run_cli(
        capsys,
        "functions",
        "create",
        "--name",
        unique("w"),
        "--py",
        str(EXAMPLES / "exclaim.py"),
        "--classname",
        "exclaim.Exclaim",
        "-i",
        "x",
        "--window-length-count",
        "10",
        "--sliding-interval-count",
        "5",
        "--admin-url",
        worker.url,
    )
    assert rc == 2 and "windowConfig is not supported by this worker" in err
    rc, _, err = run_cli(capsys, "functions", "create", "--name", "n", "--no-such-flag")
    assert rc == 2 and "usage: pulsar-autoscale functions create" in err and "--no-such-flag" in err


def test_localrun_with_produce_and_consume(broker, tmp_path):
    """localrun runs a function in the foreground with no worker; produce and consume talk to the broker."""
    name = unique("local")
    url = ["--service-url", broker.service_url]
    local = subprocess.Popen(
        CLI
        + [
            "functions",
            "localrun",
            "--broker-service-url",
            broker.service_url,
            "--name",
            name,
            "--py",
            str(EXAMPLES / "exclaim.py"),
            "--classname",
            "exclaim.Exclaim",
            "-i",
            f"{name}-in",
            "-o",
            f"{name}-out",
            "--state-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert f"localrun public/default/{name}" in local.stdout.readline()
        consume = subprocess.Popen(
            CLI + ["consume", f"{name}-out", "-s", "check", "-n", "3", "-p", "Earliest", "--timeout", "30", *url],
            stdout=subprocess.PIPE,
            text=True,
        )
        wait_until(lambda: requests.get(broker.metrics_url).text.count(f"{name}-in") > 0, 30, "the function's subscription")
        produced = subprocess.run(
            CLI + ["produce", f"{name}-in", "-m", "a,b", "-n", "1", "-m", "c", *url], capture_output=True, text=True, timeout=60
        )
        assert "3 messages successfully produced" in produced.stdout, produced.stderr
        out, _ = consume.communicate(timeout=60)
        assert sorted(line.split("content:")[1] for line in out.splitlines() if "content:" in line) == ["a!", "b!", "c!"]
        local.send_signal(signal.SIGINT)
        out, err = local.communicate(timeout=60)
        assert local.returncode == 0, err
        assert "3 processed, 0 user exceptions" in out
    finally:
        local.kill()
