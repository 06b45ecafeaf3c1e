"""Leader election through the broker: one leader at a time, fast takeover after kill -9, and a
deposed leader's late action refused by the worker (epoch fencing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pulsar
import pytest

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.leader import LeaderElector
from tests.support.scenario import EXAMPLES, lead, wait_until

HOLDER = textwrap.dedent("""
    import sys, time
    from pulsar_autoscale.leader import LeaderElector
    e = LeaderElector(sys.argv[1], sys.argv[2], identity="holder")
    term, deadline = None, time.monotonic() + 30
    while term is None and time.monotonic() < deadline:   # one try can time out on a loaded machine
        term = e.try_acquire()
    print("LEADER", term.epoch if term else 0, flush=True)
    time.sleep(600)
""")


def test_one_leader_and_epochs_increase(broker, topic):
    a = LeaderElector(broker.service_url, topic, identity="a")
    b = LeaderElector(broker.service_url, topic, identity="b")
    term_a = lead(a)
    assert term_a.epoch == 1
    assert b.try_acquire() is None, "two leaders at once"
    assert a.check()
    a.release()
    term_b = wait_until(b.try_acquire, 10, "b to take over after a released")
    assert term_b.epoch == 2
    b.release()


class _EpochTopicTimesOut(LeaderElector):
    """A replica whose first read of the epoch topic times out, as it does on a broker slowed by load."""

    failures = 1

    def _latest(self, client):
        if self.failures:
            self.failures -= 1
            raise pulsar.Timeout("the epoch topic did not answer")
        return super()._latest(client)


def test_a_replica_that_cannot_record_its_term_lets_the_lock_go(broker, topic):
    a = _EpochTopicTimesOut(broker.service_url, topic, identity="a")
    assert a.try_acquire() is None and not a.is_leader()  # no exception out of the attempt, no term
    b = LeaderElector(broker.service_url, topic, identity="b")
    term_b = wait_until(b.try_acquire, 10, "b to take the lock that a could not use")
    assert term_b.epoch == 1
    b.release()
    assert wait_until(a.try_acquire, 10, "a to lead on a later try").epoch == 2
    a.release()


def test_standby_takes_over_after_kill_9(broker, topic):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, broker.service_url, topic], stdout=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline()
        assert line.startswith("LEADER 1"), f"holder did not become leader: {line!r}"
        standby = LeaderElector(broker.service_url, topic, identity="standby")
        assert standby.try_acquire() is None
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        term = wait_until(standby.try_acquire, 30, "standby to lead after kill -9 of the leader", interval_s=0.01)
        takeover_s = time.monotonic() - killed
        print(f"\ntakeover after kill -9: {takeover_s:.3f}s, epoch {term.epoch}")
        assert term.epoch == 2
        standby.release()
    finally:
        holder.kill()
        holder.wait()


def test_worker_refuses_a_deposed_leaders_epoch(broker, tmp_path):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path), metrics_url=broker.metrics_url) as w:
        admin = FunctionsAdmin(w.url)
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": "fenced",
                "className": "exclaim.Exclaim",
                "inputs": ["fenced-in"],
            },
            str(EXAMPLES / "exclaim.py"),
        )
        admin.set_parallelism("public", "default", "fenced", 2, epoch=3)  # the new leader acts
        with pytest.raises(AdminError, match="stale leader epoch 2 < 3") as stale:
            admin.set_parallelism("public", "default", "fenced", 1, epoch=2)  # the old one wakes up late
        assert stale.value.status == 409
        assert admin.get("public", "default", "fenced")["parallelism"] == 2
