"""A controller leader stopped with SIGSTOP (hung, connection open): the broker drops it after its
keep-alive lapses, a standby takes over with a higher epoch, and the old leader learns it lost the
lock as soon as it wakes (its actions then carry a stale epoch: the worker answers 409)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from tests.support.fault_scenarios import own_broker

CHILD = str(Path(__file__).parents[2] / "support" / "leader_child.py")


class _Elector:
    def __init__(self, service_url: str, topic: str, name: str):
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, service_url, topic, name], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.events: list[tuple[str, ...]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(("LEADER", "LOST")):
                self.events.append(tuple(line.split()))

    def wait(self, kind: str, timeout_s: float) -> tuple[str, ...] | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [e for e in self.events if e[0] == kind]
            if found:
                return found[0]
            time.sleep(0.05)
        return None

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


def test_a_hung_leader_is_replaced_and_fenced(tmp_path, broker_kind):
    # keep-alive 2 s (+ liveness 2 s on pulsar-lite): the same behaviour as the defaults, several times faster
    with own_broker(broker_kind, data_dir=str(tmp_path), keep_alive_s=2, liveness_timeout_s=2) as broker:
        topic = f"persistent://public/default/lock-{uuid.uuid4().hex[:8]}"
        old = _Elector(broker.service_url, topic, "old")
        standby = None
        try:
            first = old.wait("LEADER", 20)
            assert first, "no leader elected"
            standby = _Elector(broker.service_url, topic, "standby")
            time.sleep(2)
            assert standby.wait("LEADER", 0) is None, "two leaders at once"
            stopped = time.time()
            os.kill(old.proc.pid, signal.SIGSTOP)
            second = standby.wait("LEADER", 30)
            assert second, "the standby never took over from a hung leader"
            takeover_s = float(second[2]) - stopped
            os.kill(old.proc.pid, signal.SIGCONT)
            lost = old.wait("LOST", 10)
            print(f"\ntakeover {takeover_s:.1f} s; epochs {first[1]} -> {second[1]}; old leader lost its term on waking")
            assert lost, "the old leader did not notice it lost the lock after waking"
            assert int(second[1]) > int(first[1])
            assert takeover_s < 15
        finally:
            old.close()
            if standby is not None:
                standby.close()
