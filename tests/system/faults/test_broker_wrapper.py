"""`pulsar-autoscale broker`: a killed wrapper takes pulsar-lite with it; a broker that cannot start fails
loudly (docs/reliability.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from pulsar_autoscale.netutil import free_port, wait_for_port
from tests.support.commands import CLI

# Apache Pulsar's wrapper (`pulsar-autoscale broker --kind apache`) has its kill test in test_apache_standalone.py
pytestmark = pytest.mark.lite_only("pulsar-lite's own wrapper, relay and data-dir lock")


def _start(data_dir: str, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, "broker", "--port", str(port), "--data-dir", data_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie still answers kill(0): it is gone for our purpose
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split()[2] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_a_killed_wrapper_takes_pulsar_lite_down_and_a_restart_works(tmp_path):
    port = free_port()
    wrapper = _start(str(tmp_path), port)
    try:
        assert wrapper.stdout.readline().startswith("broker ready"), wrapper.stderr.read()
        children = _children(wrapper.pid)
        assert len(children) == 2, f"expected pulsar-lite and its relay under the wrapper: {children}"
        wrapper.send_signal(signal.SIGKILL)
        wrapper.wait()
        assert all(_gone(pid, 5) for pid in children), "pulsar-lite or the relay outlived its killed wrapper"
        again = _start(str(tmp_path), port)  # same port, same data dir: nothing holds them
        try:
            assert again.stdout.readline().startswith("broker ready"), again.stderr.read()
            assert wait_for_port("127.0.0.1", port, 5)
        finally:
            again.terminate()
            assert again.wait(15) == 0
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()


def test_a_broker_whose_data_dir_is_locked_fails_with_a_message(tmp_path):
    first = _start(str(tmp_path), free_port())
    try:
        assert first.stdout.readline().startswith("broker ready")
        second = _start(str(tmp_path), free_port())
        out, err = second.communicate(timeout=60)
        assert second.returncode != 0
        assert "broker ready" not in out
        assert "locked by another broker" in err, err
    finally:
        first.terminate()
        first.wait(15)
