"""The command line: the broker command starts and stops cleanly; `functions` speaks to a worker
with pulsar-admin's flags; errors are one line, not a traceback."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.netutil import free_port, wait_for_port
from tests.support.commands import CLI
from tests.support.scenario import EXAMPLES

CLI = [*CLI]


def cli(*args, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=60)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_broker_command_serves_and_stops_on_sigterm(tmp_path):
    port, metrics = free_port(), free_port()
    proc = subprocess.Popen(
        CLI + ["broker", "--port", str(port), "--metrics-port", str(metrics), "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert f"pulsar://127.0.0.1:{port}" in line, line
        assert wait_for_port("127.0.0.1", metrics, 10), "metrics port not listening"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def worker(broker, tmp_path_factory):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path_factory.mktemp("w")), metrics_url=broker.metrics_url) as w:
        yield w


def test_functions_commands_round_trip(worker):
    url = ["--admin-url", worker.url]
    cli(
        "functions",
        *url,
        "create",
        "--name",
        "cli-ex",
        "--py",
        str(EXAMPLES / "exclaim.py"),
        "--classname",
        "exclaim.Exclaim",
        "--inputs",
        "cli-in",
        "--output",
        "cli-out",
        "--user-config",
        '{"k": "v"}',
    )
    assert json.loads(cli("functions", *url, "list").stdout) == ["cli-ex"]
    got = json.loads(cli("functions", *url, "get", "--name", "cli-ex").stdout)
    assert got["userConfig"] == {"k": "v"} and got["output"] == "persistent://public/default/cli-out"
    cli("functions", *url, "update", "--fqfn", "public/default/cli-ex", "--parallelism", "2")
    status = json.loads(cli("functions", *url, "status", "--name", "cli-ex").stdout)
    assert status["numInstances"] == 2
    cli("functions", *url, "delete", "--name", "cli-ex")
    assert json.loads(cli("functions", *url, "list").stdout) == []


def test_cli_errors_are_one_line(worker):
    proc = cli("functions", "--admin-url", worker.url, "update", "--name", "ghost", "--parallelism", "2", check=False)
    assert proc.returncode == 2
    assert "doesn't exist" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("functions", "--admin-url", "http://127.0.0.1:1", "list", check=False)
    assert "cannot reach the functions admin API" in proc.stderr and "Traceback" not in proc.stderr


def test_stages_and_burst_commands_name_the_problem(worker, tmp_path):
    url = ["--admin-url", worker.url]
    assert json.loads(cli("stages", *url, "list").stdout) == []
    for args, needle in (
        (("stages", *url, "get", "--name", "ghost"), "Stateful stage public/default/ghost doesn't exist"),
        (("stages", *url, "create", "--stage-config-file", str(tmp_path / "none.yaml")), "cannot read"),
        (("functions", *url, "burst", "--name", "ghost", "--messages", "10"), "doesn't exist"),
    ):
        proc = cli(*args, check=False)
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    bad = tmp_path / "stage.yaml"
    bad.write_text("name: counts\ninput: in\noutput: out\nwindow: 1 fortnight\n")
    proc = cli("stages", *url, "create", "--stage-config-file", str(bad), check=False)
    assert proc.returncode == 2 and "window" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_worker_refuses_a_web_service_url_that_is_no_admin_address(broker, tmp_path):
    for bad in ("pulsar://127.0.0.1:6650", "http://", "http://broker:8080/admin/v2"):
        proc = cli(
            "worker",
            "--service-url",
            broker.service_url,
            "--port",
            "0",
            "--data-dir",
            str(tmp_path),
            "--web-service-url",
            bad,
            check=False,
        )
        assert proc.returncode == 2 and "--web-service-url" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_worker_on_a_port_in_use_says_so_in_one_line(broker, tmp_path):
    """The operator's second worker on the first one's port: exit 2 with one line naming the port, before it
    connects or joins (before, a traceback and a C++ abort, its cluster membership left behind)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = cli(
            "worker",
            "--service-url",
            broker.service_url,
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path),
            "--cluster",
            "c-port",
            check=False,
        )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: cannot serve the worker's REST API on 127.0.0.1:{port}: Address already in use")
    ), proc.stderr
    assert "Traceback" not in proc.stderr and "Fatal Python error" not in proc.stderr, proc.stderr
