"""B16: a reader with a receiver queue of 1, started from a message id, gets nothing: found on pulsar-lite, and
the same on Apache Pulsar 4.0.8, so it is the client's reader; the fence applies on every broker.

Tests: tests/integration/broker_conformance/test_reader.py (the defect and the fence's queue of 2),
tests/integration/state/test_state_store.py::test_a_paced_read_beside_many_shards_reads_on_from_a_position.
"""

from __future__ import annotations

MIN_READER_QUEUE = 2


def reader_queue(size: int) -> int:
    """B16: a reader with a receiver queue of 1 that starts from a message id gets nothing (from the earliest it
    reads), on pulsar-lite and Apache Pulsar alike. From 2 up it reads everything, with more duplicates, which our
    readers skip."""
    return max(MIN_READER_QUEUE, size)
