"""The stuck-iteration watchdog names the call a hung iteration waits in."""

from __future__ import annotations

import logging
import threading

from pulsar_autoscale.controller.watchdog import IterationWatchdog
from tests.support.scenario import wait_until


def _blocked_in_the_worker_api(release: threading.Event) -> None:
    assert release.wait(10), "the test never released the blocked iteration"


def test_an_overrun_is_reported_with_the_stack_it_waits_in(caplog):
    stuck: list[str] = []
    dog = IterationWatchdog(lambda: 0.05, on_stuck=stuck.append)
    release = threading.Event()
    caplog.set_level(logging.WARNING, logger="pulsar_autoscale.controller.watchdog")

    def iteration():
        with dog.watch("MAPE iteration"):
            _blocked_in_the_worker_api(release)

    t = threading.Thread(target=iteration)
    t.start()
    try:
        wait_until(lambda: stuck, 5, "the watchdog to report the overrun")
        report = next(r.getMessage() for r in caplog.records if "still running" in r.getMessage())
        assert "MAPE iteration still running after" in report and "_blocked_in_the_worker_api" in report
    finally:
        release.set()
        t.join(5)
    wait_until(lambda: any("finished after" in r.getMessage() for r in caplog.records), 5, "the end of the overrun")
    assert stuck == ["MAPE iteration"]


def test_an_iteration_within_its_budget_is_not_reported(caplog):
    stuck: list[str] = []
    dog = IterationWatchdog(lambda: 5.0, on_stuck=stuck.append)
    with dog.watch("MAPE iteration"):
        pass
    assert stuck == [] and not caplog.records
