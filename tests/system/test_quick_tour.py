"""The README's quick tour, run verbatim from a fresh clone twice in a row (the second run must not find the
first's functions), then its secured variant from docs/security.md: it sends messages, shows outputs, a
controller scales the slow function out, what the comments promise is what the output says, and the checkout
stays clean (`git status`). Only the ports and the scratch directory are substituted, so the run cannot
collide with anything else on the machine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pulsar_autoscale.netutil import free_port
from tests.support.doc_blocks import ROOT, block
from tests.support.doc_blocks import run_script as run


def substituted(script: str, ports: dict[str, str], scratch: Path, config: Path) -> str:
    for old, new in ports.items():
        script = script.replace(old, new)
    script = script.replace("/tmp/pa-tour", str(scratch))
    # The tour relies on the default admin and service URLs: those ports are substituted too.
    script = script.replace(
        "pulsar-autoscale functions ", f"pulsar-autoscale functions --admin-url http://127.0.0.1:{ports['6750']} "
    )
    for command in ("produce", "consume"):
        script = script.replace(
            f"pulsar-autoscale {command} ", f"pulsar-autoscale {command} --service-url pulsar://127.0.0.1:{ports['6650']} "
        )
    return script.replace("examples/tour-controller.yaml", str(config))


def check_comments(script: str, output: str, ports: dict[str, str]) -> None:
    """Every figure a comment of the block promises, against the output (or the command it sits on)."""
    fn, start, target = re.search(r"scaled (\S+) (\d+) -> (\d+)", script).groups()
    steps = [(int(a), int(b)) for a, b in re.findall(rf"scaled {re.escape(fn)} (\d+) -> (\d+) ", output)]
    # The policy answers the service rate it measures: on a machine loaded by other work one instance more or
    # less than the comment's figure is the same behaviour; the status and the gauge must then say that number.
    # The fast check may act on the load's first seconds, before the rate is all in: then a second step follows.
    out = [b for _, b in steps[: next((i for i, (a, b) in enumerate(steps) if b < a), len(steps))]]
    assert steps and steps[0][0] == int(start) and len(out) <= 2 and abs(max(out) - int(target)) <= 1, (
        f"the comment promises 'scaled {fn} {start} -> {target}', or in two steps:\n{output}"
    )
    # The wait for the scale-up must accept every figure the check below does, or it outwaits the load and the
    # status shows the scale-down that follows it.
    low, high = re.search(r'grep -qE \'"numInstances": \[(\d)-(\d)\],\'', script).groups()
    assert (int(low), int(high)) == (int(target) - 1, int(target) + 1), "the wait accepts the target +- 1"
    instances = re.search(r'# "numInstances": (\d+)', script).group(1)
    shown = re.findall(r'"numInstances": (\d+),', output)
    assert instances == target and shown and abs(int(shown[-1]) - int(target)) <= 1, output
    got = int(shown[-1])
    gauge = re.search(r"target_parallelism\S*\s+# \.\.\. ([\d.]+)", script).group(1)
    # The gauge is read after the status: it says the status's number, or the target of a step the controller's
    # log shows it took in between (the second of two steps).
    later = out[out.index(got) + 1 :] if got in out else []
    read = re.search(r'^pulsar_autoscale_target_parallelism\{function="public/default/slow"\} (\d+)\.0$', output, re.M)
    assert read and int(read.group(1)) in {got, *later}, f"the gauge should say {got} (or a later step's {later}):\n{output}"
    assert float(gauge) == int(instances)
    n, rate, secs, rate_c, per_instance = map(
        float, re.search(r"-n (\d+) --rate (\d+) &\s+# (\d+) s at (\d+) msg/s; 1 instance does (\d+)/s", script).groups()
    )
    service_ms = float(re.search(r'"service_ms": (\d+)', script).group(1))
    assert (n / rate, rate) == (secs, rate_c) and 1000 / service_ms == per_instance
    tries, pause = re.search(r"seq (\d+)\); do pulsar-autoscale functions .*?list.*?sleep ([\d.]+)", script).groups()
    bound = re.search(r"# at most (\d+) s", script).group(1)
    assert int(tries) * float(pause) == float(bound)
    if "/status on :" in script:
        assert f"status on http://127.0.0.1:{ports['9091']}/status" in output, output


def _tour(tmp_path: Path):
    """A fresh clone, the tour's ports, its controller config with them, and the environment the tour runs in."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    ports = {p: str(free_port()) for p in ("6650", "8080", "6750", "9091")}
    config = (ROOT / "examples" / "tour-controller.yaml").read_text()
    for old, new in ports.items():
        config = config.replace(old, new)
    (tmp_path / "tour-controller.yaml").write_text(config)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "XDG_DATA_HOME": str(tmp_path / "xdg")}
    return clone, ports, env


def _check_run(script: str, output: str, ports: dict[str, str], scratch: Path, tmp_path: Path) -> None:
    contents = sorted(line.split("content:")[1] for line in output.splitlines() if "content:" in line)
    assert contents == ["functions!", "hello!", "pulsar!"], output
    assert "again!" in output.splitlines()
    assert f"data in {scratch / 'worker'}" in output
    assert str(tmp_path / "xdg" / "pulsar-autoscale" / "controller" / "decisions.jsonl") in output
    check_comments(script, output, ports)


@pytest.mark.slow
def test_quick_tour_from_a_fresh_clone_twice_then_secured(tmp_path):
    clone, ports, env = _tour(tmp_path)
    scratch = tmp_path / "pa-tour"
    script = substituted(block("README.md", "## Quick tour"), ports, scratch, tmp_path / "tour-controller.yaml")
    for attempt in (1, 2):
        output = run(script, clone, env, tmp_path / f"run{attempt}")
        assert "already exists" not in output, f"run {attempt} found an earlier run's functions:\n{output}"
        _check_run(script, output, ports, scratch, tmp_path)

    secured = substituted(block("docs/security.md", "## The quick tour, secured"), ports, scratch, Path("unused"))
    output = run(secured, clone, env, tmp_path / "secured")
    assert "authentication on (tokens)" in output and "-> 401: authentication required" in output, output
    check_comments(secured, output, ports)

    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True).stdout
    assert status == "", f"the tour left files in the checkout:\n{status}"


@pytest.mark.slow
def test_quick_tour_on_apache_pulsar(tmp_path, broker_kind):
    """The README's tour with the broker lines docs/apache-pulsar.md gives: an Apache Pulsar standalone of its own
    (the Apache pass only: pulsar-lite's pass runs the tour as the README has it)."""
    if broker_kind != "apache":
        pytest.skip("the tour on Apache Pulsar runs on the Apache pass (--broker apache)")
    clone, ports, env = _tour(tmp_path)
    scratch = tmp_path / "pa-tour"
    tour = block("README.md", "## Quick tour").splitlines(keepends=True)
    start = next(i for i, line in enumerate(tour) if line.startswith("pulsar-autoscale broker "))
    apache = block("docs/apache-pulsar.md", "## The quick tour on Apache Pulsar").splitlines(keepends=True)
    assert len(apache) == 2 and tour[start + 1].startswith("for i in"), "the doc replaces the broker and its wait"
    script = substituted("".join(tour[:start] + apache + tour[start + 2 :]), ports, scratch, tmp_path / "tour-controller.yaml")
    output = run(script, clone, env, tmp_path / "apache", timeout_s=420)
    assert "apache pulsar" in output and " ready: service-url pulsar://127.0.0.1:" + ports["6650"] in output, output
    _check_run(script, output, ports, scratch, tmp_path)
