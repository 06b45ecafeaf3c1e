"""No stranded messages on pulsar-lite: a config that would subscribe Key_Shared with several consumers is
refused (B4, B11), and an input the broker keeps not dispatching to after a reopen (B12) is a failure in the
function's status, not a quiet loop of reopens."""

from __future__ import annotations

import time
import uuid

import pulsar
import pytest

from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.broker.lite.stalls import StallFence, fence_stalls
from tests.support.conformance import client as lite_client
from tests.support.conformance import drain, produce
from tests.support.scenario import EXAMPLES, wait_until

COUNT = str(EXAMPLES / "keyed_count.py")


def _config(**fields) -> dict:
    name = f"ko-{uuid.uuid4().hex[:6]}"
    return {
        "tenant": "public",
        "namespace": "default",
        "name": name,
        "className": "keyed_count.KeyedCount",
        "inputs": [f"{name}-in"],
        "retainKeyOrdering": True,
        **fields,
    }


def test_key_shared_at_parallelism_above_1_is_refused_on_lite_only(admin, broker_kind):
    """B4, B11: retainKeyOrdering without keyedState at parallelism 2 is a 400 naming the defects on pulsar-lite,
    at create and when an update raises the parallelism; parallelism 1, and keyedState (the worker's router keeps
    each key's order over a Shared subscription) are accepted. On Apache Pulsar all of it is accepted."""
    refused = _config(parallelism=2)
    if broker_kind == "lite":
        with pytest.raises(AdminError, match=r"retainKeyOrdering at parallelism 2 .*B4.*B11") as err:
            admin.create(refused, COUNT)
        assert err.value.status == 400
        with pytest.raises(AdminError):  # nothing was left behind by the refusal
            admin.get("public", "default", refused["name"])
    else:
        admin.create(refused, COUNT)
        admin.delete("public", "default", refused["name"])

    single = _config(parallelism=1)
    admin.create(single, COUNT)
    if broker_kind == "lite":
        with pytest.raises(AdminError, match=r"retainKeyOrdering at parallelism 3 .*B4") as err:
            admin.set_parallelism("public", "default", single["name"], 3)
        assert err.value.status == 400
        assert admin.get("public", "default", single["name"])["parallelism"] == 1
    admin.delete("public", "default", single["name"])

    keyed = _config(parallelism=2, keyedState=True)
    admin.create(keyed, COUNT)
    wait_until(lambda: admin.status("public", "default", keyed["name"])["numRunning"] == 2, 30, "2 keyed instances")
    admin.delete("public", "default", keyed["name"])


@pytest.mark.lite_only("the B12 fence runs on pulsar-lite only")
def test_a_reopen_that_delivers_nothing_is_reported_as_a_failure(broker, topic):
    """An input whose every consumer sees nothing while the broker holds a backlog on its subscription: the first
    check reopens it (no failure yet: a reopen usually recovers); the next finds it still stuck and records a
    failure naming B12, the subscription and the backlog; it goes once a message arrives."""
    fence = StallFence(broker.metrics_url, idle_s=1.0)
    with lite_client(broker.service_url) as c:
        c.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.Shared).close()
        stuck = [True]

        def open_consumer():
            return c.subscribe(topic + "-nothing" if stuck[0] else topic, "fn", consumer_type=pulsar.ConsumerType.Shared)

        watched = fence_stalls(open_consumer, [topic], "fn", fence)
        produce(c, topic, 50)
        deadline = time.monotonic() + 30
        while not fence.failure([(topic, "fn")]) and time.monotonic() < deadline:
            assert drain(watched, idle_ms=200) == []
        why = fence.failure([(topic, "fn")])
        assert why.startswith("stalled: pulsar-lite B12") and "'fn'" in why and "backlog of" in why, why
        assert fence.reopens[(topic, "fn")] >= 2, fence.reopens
        stuck[0] = False  # the next reopen recovers: the failure goes with the first message
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            got += drain(watched, idle_ms=200)
        watched.close()
    assert len(got) == 50 and fence.failure([(topic, "fn")]) == ""


@pytest.mark.lite_only("the B12 fence runs on pulsar-lite only")
def test_a_stuck_input_shows_in_the_function_status(admin, worker):
    """The fence's failure reaches Pulsar's FunctionStatus: each instance on this worker says running false with
    the failure as its error (status reads it from the worker's fence; the stall itself is the test above)."""
    cfg = _config(parallelism=1)
    admin.create(cfg, COUNT)
    wait_until(lambda: admin.status("public", "default", cfg["name"])["numRunning"] == 1, 30, "running")
    fence = worker.worker.link.stall_fence
    topic = admin.get("public", "default", cfg["name"])["inputs"][0]
    fence.fail(topic, f"public/default/{cfg['name']}", "stalled: pulsar-lite B12: test")
    try:
        status = admin.status("public", "default", cfg["name"])
        assert status["numRunning"] == 0
        assert status["instances"][0]["status"]["error"] == "stalled: pulsar-lite B12: test"
    finally:
        fence.recovered((topic,), f"public/default/{cfg['name']}")
    assert admin.status("public", "default", cfg["name"])["numRunning"] == 1
    admin.delete("public", "default", cfg["name"])
