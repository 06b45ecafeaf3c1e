"""state.Pacer: the share of time and the rate a background copy may take (pure, fast)."""

from __future__ import annotations

import threading
import time

from pulsar_autoscale.functions.state.pacing import Pacer


def timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def test_a_rate_makes_a_stretch_last_its_bytes_over_the_rate():
    pace = Pacer(1.0, mb_per_s=1.0)
    assert timed(lambda: pace(200_000, lag_s=10.0)) >= 0.2


def test_the_rate_holds_while_the_read_catches_up_with_the_log():
    pace = Pacer(1.0, mb_per_s=1.0)
    pace(0, lag_s=100.0)
    assert timed(lambda: pace(100_000, lag_s=10.0)) >= 0.09  # the lag fell by 90 s at once: well ahead
    assert timed(lambda: pace(100_000, lag_s=9.9)) >= 0.09  # since the start, still far ahead


def test_a_read_falling_behind_the_log_is_not_held_to_the_rate():
    """A changelog written faster than the rate: pacing to it would never reach the end."""
    pace = Pacer(1.0, mb_per_s=1.0)
    pace(0, lag_s=10.0)
    time.sleep(0.05)
    assert timed(lambda: pace(10_000_000, lag_s=9.95)) < 5  # gained 1 s per s, not 2: capped, it would sleep 10 s


def test_the_writes_after_a_read_are_paced_by_the_duty_alone():
    """The rate spares the broker; a read held to it is followed by writes that are not (10 s at the rate)."""
    pace = Pacer(1.0, mb_per_s=1.0)
    pace(0, lag_s=100.0)
    assert timed(lambda: pace(100_000, lag_s=10.0)) >= 0.09
    assert timed(lambda: pace(10_000_000)) < 5


def test_logs_read_side_by_side_are_each_judged_against_their_own_start():
    """Two shards at different places in their history: each gains 1 s of lag per s (not catching up), though
    the second's lag is 30 s under the first's; compared with the first's start it looked 30 s ahead."""
    pace = Pacer(1.0, mb_per_s=1.0)
    pace(0, lag_s=40.0, source="shard-0")
    pace(0, lag_s=10.0, source="shard-1")
    time.sleep(0.1)
    assert timed(lambda: pace(1_000_000, lag_s=39.9, source="shard-0")) < 0.5  # capped, it would sleep 1 s
    assert timed(lambda: pace(1_000_000, lag_s=9.9, source="shard-1")) < 0.5


def test_a_shard_catching_up_and_one_falling_behind_are_judged_on_their_mean_gain():
    pace = Pacer(1.0, mb_per_s=1.0)
    pace(0, lag_s=40.0, source="shard-0")
    pace(0, lag_s=40.0, source="shard-1")
    time.sleep(0.1)
    pace(0, lag_s=30.0, source="shard-0")  # 10 s closer: far ahead
    assert timed(lambda: pace(100_000, lag_s=40.5, source="shard-1")) >= 0.09  # mean gain still over 2 s/s
    assert timed(lambda: pace(1_000_000, lag_s=60.0, source="shard-1")) < 0.5  # now under: the rate lets go


def test_duty_alone_sleeps_in_proportion_to_the_work():
    pace = Pacer(0.5)
    time.sleep(0.1)
    assert timed(pace) >= 0.1


def test_a_stop_ends_the_sleep():
    """A migration called off (its function deleted) does not sit out its pacing."""
    stop = threading.Event()
    pace = Pacer(0.01, stop=stop)
    time.sleep(0.1)  # 0.1 s of work at duty 0.01: a 9.9 s sleep
    threading.Timer(0.1, stop.set).start()
    assert timed(pace) < 2
