"""RecordScheduler (functions/keyed/record_scheduling.py): the order in which an instance takes its records while a
group it just opened catches up. Pure, so every order is exact."""

from __future__ import annotations

from pulsar_autoscale.functions.keyed.record_scheduling import RecordScheduler

MOVED, STEADY = 7, 3


def _take_all(s: RecordScheduler, arrivals: list[tuple[str, int | None]], now: float) -> list[str]:
    """What the instance takes when `arrivals` are all already here at `now`, then nothing more comes."""
    out = [x for x, g in arrivals if s.arrive(x, g, now) is not None]
    while (x := s.take()) is not None:
        out.append(x)
    return out


def test_steady_groups_pass_a_moved_groups_backlog_and_each_key_keeps_its_order():
    s = RecordScheduler(catch_up_s=0.5, max_wait_s=0.5)
    s.opening({MOVED})
    s.opened({MOVED}, now=10.0)
    got = _take_all(s, [("m1", MOVED), ("m2", MOVED), ("s1", STEADY), ("m3", MOVED), ("s2", STEADY)], now=10.01)
    assert got == ["s1", "s2", "m1", "m2", "m3"]


def test_a_caught_up_group_comes_straight_through_again():
    s = RecordScheduler(catch_up_s=0.5, max_wait_s=0.5)
    s.opening({MOVED})
    s.opened({MOVED}, now=10.0)
    assert s.arrive("m1", MOVED, 10.1) is None  # catching up: waits
    assert s.take() == "m1"
    assert s.arrive("m2", MOVED, 10.2) is None  # still within catch_up_s of the open
    assert s.take() == "m2"
    assert s.arrive("m3", MOVED, 10.6) == "m3"  # past it, none of its records waiting: straight through


def test_a_group_stays_behind_while_its_records_wait_even_past_catch_up():
    s = RecordScheduler(catch_up_s=0.5, max_wait_s=5.0)
    s.opening({MOVED})
    s.opened({MOVED}, now=10.0)
    assert s.arrive("m1", MOVED, 10.1) is None
    assert s.arrive("m2", MOVED, 10.7) is None  # m1 still waits: m2 may not pass it
    assert [s.take(), s.take()] == ["m1", "m2"]


def test_records_of_a_group_whose_open_is_running_would_wait():
    s = RecordScheduler(catch_up_s=0.5, max_wait_s=5.0)
    s.opening({MOVED})
    assert s.arrive("m1", MOVED, 99.0) is None


def test_nothing_passes_a_marker():
    """A RELEASE (any marker) behind waiting records waits too, and everything after it, steady or not."""
    s = RecordScheduler(catch_up_s=0.5, max_wait_s=0.5)
    s.opening({MOVED})
    s.opened({MOVED}, now=10.0)
    got = _take_all(s, [("m1", MOVED), ("s1", STEADY), ("RELEASE", None), ("s2", STEADY), ("m2", MOVED)], 10.01)
    assert got == ["s1", "m1", "RELEASE", "s2", "m2"]
    assert s.arrive("s3", STEADY, 10.02) == "s3"  # the barrier went with the last waiting record


def test_a_marker_with_nothing_waiting_is_taken_at_once():
    s = RecordScheduler()
    assert s.arrive("OPEN", None, 1.0) == "OPEN"


def test_no_starvation_the_oldest_waiting_record_is_due_after_max_wait():
    s = RecordScheduler(catch_up_s=0.5, max_wait_s=0.2)
    s.opening({MOVED})
    s.opened({MOVED}, now=10.0)
    assert s.arrive("m1", MOVED, 10.0) is None
    assert s.due(10.1) is None  # steady records keep arriving: m1 waits
    assert s.arrive("s1", STEADY, 10.1) == "s1"
    assert s.due(10.25) == "m1"  # waited max_wait_s: taken despite the load
    assert not s.waiting()


def test_groups_never_opened_are_never_delayed():
    s = RecordScheduler()
    assert [s.arrive(f"s{i}", STEADY, float(i)) for i in range(3)] == ["s0", "s1", "s2"]
    assert not s.waiting()
