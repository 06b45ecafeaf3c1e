"""A function without keyedState keeps one copy of each state key, as Pulsar's table service does, whatever
keys its messages carry. Its state calls went to the message key's group, so a counter that messages of 10 keys
incremented 10 times each read 10 (in the function and in querystate), not 100."""

from __future__ import annotations

import uuid

import pytest

from tests.support.scenario import OutputCollector, wait_until

TOTAL_FN = """
from pulsar import Function


class Total(Function):
    def process(self, input, context):
        return str(context.incr_counter("total", 1))   # the new value, in one statement
"""
KEYS, PER_KEY = 10, 10


@pytest.mark.parametrize("runtime", ["thread", "process"])
@pytest.mark.parametrize("guarantee", ["ATLEAST_ONCE", "EFFECTIVELY_ONCE"])
def test_a_counter_written_from_messages_of_many_keys_is_one_counter(admin, client, tmp_path, runtime, guarantee):
    code = tmp_path / "total.py"
    code.write_text(TOTAL_FN)
    name = f"one-{uuid.uuid4().hex[:6]}"
    src, dst = (f"persistent://public/default/{name}-{t}" for t in ("in", "out"))
    admin.create(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "total.Total",
            "inputs": [src],
            "output": dst,
            "parallelism": 2,
            "instanceRuntime": runtime,
            "processingGuarantees": guarantee,
            "subscriptionPosition": "Earliest",
        },
        str(code),
    )
    collector = OutputCollector(client, dst)
    try:
        producer = client.create_producer(src)
        for i in range(KEYS * PER_KEY):
            producer.send(b"x", partition_key=f"k{i % KEYS}")
        producer.close()
        n = KEYS * PER_KEY
        wait_until(lambda: sum(collector.counts.values()) >= n, 60, lambda: f"{n} outputs, saw {sum(collector.counts.values())}")
        assert admin.get_state("public", "default", name, "total") == {"key": "total", "numberValue": n}
        # Each increment read the one counter: its values are 1..n, each once (a redelivery would repeat one).
        assert sorted(int(v) for v in collector.counts) == list(range(1, n + 1)), collector.counts
    finally:
        collector.close()
        admin.delete("public", "default", name)
