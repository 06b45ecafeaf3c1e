"""The source's read-ahead thread: batches in order, errors raised to the reader, a close stops it."""

from __future__ import annotations

import threading

import pytest

from pulsar_autoscale.spark_bridge.source import _prefetched


def test_batches_come_in_order_and_the_thread_ends():
    assert list(_prefetched(i for i in range(100))) == list(range(100))
    assert not [t for t in threading.enumerate() if t.name == "pulsar-source-read"]


def test_an_error_in_the_read_loop_is_raised_to_the_consumer():
    def failing():
        yield 1
        raise ValueError("range lost")

    got = []
    with pytest.raises(ValueError, match="range lost"):
        for item in _prefetched(failing()):
            got.append(item)
    assert got == [1]


def test_closing_early_stops_the_thread_and_closes_the_source():
    closed = threading.Event()

    def endless():
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()

    it = _prefetched(endless())
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    assert closed.is_set()
    assert not [t for t in threading.enumerate() if t.name == "pulsar-source-read"]
