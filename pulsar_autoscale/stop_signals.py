"""SIGINT and SIGTERM for the long-running commands (broker, worker, controller, localrun), counted.

The handler only counts. Python runs a handler in the main thread between two bytecodes, and that thread may
be inside `Event.wait()` of the very Event the handler would set, holding its lock (Condition.wait takes it
before it sleeps and after it wakes): an `Event.set()` in the handler then waits for itself forever. A worker
stuck that way ignored the second SIGTERM that should have ended its stop at once.
"""

from __future__ import annotations

import signal
import threading
import time

POLL_S = 0.1


class StopSignals:
    """Installs its handler for `signals` and counts what arrives."""

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)):
        self.count = 0
        for sig in signals:
            signal.signal(sig, self._take)

    def _take(self, *_) -> None:
        self.count += 1

    def wait(self, count: int = 1, timeout_s: float | None = None, done: threading.Event | None = None) -> bool:
        """True once `count` signals have arrived in all; False when `done` (set by another thread) is set or
        `timeout_s` has passed first. Call it from the main thread."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.count < count:
            if done is not None and done.is_set():
                return False
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            if done is not None:
                done.wait(left)
            else:
                time.sleep(left)
        return True
