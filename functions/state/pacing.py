"""Pacing of background work (a pre-copy's changelog read and its group file writes): a share of the time, and a
read rate that spares the broker."""

from __future__ import annotations

import threading
import time
from typing import Hashable


class Pacer:
    """Sleeps after each stretch of work so that work takes at most `duty` of the time (duty 1: never) and,
    given `mb_per_s`, so that the bytes each stretch of reading handled go no faster than that.

    A read of a log that is still being written passes its lag (now minus the publish time of the record it
    reached): the rate only holds while the read, since its start, has gained CATCH_UP s of lag per s, i.e.
    reads the log at least 1 + CATCH_UP times as fast as it was written; so a log written faster than the rate
    allows (a busy function's changelog) is read at about that multiple of its write rate, and rounds of
    pre-copy shrink by as much each. Reads of several logs side by side (a restore's changelog shards) each pass
    their `source`: a log's lag is compared with its own first, and the verdict is on their mean gain (the shards
    are at different places in their history: one shard's lag against another's said nothing, and flipped the
    verdict from one call to the next). A call without a lag (the group files' writes after the read) is paced by
    the duty alone: the rate spares the broker, which the writes do not touch (held to it as well, a 500 MB
    pre-copy's rounds hardly shrank, BENCHMARKS.md "A catch-up read's bursts").
    """

    CATCH_UP = 2.0

    def __init__(self, duty: float, mb_per_s: float | None = None, stop: threading.Event | None = None):
        """`stop`: ends a sleep early (the work is being called off)."""
        self.duty = duty
        self.bytes_per_s = mb_per_s * 1e6 if mb_per_s else None
        self._stop = stop or threading.Event()
        self._t0 = time.perf_counter()
        self._gains: dict[Hashable, tuple[float, float, float | None]] = {}  # source -> (first call, lag, gain since)
        self._capped = True

    def __call__(self, nbytes: int = 0, lag_s: float | None = None, source: Hashable = None) -> None:
        now = time.perf_counter()
        worked = now - self._t0
        wait = worked * (1 - self.duty) / self.duty
        if self.bytes_per_s and lag_s is not None and self._catching_up(now, lag_s, source):
            wait = max(wait, nbytes / self.bytes_per_s - worked)
        if wait > 0:
            self._stop.wait(wait)  # pacing, not synchronisation
        self._t0 = time.perf_counter()

    def _catching_up(self, now: float, lag_s: float, source: Hashable) -> bool:
        first = self._gains.get(source)
        if first is None:
            self._gains[source] = (now, lag_s, None)
        elif now > first[0]:
            self._gains[source] = (first[0], first[1], (first[1] - lag_s) / (now - first[0]))
            gains = [g for _, _, g in self._gains.values() if g is not None]
            self._capped = sum(gains) / len(gains) >= self.CATCH_UP
        return self._capped
