"""Several processes on one Shared subscription (the process runtime).

The process runtime runs instance i in its own process with its own client. On lite that
needs the B2 workaround in pulsar_autoscale/broker/lite/shared_input.py: instance i's process opens i
throwaway consumers first, so its consumer id differs from every other instance's.
"""

from __future__ import annotations

import pulsar
import pytest

from tests.support.conformance import Child, client, drain, payloads, produce


def _join_from_another_process(broker, topic: str, pad: int) -> tuple[str, list[int], list[int]]:
    """This process holds consumer id 0 on the subscription; a child (pad throwaway consumers
    first) joins it, then both consume a stream. Returns (child's verdict, ours, child's)."""
    n = 200
    with client(broker.service_url) as c:
        ours = c.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=20)
        with Child("join-shared", broker.service_url, topic, "fn", str(pad), "2", "1000") as child:
            verdict = child.expect(timeout_s=10)
            if verdict != "JOINED":
                return verdict, [], []
            produce(c, topic, n)
            mine = payloads(drain(ours, idle_ms=1500))
            theirs = [int(line.split()[1]) for line in child.lines_until_exit(20) if line.startswith("GOT ")]
    assert sorted(mine + theirs) == list(range(n)), "lost or duplicated messages between the two processes"
    return verdict, mine, theirs


def test_second_process_joins_shared_subscription_with_throwaway_consumers(broker, topic):
    """The published B2 workaround (throwaway consumers); the process runtime uses lite.shared_input instead."""
    verdict, mine, theirs = _join_from_another_process(broker, topic, pad=1)
    assert verdict == "JOINED"
    assert mine and theirs, f"load not split across processes: {len(mine)} here, {len(theirs)} in the child"


@pytest.mark.lite_defect(
    reason="pulsar-lite B2: a second client's consumer 0 collides with the first's "
    "('Consumer 0 already exists'); its subscribe times out"
)
def test_second_process_joins_shared_subscription(broker, topic):
    verdict, _, _ = _join_from_another_process(broker, topic, pad=0)
    assert verdict == "JOINED", f"second process could not subscribe: {verdict}"
