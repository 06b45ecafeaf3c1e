"""keyedState on a 3-worker cluster: the function's instances live on one worker (its router); a kill -9
of that worker makes a survivor restore every key group from the changelog, a SIGTERM hands them over
(break before make), a scale-out migrates live. Counts stay exact under EFFECTIVELY_ONCE."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from scenario import EXAMPLES, single_home, wait_until

from cluster.harness import WorkerCluster
from state_migration.test_property import PRODUCER, _counts

pytestmark = pytest.mark.slow
KEYS, RECORDS, RATE = 30, 1500, 150.0



def test_kill9_sigterm_and_scale_out_keep_counts_exact(broker, tmp_path):
    name = f"kc-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as cluster:
        cluster.wait_ready()
        admin = FunctionsAdmin(",".join(w.url for w in cluster.live()))
        admin.create({"tenant": "public", "namespace": "default", "name": name, "className": "keyed_count.KeyedCount",
                      "inputs": [src], "parallelism": 2, "keyedState": True,
                      "processingGuarantees": "EFFECTIVELY_ONCE", "subscriptionPosition": "Earliest"},
                     str(EXAMPLES / "keyed_count.py"))
        home = wait_until(lambda: single_home(admin, name, 2), 60, "2 instances on one worker")
        producer = subprocess.Popen([sys.executable, "-c", PRODUCER, broker.service_url, src, str(RECORDS),
                                     str(KEYS), str(RATE)])
        try:
            time.sleep(3)   # the load schedule: about 450 records in
            victim = cluster.by_id(home)
            cluster.kill(victim)
            killed = time.monotonic()
            admin = FunctionsAdmin(",".join(w.url for w in cluster.live()))
            home = wait_until(lambda: single_home(admin, name, 2), 60, "the instances running on a survivor")
            takeover_s = time.monotonic() - killed
            assert home != victim.worker_id
            admin.set_parallelism("public", "default", name, 3)
            home = wait_until(lambda: single_home(admin, name, 3), 60, "3 instances on one worker")
            time.sleep(1)
            leaving = cluster.by_id(home)
            cluster.terminate(leaving)
            admin = FunctionsAdmin(",".join(w.url for w in cluster.live()))
            home = wait_until(lambda: single_home(admin, name, 3), 60, "the instances on the last worker")
            assert home != leaving.worker_id
            assert producer.wait(60) == 0
        finally:
            if producer.poll() is None:
                producer.kill()
                producer.wait()
        local = FunctionsAdmin(cluster.by_id(home).url)
        expected = {f"k{k}": RECORDS // KEYS for k in range(KEYS)}

        wait_until(lambda: _counts(local, name, KEYS) == expected, 120,
                   lambda: f"exact counts {expected['k0']} per key: {_counts(local, name, KEYS)}")
        print(f"\nkill -9 of the home worker: instances running on {home} after {takeover_s:.2f} s; counts exact")
