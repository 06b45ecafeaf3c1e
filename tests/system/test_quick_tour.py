"""The README's quick tour, run verbatim from a fresh clone: it sends messages, shows outputs, a controller
scales the slow function out, and the checkout stays clean (`git status`). Only the ports and the
scratch directory are substituted, so the run cannot collide with anything else on the machine."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pulsar_autoscale.netutil import free_port

ROOT = Path(__file__).resolve().parents[2]


def tour_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quick tour"):]
    return re.search(r"```\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_quick_tour_from_a_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    script = tour_block()
    ports = {p: str(free_port()) for p in ("6650", "8080", "6750", "9091")}
    for old, new in ports.items():
        script = script.replace(old, new)
    script = script.replace("/tmp/pa-tour", str(tmp_path / "pa-tour"))
    # The tour relies on the default admin and service URLs: those ports are substituted too.
    script = script.replace("pulsar-autoscale functions ",
                            f"pulsar-autoscale functions --admin-url http://127.0.0.1:{ports['6750']} ")
    for command in ("produce", "consume"):
        script = script.replace(f"pulsar-autoscale {command} ",
                                f"pulsar-autoscale {command} --service-url pulsar://127.0.0.1:{ports['6650']} ")
    config = (clone / "examples" / "tour-controller.yaml").read_text()
    for old, new in ports.items():
        config = config.replace(old, new)
    (tmp_path / "tour-controller.yaml").write_text(config)
    script = script.replace("examples/tour-controller.yaml", str(tmp_path / "tour-controller.yaml"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "XDG_DATA_HOME": str(tmp_path / "xdg")}
    # Its own process group: whatever the tour started in the background goes when the test ends.
    # Output to files: background jobs would hold a pipe open after the shell is done.
    with open(tmp_path / "out", "w") as out_f, open(tmp_path / "err", "w") as err_f:
        proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=clone, env=env, stdout=out_f, stderr=err_f,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=240)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert rc == 0, f"tour failed:\n{out}\n{err[-3000:]}"
    contents = sorted(line.split("content:")[1] for line in out.splitlines() if "content:" in line)
    assert contents == ["functions!", "hello!", "pulsar!"], out
    assert "again!" in out.splitlines()
    instances = int(re.search(r'"numInstances": (\d+)', out).group(1))
    assert instances >= 2, f"the controller did not scale the slow function out:\n{out}"
    assert f"data in {tmp_path / 'pa-tour' / 'worker'}" in out
    assert str(tmp_path / "xdg" / "pulsar-autoscale" / "controller" / "decisions.jsonl") in out
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True,
                            check=True).stdout
    assert status == "", f"the tour left files in the checkout:\n{status}"
