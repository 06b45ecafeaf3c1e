"""Record scheduling at a keyedState instance (DRRS, the live-rescaling paper's "record scheduling that lets
unaffected keys go on").

A move ends with a burst: the records the front held while a group was in transit reach the new owner all at
once, and the records of the instance's other groups behind them would wait for the whole backlog. Here a
group just opened at the instance "catches up" for `catch_up_s` after its open, and then until none of its
records waits: its records wait behind those of the other groups that are already there, and are taken when
nothing else is waiting or once the oldest has waited `max_wait_s` (no starvation under overload). Each key
keeps its order (a group's records all wait while it catches up) and nothing passes a marker (a RELEASE must
find every record before it done).

Pure: no I/O, no clock (the caller passes the time), so the order it makes is checked exactly by a unit test.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Generic, TypeVar

CATCH_UP_S = 0.5
MAX_WAIT_S = 0.5
T = TypeVar("T")
_OPENING = float("inf")


class RecordScheduler(Generic[T]):
    def __init__(self, catch_up_s: float = CATCH_UP_S, max_wait_s: float = MAX_WAIT_S):
        self.catch_up_s, self.max_wait_s = catch_up_s, max_wait_s
        self._catching_up: dict[int, float] = {}  # group -> until when its records wait
        self._later: deque[tuple[float, T, int | None]] = deque()  # (arrived, record or marker, its group)
        self._waiting: Counter[int] = Counter()  # group -> its records in _later
        self._barrier = False  # a marker waits: nothing passes it

    def opening(self, groups: set[int]) -> None:
        """An open of these groups started: their records (none come before it ends) will wait."""
        self._catching_up.update(dict.fromkeys(groups, _OPENING))

    def opened(self, groups: set[int], now: float) -> None:
        for g in groups:
            if self._catching_up.get(g) == _OPENING:
                self._catching_up[g] = now + self.catch_up_s

    def waiting(self) -> bool:
        return bool(self._later)

    def arrive(self, item: T, group: int | None, now: float) -> T | None:
        """A record (`group`) or a marker (None) received: it, to take now, or None when it waits."""
        if self._barrier or (group is None and self._later) or (group is not None and self._catches_up(group, now)):
            self._later.append((now, item, group))
            if group is None:
                self._barrier = True
            else:
                self._waiting[group] += 1
            return None
        return item

    def due(self, now: float) -> T | None:
        """The oldest waiting record once it has waited max_wait_s."""
        return self.take() if self._later and now - self._later[0][0] >= self.max_wait_s else None

    def take(self) -> T | None:
        """The oldest waiting record or marker (nothing else is waiting), None when none waits."""
        if not self._later:
            return None
        _, item, group = self._later.popleft()
        if group is not None:
            self._waiting[group] -= 1
            if not self._waiting[group]:
                del self._waiting[group]
        if not self._later:
            self._barrier = False
        return item

    def _catches_up(self, group: int, now: float) -> bool:
        until = self._catching_up.get(group)
        if until is None:
            return False
        if now < until or self._waiting[group]:
            return True
        del self._catching_up[group]
        return False
