"""state.Pacer: the share of time and the rate a background copy may take (pure, fast)."""

from __future__ import annotations

import threading
import time

from pulsar_autoscale.functions.state import Pacer


def timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def test_a_rate_makes_a_stretch_last_its_bytes_over_the_rate():
    pace = Pacer(1.0, mb_per_s=1.0)
    assert timed(lambda: pace(200_000)) >= 0.2


def test_the_rate_holds_while_the_read_catches_up_with_the_log():
    pace = Pacer(1.0, mb_per_s=1.0)
    pace(0, lag_s=100.0)
    assert timed(lambda: pace(100_000, lag_s=10.0)) >= 0.09   # the lag fell by 90 s at once: well ahead
    assert timed(lambda: pace(100_000, lag_s=9.9)) >= 0.09    # since the start, still far ahead


def test_a_read_falling_behind_the_log_is_not_held_to_the_rate():
    """A changelog written faster than the rate: pacing to it would never reach the end."""
    pace = Pacer(1.0, mb_per_s=1.0)
    pace(0, lag_s=10.0)
    time.sleep(0.05)
    assert timed(lambda: pace(10_000_000, lag_s=9.95)) < 5    # gained 1 s per s, not 2: capped, it would sleep 10 s
    assert timed(lambda: pace(10_000_000)) < 5, "the writes after such a read keep its verdict"


def test_duty_alone_sleeps_in_proportion_to_the_work():
    pace = Pacer(0.5)
    time.sleep(0.1)
    assert timed(pace) >= 0.1


def test_a_stop_ends_the_sleep():
    """A migration called off (its function deleted) does not sit out its pacing."""
    stop = threading.Event()
    pace = Pacer(0.01, stop=stop)
    time.sleep(0.1)                          # 0.1 s of work at duty 0.01: a 9.9 s sleep
    threading.Timer(0.1, stop.set).start()
    assert timed(pace) < 2
