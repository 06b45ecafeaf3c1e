"""A front that resumes an interrupted migration follows the function's current parallelism.

The front's worker dies (kill -9) half-way through a paced 2 -> 4, the function is scaled 4 -> 2 through a
survivor while it is down, and the worker comes back as itself (same id and data dir, so instance 0 and the
front stay there). The resumed front must move the groups to 2 instances and never wait for an answer from
an instance the scale-in drained: every record is counted exactly once under EFFECTIVELY_ONCE, and soon.
Before, the front re-ran the migration "to 4 instances" and waited 60 s for an OPEN from drained instance 2,
while the records of its groups waited."""

from __future__ import annotations

import time
import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from tests.support.cluster_harness import WorkerCluster, key_counts
from tests.support.keyed import create_paced, keyed_view, mid_migration
from tests.support.scenario import keyed_settled, start_keyed_load, wait_until

pytestmark = pytest.mark.slow
KEYS, PER_KEY, RATE = 40, 50, 100.0
SETTLE_S = 45.0  # from the end of the load to exact counts; the defect held records for 60 s and more


def _counts(cluster: WorkerCluster, name: str) -> dict[str, int]:
    return key_counts(cluster, name, KEYS)


@pytest.mark.parametrize("scaled", ["while-down", "while-resuming"])
def test_a_restarted_front_resumes_to_the_current_parallelism(broker, tmp_path, scaled):
    """`while-down`: the 4 -> 2 is answered before the worker is back; `while-resuming`: it comes while the
    restarted front is re-running the 2 -> 4 (the order of the report)."""
    name = f"kr-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as cluster:
        create_paced(cluster, name, src, 2)
        producer = start_keyed_load(broker.service_url, src, KEYS * PER_KEY, KEYS, RATE, batched=True)
        try:
            wait_until(lambda: _counts(cluster, name)["k0"] > 0, 60, "the load counted", interval_s=0.2)
            FunctionsAdmin(cluster.live()[0].url).set_parallelism("public", "default", name, 4)
            wait_until(
                lambda: mid_migration(cluster, name, "2", 2),
                60,
                lambda: f"a 2 -> 4 under way with groups on instance 2: {keyed_view(cluster, name)}",
            )
            front = cluster.by_id(cluster.placement(name)[0])
            cluster.kill(front)
            survivor = cluster.live()[0]
            if scaled == "while-down":
                FunctionsAdmin(survivor.url).set_parallelism("public", "default", name, 2)
            front = cluster.restart(front)
            if scaled == "while-resuming":
                wait_until(
                    lambda: mid_migration(cluster, name, "2", 1),
                    60,
                    lambda: f"the restarted front re-running the 2 -> 4: {keyed_view(cluster, name)}",
                    interval_s=0.2,
                )
                FunctionsAdmin(survivor.url).set_parallelism("public", "default", name, 2)
            sent = producer.finish(120)  # after the round of keys under way: every key is sent as often
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()
        t0 = time.monotonic()
        expected = {f"k{k}": sent // KEYS for k in range(KEYS)}
        try:
            wait_until(
                lambda: _counts(cluster, name) == expected,
                SETTLE_S,
                lambda: f"exact counts of {sent // KEYS} per key: {_counts(cluster, name)}",
                interval_s=1.0,
            )
            wait_until(
                lambda: keyed_settled(keyed_view(cluster, name), {"0": 64, "1": 64}),
                30,
                lambda: f"every group on instances 0 and 1: {keyed_view(cluster, name)}",
                interval_s=0.5,
            )
        except AssertionError:
            print(cluster.log_tails(60))
            raise
        print(f"\nexact counts {time.monotonic() - t0:.1f} s after the load ended")
