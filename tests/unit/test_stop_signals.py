"""StopSignals counts signals in a handler that takes no lock, and its wait ends on a count, a done event or a
timeout."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from pulsar_autoscale.stop_signals import StopSignals


@pytest.fixture
def usr1():
    before = signal.getsignal(signal.SIGUSR1)
    yield StopSignals((signal.SIGUSR1,))
    signal.signal(signal.SIGUSR1, before)


def test_wait_returns_once_the_count_has_arrived(usr1):
    def send_two() -> None:  # one at a time: a signal sent while the same one is pending merges with it
        os.kill(os.getpid(), signal.SIGUSR1)
        counted = threading.Event()
        while not counted.wait(0.01):
            if usr1.count >= 1:
                counted.set()
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=send_two, daemon=True).start()
    assert usr1.wait(2, timeout_s=10)
    assert usr1.count == 2


def test_wait_ends_without_a_signal_on_done_or_timeout(usr1):
    done = threading.Event()
    threading.Timer(0.05, done.set).start()
    assert not usr1.wait(timeout_s=10, done=done)
    assert not usr1.wait(timeout_s=0.05)
    assert usr1.count == 0
