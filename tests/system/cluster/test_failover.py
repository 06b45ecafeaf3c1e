"""Failures and membership changes of a 3-worker cluster (docs/cluster.md): every test starts
its own worker processes and kills only those, by pid."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pulsar
import pytest
import requests

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.functions.cluster.assignments import Snapshot
from pulsar_autoscale.functions.cluster.tailer import MARKER
from pulsar_autoscale.functions.cluster.topics import ClusterTopics
from tests.support.cluster_harness import WorkerCluster
from tests.support.cluster_scenarios import Flow, per_worker
from tests.support.commands import CLI
from tests.support.scenario import wait_until

pytestmark = pytest.mark.slow
MESSAGES = 5000
RATE = 500.0


@pytest.fixture
def cluster(broker, tmp_path):
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as c:
        yield c


def _leader(url: str) -> str | None:
    try:
        resp = requests.get(url + "/admin/v2/worker/cluster/leader", timeout=2)
    except requests.RequestException:
        return None
    return resp.json()["workerId"] if resp.status_code == 200 else None


def _assignment(url: str) -> dict:
    return requests.get(url + "/admin/v2/worker/assignments", timeout=5).json()


def test_kill9_moves_instances_within_5s_then_join_moves_nothing_until_rebalance(broker, cluster):
    flow = Flow(broker.service_url, [w.url for w in cluster.live()], rate=RATE, parallelism=6)
    try:
        flow.create()
        before = flow.wait_running(6)
        leader = _leader(cluster.workers[0].url)
        counts = per_worker(before)
        victim_id = max((w for w in counts if w != leader), key=lambda w: (counts[w], w))
        victim = cluster.by_id(victim_id)
        moved = [s["instanceId"] for s in before["instances"] if s["status"]["workerId"] == victim_id]
        survivor = next(w for w in cluster.live() if w is not victim)
        flow.admins = [a for a in flow.admins if a.admin_url != victim.url]
        flow.start_producing(MESSAGES)
        time.sleep(3.0)  # the load schedule: kill mid-stream
        kill_ms = time.time() * 1000
        cluster.kill(victim)

        def moved_and_processing():
            st = flow.status()["instances"]
            firsts = [st[i]["status"].get("firstProcessedTimeMs") or 0 for i in moved]
            if all(st[i]["status"]["workerId"] != victim_id and st[i]["status"]["running"] for i in moved) and all(
                f >= kill_ms for f in firsts
            ):
                return max(firsts)
            return None

        back_ms = wait_until(moved_and_processing, 30, f"instances {moved} of {victim_id} processing elsewhere", interval_s=0.05)
        takeover_s = (back_ms - kill_ms) / 1000
        lost, dups = flow.finish(MESSAGES, timeout_s=30)
        print(
            f"\nkill -9 of {victim_id} ({len(moved)} instances {moved}) at {RATE:.0f} msg/s: processing again "
            f"elsewhere after {takeover_s:.2f} s, lost {lost}, duplicates {dups}"
        )
        assert lost == 0, f"{lost} of {MESSAGES} lost: {flow.missing(MESSAGES)[:50]}"
        assert takeover_s < 5.0, f"takeover took {takeover_s:.2f} s"

        # a new worker joins: nothing moves ...
        placed = _assignment(survivor.url)
        joined = cluster.add()
        cluster.wait_ready()
        time.sleep(1.5)  # several scheduling rounds: nothing may move without being asked
        after_join = _assignment(survivor.url)
        assert after_join.pop(joined.worker_id, []) == []
        assert after_join == placed
        # every instance running (a status read under load can find a peer slow to answer: no start time)
        starts = {s["instanceId"]: s["status"]["instanceStartTimeMs"] for s in flow.wait_running(6)["instances"]}
        # ... until `functions-worker rebalance` asks
        subprocess.run(
            [*CLI, "functions-worker", "--admin-url", survivor.url, "rebalance"],
            check=True,
            timeout=30,
        )

        def balanced():
            s = flow.status()
            return s if sorted(per_worker(s).values()) == [2, 2, 2] and s["numRunning"] == 6 else None

        st = wait_until(balanced, 30, "rebalanced instances running", interval_s=0.1)
        stayed = [s for s in st["instances"] if s["status"]["workerId"] != joined.worker_id]
        assert all(s["status"]["instanceStartTimeMs"] == starts[s["instanceId"]] for s in stayed)
        assert all(s["status"]["numRestarts"] == 0 for s in stayed)
    finally:
        flow.close()


def test_sigterm_hands_over_before_it_stops(broker, cluster):
    flow = Flow(broker.service_url, [w.url for w in cluster.live()], rate=RATE, parallelism=6)
    try:
        flow.create()
        st = flow.wait_running(6)
        leader = _leader(cluster.workers[0].url)
        victim = next(w for w in cluster.live() if w.worker_id != leader and per_worker(st).get(w.worker_id))
        flow.admins = [a for a in flow.admins if a.admin_url != victim.url]
        flow.start_producing(MESSAGES)
        time.sleep(3.0)
        t0 = time.monotonic()
        cluster.terminate(victim)
        stopped_s = time.monotonic() - t0
        after = flow.wait_running(6)
        lost, dups = flow.finish(MESSAGES)
        gap = flow.collector.longest_gap_s(t0 - 1.0, t0 + stopped_s + 2.0)
        print(
            f"\nSIGTERM of {victim.worker_id}: stopped after {stopped_s:.2f} s, lost {lost}, duplicates {dups}, "
            f"longest gap between outputs {gap * 1000:.0f} ms, now {per_worker(after)}"
        )
        assert lost == 0
        assert victim.worker_id not in per_worker(after)
        assert gap < 1.0, f"processing paused {gap:.2f} s"
    finally:
        flow.close()


def test_kill9_of_the_leader_then_scale(broker, cluster):
    flow = Flow(broker.service_url, [w.url for w in cluster.live()], rate=RATE, parallelism=3)
    try:
        flow.create()
        flow.wait_running(3)
        old = _leader(cluster.workers[0].url)
        victim = cluster.by_id(old)
        survivor = next(w for w in cluster.live() if w is not victim)
        flow.admins = [a for a in flow.admins if a.admin_url != victim.url]
        flow.start_producing(MESSAGES)
        time.sleep(2.0)
        t0 = time.monotonic()
        cluster.kill(victim)
        new = wait_until(lambda: (lid := _leader(survivor.url)) not in (None, old) and lid, 30, "a new leader", interval_s=0.05)
        elected_s = time.monotonic() - t0
        flow.scale(5)
        st = flow.wait_running(5, timeout_s=30)
        scaled_s = time.monotonic() - t0
        lost, dups = flow.finish(MESSAGES, timeout_s=30)
        print(
            f"\nkill -9 of leader {old}: new leader {new} after {elected_s:.2f} s; scale 3 -> 5 running "
            f"{scaled_s:.2f} s after the kill on {per_worker(st)}; lost {lost}, duplicates {dups}"
        )
        assert lost == 0, f"{lost} of {MESSAGES} lost: {flow.missing(MESSAGES)[:50]}"
        assert old not in per_worker(st)
    finally:
        flow.close()


def _last_snapshot(flow: Flow, cluster_name: str) -> Snapshot:
    """The last assignment snapshot on the cluster's assignment topic, read with a Reader of our own."""
    reader = flow.client.create_reader(ClusterTopics(cluster_name).assignments, pulsar.MessageId.earliest)
    last = None
    try:
        while True:
            try:
                msg = reader.read_next(1000)
            except pulsar.Timeout:
                break
            if not msg.properties().get(MARKER):
                last = Snapshot.from_json(msg.data())
    finally:
        reader.close()
    assert last is not None, "no assignment snapshot on the topic"
    return last


@pytest.mark.parametrize("moment", ["before-it-acts", "after-it-published"])
def test_kill9_of_the_leader_in_the_middle_of_a_rebalance_and_a_scale_out(broker, cluster, moment):
    """A rebalance request and a scale 6 -> 8 reach the metadata topic through other workers, and the
    leader is killed with -9 either before it acts on them (frozen with SIGSTOP first) or right after it
    published the assignment that carries them out, while the moves (make-before-break) are under way.
    The next leader finishes from the topics: the rebalance is in its snapshot, every instance runs on
    the survivors, nothing is lost, and no instance that stays on a surviving worker restarts."""
    flow = Flow(broker.service_url, [w.url for w in cluster.live()], rate=RATE, parallelism=6)
    try:
        flow.create()
        flow.wait_running(6)
        joined = cluster.add()  # nothing moves to it until the rebalance
        cluster.wait_ready()
        old = requests.get(cluster.workers[0].url + "/admin/v2/worker/cluster/leader", timeout=5).json()
        victim = cluster.by_id(old["workerId"])
        followers = [w for w in cluster.live() if w is not victim]
        flow.admins = [a for a in flow.admins if a.admin_url != victim.url] + [FunctionsAdmin(joined.url, timeout_s=20)]
        before = {s["instanceId"]: s["status"] for s in flow.wait_running(6)["instances"]}
        placed_before = _last_snapshot(flow, cluster.name)
        flow.start_producing(MESSAGES)
        time.sleep(2.0)

        if moment == "before-it-acts":
            os.kill(victim.pid, signal.SIGSTOP)  # the leader sees nothing from here on
        t0 = time.monotonic()
        request = requests.put(followers[0].url + "/admin/v2/worker/rebalance", timeout=20).json()["request"]
        flow.scale(8, via=1)
        if moment == "before-it-acts":
            assert _last_snapshot(flow, cluster.name) == placed_before, "the frozen leader published a snapshot"
        else:

            def published():
                placed = _assignment(followers[0].url)
                return sum(map(len, placed.values())) == 8 and placed.get(joined.worker_id)

            wait_until(published, 20, "the leader's assignment with the rebalance and the scale-out", interval_s=0.02)
        cluster.kill(victim)
        killed_s = time.monotonic() - t0

        st = flow.wait_running(8, timeout_s=30)
        done_s = time.monotonic() - t0
        snap = _last_snapshot(flow, cluster.name)
        lost, dups = flow.finish(MESSAGES, timeout_s=30)
        now = {s["instanceId"]: s["status"] for s in st["instances"]}
        stayed = [i for i in before if before[i]["workerId"] != victim.worker_id and now[i]["workerId"] == before[i]["workerId"]]
        print(
            f"\nrebalance + scale 6 -> 8, leader {victim.worker_id} (epoch {old['epoch']}) killed {moment} "
            f"({killed_s:.2f} s after the requests): new leader {snap.leader} (epoch {snap.epoch}) ran all 8 on "
            f"{per_worker(st)} {done_s:.2f} s after the requests; lost {lost}, duplicates {dups}; {len(stayed)} "
            "instances stayed on their worker"
        )
        assert snap.epoch > old["epoch"] and snap.leader != victim.worker_id
        assert request in snap.rebalanced, "the rebalance request is not in the new leader's snapshot"
        assert victim.worker_id not in per_worker(st) and per_worker(st).get(joined.worker_id)
        assert lost == 0, f"{lost} of {MESSAGES} lost: {flow.missing(MESSAGES)[:50]}"
        assert stayed, "every instance moved"
        for i in stayed:
            assert now[i]["numRestarts"] == 0 and now[i]["instanceStartTimeMs"] == before[i]["instanceStartTimeMs"], (
                f"instance {i} restarted on {now[i]['workerId']}"
            )
    finally:
        flow.close()
