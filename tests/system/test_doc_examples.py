"""The docs' whole examples, run verbatim as a reader would type them, against real brokers: the keyed-state
example (docs/keyed-state.md) with a worker on the session's broker, and the 3-worker cluster on one machine
(docs/cluster.md) with its own broker, ports and directory substituted. Each figure a comment promises is
checked against the output of its command."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from pulsar_autoscale.netutil import free_port
from tests.support.doc_blocks import ROOT, block, run_script
from tests.support.scenario import wait_until

BIN = Path(sys.executable).parent


def promised(script: str, output: str) -> None:
    """Each `grep -c` line of the block printed the count its comment gives, in order."""
    counts = re.findall(r"grep -c .*?#\s*(\d+)", script)
    printed = [line for line in output.splitlines() if re.fullmatch(r"\d+", line)]
    assert printed == counts, f"the comments promise counts {counts}, the block printed {printed}:\n{output}"


@pytest.fixture
def worker_on_broker(broker, tmp_path):
    """`pulsar-autoscale worker` on the session's broker, as the quick tour starts one."""
    port = free_port()
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(BIN / "pulsar-autoscale"),
                "worker",
                "--service-url",
                broker.service_url,
                "--metrics-url",
                broker.metrics_url,
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "worker"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def healthy() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    try:
        wait_until(healthy, 60, lambda: f"the worker to answer; its log:\n{log.read_text()[-2000:]}")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.slow
def test_keyed_state_example(broker, worker_on_broker, tmp_path):
    script = block("docs/keyed-state.md", "## Example")
    cwd = tmp_path / "reader"
    cwd.mkdir()
    (cwd / "functions").symlink_to(ROOT / "functions")
    env = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "PULSAR_AUTOSCALE_ADMIN_URL": worker_on_broker,
        "PULSAR_AUTOSCALE_SERVICE_URL": broker.service_url,
    }
    output = run_script(script, cwd, env, tmp_path / "run", timeout_s=300)
    promised(script, output)
    values = [int(v) for v in re.findall(r'"numberValue": (\d+)', output)]
    assert values == [30, 40], f"querystate of user-1 should print 30, then 40 after the scale-out:\n{output}"


def free_port_prefix() -> str:
    """A prefix P with P1, P2 and P3 free: the block numbers its workers' ports 675$n."""
    for _ in range(100):
        prefix = str(free_port())[:4]
        if len(prefix) == 4 and all(_bindable(int(f"{prefix}{n}")) for n in (1, 2, 3)):
            return prefix
    raise AssertionError("no three free ports with a common prefix")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.slow
def test_one_machine_cluster_example(tmp_path):
    script = block("docs/cluster.md", "## A 3-worker cluster on one machine")
    prefix = free_port_prefix()
    script = re.sub(r"675(?=\$n|\d)", prefix, script)
    for old in ("6650", "8080"):
        script = script.replace(old, str(free_port()))
    script = script.replace("/tmp/pa-cluster", str(tmp_path / "pa-cluster"))
    cwd = tmp_path / "reader"
    cwd.mkdir()
    (cwd / "functions").symlink_to(ROOT / "functions")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "XDG_DATA_HOME": str(tmp_path / "xdg")}
    output = run_script(script, cwd, env, tmp_path / "run", timeout_s=300)
    promised(script, output)
    assert output.count('"workerId"') >= 3 + 1 + 2, output  # get-cluster, its leader, after the kill
    assert '"numRunning": 3' in output and "after!" in output.splitlines(), output
