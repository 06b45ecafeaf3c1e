"""Failures and membership changes of a 3-worker cluster (issue 10, item 5): every test starts
its own worker processes and kills only those, by pid."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import requests

from scenario import wait_until

from .harness import WorkerCluster
from .scenarios import Flow, per_worker

pytestmark = pytest.mark.slow
MESSAGES = 5000
RATE = 500.0
# Not always 0 after a kill -9 on pulsar-lite: in 2 of 10 runs 6-14 messages dispatched to the dying worker
# within ~20 ms of the kill never came back to any consumer (docs/cluster.md, "Limits"). SIGTERM and
# scaling must lose nothing.
KILL_LOSS_BOUND = 0.005


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
            if all(st[i]["status"]["workerId"] != victim_id and st[i]["status"]["running"] for i in moved) \
                    and all(f >= kill_ms for f in firsts):
                return max(firsts)
            return None

        back_ms = wait_until(moved_and_processing, 30, f"instances {moved} of {victim_id} processing elsewhere",
                             interval_s=0.05)
        takeover_s = (back_ms - kill_ms) / 1000
        lost, dups = flow.finish(MESSAGES, timeout_s=30)
        print(f"\nkill -9 of {victim_id} ({len(moved)} instances {moved}) at {RATE:.0f} msg/s: processing again "
              f"elsewhere after {takeover_s:.2f} s, lost {lost}, duplicates {dups}")
        assert lost <= MESSAGES * KILL_LOSS_BOUND, f"{lost} of {MESSAGES} lost: {flow.missing(MESSAGES)[:50]}"
        assert takeover_s < 5.0, f"takeover took {takeover_s:.2f} s"

        # a new worker joins: nothing moves ...
        placed = _assignment(survivor.url)
        joined = cluster.add()
        cluster.wait_ready()
        time.sleep(1.5)  # several scheduling rounds: nothing may move without being asked
        after_join = _assignment(survivor.url)
        assert after_join.pop(joined.worker_id, []) == []
        assert after_join == placed
        starts = {s["instanceId"]: s["status"]["instanceStartTimeMs"] for s in flow.status()["instances"]}
        # ... until `functions-worker rebalance` asks
        subprocess.run([sys.executable, "-m", "pulsar_autoscale.cli", "functions-worker", "--admin-url",
                        survivor.url, "rebalance"], check=True, timeout=30)
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
        print(f"\nSIGTERM of {victim.worker_id}: stopped after {stopped_s:.2f} s, lost {lost}, duplicates {dups}, "
              f"longest gap between outputs {gap * 1000:.0f} ms, now {per_worker(after)}")
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
        new = wait_until(lambda: (lid := _leader(survivor.url)) not in (None, old) and lid,
                         30, "a new leader", interval_s=0.05)
        elected_s = time.monotonic() - t0
        flow.scale(5)
        st = flow.wait_running(5, timeout_s=30)
        scaled_s = time.monotonic() - t0
        lost, dups = flow.finish(MESSAGES, timeout_s=30)
        print(f"\nkill -9 of leader {old}: new leader {new} after {elected_s:.2f} s; scale 3 -> 5 running "
              f"{scaled_s:.2f} s after the kill on {per_worker(st)}; lost {lost}, duplicates {dups}")
        assert lost <= MESSAGES * KILL_LOSS_BOUND, f"{lost} of {MESSAGES} lost: {flow.missing(MESSAGES)[:50]}"
        assert old not in per_worker(st)
    finally:
        flow.close()
