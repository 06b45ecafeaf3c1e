"""The tests' bounded wait: a status view that lacks an entry in the middle of a change is "not yet"."""

from __future__ import annotations

import pytest

from tests.support.scenario import wait_until


def test_a_lookup_error_is_not_yet_and_the_last_one_is_named_at_the_timeout():
    views = iter([{}, {"instances": {}}, {"instances": {3: "running"}}])
    assert wait_until(lambda: next(views)["instances"][3] == "running", 5, "instance 3", interval_s=0)
    with pytest.raises(AssertionError, match=r"instance 3 \(last: KeyError: 3\)"):
        wait_until(lambda: {}[3], 0.05, "instance 3")


def test_any_other_error_ends_the_wait():
    with pytest.raises(ZeroDivisionError):
        wait_until(lambda: 1 / 0, 5, "never")
