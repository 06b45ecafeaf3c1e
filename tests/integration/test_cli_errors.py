"""An operator's mistakes end in one line: a broker that is not there (within a bounded time, without the
Pulsar client's retry lines), a reader that stops reading (`| head -1`), and a command that fails (exit
non-zero). Connection options work after the action too, against a real worker."""

from __future__ import annotations

import json
import subprocess
import time

from pulsar_autoscale.netutil import free_port
from tests.support.commands import CLI
from tests.support.scenario import EXAMPLES

CLI = [*CLI]


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=60)


def test_produce_without_a_broker_fails_in_one_line_within_seconds():
    url = f"pulsar://127.0.0.1:{free_port()}"
    start = time.monotonic()
    proc = cli("produce", "t", "-m", "x", "--service-url", url)
    took = time.monotonic() - start
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and url in lines[0], proc.stderr
    assert "is it running" in lines[0] and "Traceback" not in proc.stderr
    assert took < 25, f"took {took:.0f} s"


def test_a_reader_that_goes_away_ends_the_command_quietly(worker):
    for argv in (["functions", "list", "--admin-url", worker.url], ["tokens", "create-secret-key"]):
        proc = subprocess.Popen(CLI + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()  # as `| head -1` does once it has its line
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) in (0, 1), err
        assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_connection_options_after_the_action_and_a_failing_create_exits_non_zero(worker, tmp_path):
    create = [
        "functions",
        "create",
        "--name",
        "grammar-ex",
        "--py",
        str(EXAMPLES / "exclaim.py"),
        "--classname",
        "exclaim.Exclaim",
        "--inputs",
        "grammar-in",
        "--admin-url",
        worker.url,
    ]
    assert cli(*create).returncode == 0
    try:
        again = cli(*create)
        assert again.returncode != 0
        assert again.stderr.startswith("error: ") and len(again.stderr.strip().splitlines()) == 1, again.stderr
        listed = cli("functions", "list", "--admin-url", worker.url, "--tls-allow-insecure-connection")
        assert json.loads(listed.stdout) == ["grammar-ex"], listed.stderr
        assert json.loads(cli("functions-worker", "get-cluster", "--admin-url", worker.url).stdout)
    finally:
        cli("functions", "delete", "--name", "grammar-ex", "--admin-url", worker.url)
