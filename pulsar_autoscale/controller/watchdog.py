"""Stuck-iteration watchdog: a MAPE iteration that runs past its budget is logged with the stack it is in.

Without it a hung iteration shows only apscheduler's "skipped: maximum number of running instances
reached" every period, which says that the loop is stuck but not where. One warning per overrun,
naming the call the iteration waits in, tells the operator which dependency (the broker, the worker's
REST API, the controls topic) to look at; the iteration's end is logged with its duration.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Callable, Iterator

log = logging.getLogger(__name__)


class IterationWatchdog:
    def __init__(self, budget_s: Callable[[], float], on_stuck: Callable[[str], None] | None = None):
        self._budget_s = budget_s  # read at each start: a reload may change the period
        self._on_stuck = on_stuck

    @contextmanager
    def watch(self, what: str) -> Iterator[None]:
        thread, started = threading.get_ident(), time.monotonic()
        budget = self._budget_s()
        timer = threading.Timer(budget, self._report, args=(what, thread, started))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            took = time.monotonic() - started
            if took > budget:
                log.warning("%s finished after %.1f s (budget %.1f s)", what, took, budget)

    def _report(self, what: str, thread: int, started: float) -> None:
        frame = sys._current_frames().get(thread)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(thread gone)\n"
        log.warning("%s still running after %.1f s; it waits in:\n%s", what, time.monotonic() - started, stack)
        if self._on_stuck is not None:
            self._on_stuck(what)
