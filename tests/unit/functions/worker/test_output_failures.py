"""A failed output (the broker did not persist it: a send timeout while the broker hangs) makes status say
running false until an output succeeds again (docs/reliability.md, broker SIGSTOP)."""

from __future__ import annotations

from pulsar_autoscale.functions.instance.stats import InstanceStats
from pulsar_autoscale.functions.worker.status import honest_running


def test_a_failed_output_shows_in_status_until_one_succeeds():
    stats = InstanceStats(0)
    stats.set_running(True)
    assert honest_running(stats.figures(), stall_after_s=30) == (True, "")
    stats.on_output_failed("Timeout")
    running, error = honest_running(stats.figures(), stall_after_s=30)
    assert not running and "outputs failing" in error and "Timeout" in error
    stats.on_output()
    assert honest_running(stats.figures(), stall_after_s=30) == (True, "")
