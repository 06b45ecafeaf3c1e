"""Hypothesis, keyed state: any sequence of up to 10 operations among scale out/in, worker SIGTERM and worker
kill -9 + restart, under load, ends with exact counts per key under EFFECTIVELY_ONCE, and counts >= exact
(the excess reported as redeliveries) under ATLEAST_ONCE. One worker process of its own (killed by pid),
a keyedState count per message key, state through live migrations and restarts.

Examples: STATE_PROPERTY_EXAMPLES (default 3: about 40 s each on 2 cores).
"""

from __future__ import annotations

import os
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from tests.support.keyed import WorkerProcess, state_counts
from tests.support.scenario import KEYED_COUNT, keyed_count, start_keyed_load, wait_until

KEYS = 40
RECORDS = 1200
RATE = 120.0
OPS = st.one_of(st.tuples(st.just("scale"), st.integers(1, 3)), st.just(("sigterm", 0)), st.just(("kill9", 0)))


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("STATE_PROPERTY_EXAMPLES", "3")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(OPS, min_size=1, max_size=10), guarantee=st.sampled_from(["EFFECTIVELY_ONCE", "ATLEAST_ONCE"]))
def test_counts_survive_any_sequence_of_scaling_and_worker_failures(broker, tmp_path_factory, ops, guarantee):
    worker = WorkerProcess(broker, tmp_path_factory.mktemp("prop"))
    worker.start()
    admin = FunctionsAdmin(worker.url)
    name = f"prop-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    producer = None
    try:
        admin.create(
            keyed_count(name, src, parallelism=2, processingGuarantees=guarantee),
            str(KEYED_COUNT),
        )
        wait_until(lambda: admin.status("public", "default", name)["numRunning"] == 2, 60, "2 instances running")
        producer = start_keyed_load(broker.service_url, src, RECORDS, KEYS, RATE, batched=True)
        period = RECORDS / RATE / (len(ops) + 1)
        for op, arg in ops:
            time.sleep(period)  # the load schedule, not synchronisation
            if op == "scale":
                try:
                    admin.set_parallelism("public", "default", name, arg)
                except AdminError as exc:  # "Update contains no change": already at that parallelism
                    assert "no change" in str(exc), exc
            else:
                worker.stop(kill=op == "kill9")
                worker.start()
        assert producer.wait(120) == 0
        expected = RECORDS // KEYS

        def settled():
            counts = state_counts(admin, name, KEYS)
            return counts if all(v >= expected for v in counts.values()) else None

        counts = wait_until(settled, 120, lambda: f"every key counted {expected} times: {state_counts(admin, name, KEYS)}")
        time.sleep(1.0)  # redeliveries still in flight would show as a count above `expected`
        counts = state_counts(admin, name, KEYS)
        excess = sum(counts.values()) - RECORDS
        keyed = admin.status("public", "default", name)["autoscale"]["keyedState"]
        assert sum(keyed["groupsPerInstance"].values()) == 128 and "failure" not in keyed, keyed
        print(f"\n{guarantee} ops={ops}: {RECORDS} records, redeliveries counted {excess}")
        if guarantee == "EFFECTIVELY_ONCE":
            assert counts == {f"k{k}": expected for k in range(KEYS)}, f"not exact: excess {excess}"
        else:
            assert all(v >= expected for v in counts.values())
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
            producer.wait()
        worker.stop(kill=False)
