"""A worker that joins a cluster while its broker does not answer (SIGSTOP of the test's own broker, by pid: the
relay, or on Apache Pulsar the stopped JVM's sockets, keep the connection open, so every request times out)
tries again (functions/cluster/join.py): it joins once the broker answers, and after 3 tries it exits (2)
with a one-line error naming the cluster instead of a traceback from the Pulsar client (seen once under a CPU
hog: create_reader TimeOut, then a traceback)."""

from __future__ import annotations

import os
import signal

import pytest

from pulsar_autoscale.functions.cluster.join import JOIN_TRIES
from tests.support.cluster_harness import WorkerCluster
from tests.support.fault_scenarios import broker_pid, own_broker
from tests.support.scenario import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def stopped_broker(tmp_path, broker_kind):
    """A broker of the test's own (of the --broker kind), stopped; it continues when the test ends (or when the
    test says so)."""
    with own_broker(broker_kind, data_dir=str(tmp_path / "broker")) as broker:
        os.kill(broker_pid(broker), signal.SIGSTOP)
        try:
            yield broker
        finally:
            os.kill(broker_pid(broker), signal.SIGCONT)


def _cluster(broker, tmp_path) -> WorkerCluster:
    # --broker-kind: the kind is not read from /metrics, which a stopped broker does not serve either
    kind = "pulsar-lite" if hasattr(broker, "lite_pid") else "apache"
    return WorkerCluster(broker.service_url, broker.metrics_url, tmp_path, n=0, extra_args=("--broker-kind", kind))


def test_a_join_that_times_out_is_tried_again_and_succeeds(stopped_broker, tmp_path):
    cluster = _cluster(stopped_broker, tmp_path)
    with cluster:
        w = cluster.add()
        wait_until(
            lambda: f"joining again (2 of {JOIN_TRIES})" in w.log_path.read_text(),
            60,
            lambda: f"the first join to time out: {w.log_path.read_text()[-2000:]}",
        )
        os.kill(broker_pid(stopped_broker), signal.SIGCONT)
        cluster.wait_ready(90)
        assert w.alive() and "Traceback" not in w.log_path.read_text(), w.log_path.read_text()[-3000:]


def test_a_join_that_never_gets_an_answer_ends_with_one_line(stopped_broker, tmp_path):
    cluster = _cluster(stopped_broker, tmp_path)
    with cluster:
        w = cluster.add()
        rc = w.proc.wait(20 * JOIN_TRIES)  # each try waits 10 s for the broker
        log = w.log_path.read_text()
        assert rc == 2, log[-3000:]
        assert (
            log.rstrip()
            .splitlines()[-1]
            .startswith(
                f"error: cannot join cluster {cluster.name}: the broker did not open its coordination topics in time "
                f"({JOIN_TRIES} tries of 10 s; the last: "
            )
        ), log[-3000:]
        assert "Traceback" not in log, log[-3000:]
