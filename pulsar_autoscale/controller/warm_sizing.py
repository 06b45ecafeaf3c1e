"""How many warm standbys each function's worker should keep (functions/runtimes/warm_pool.py), asked each period.

A standby costs an idle interpreter (counted as instance-seconds at a fraction of an instance), and
helps only if a scale-out comes: so the pool is sized for the scale-out that is likely next, not for
the largest imaginable. The predicted next step is the larger of

- the largest scale-out step the function took within the window (a burst that came tends to come
  again: the demo's 10x steps, a daily peak), and
- the way back to its recent peak parallelism (a function scaled in after a peak is where a rise
  would take it again),

bounded by `min` and `max`. A function that never scaled out in the window keeps `min`. Pure: the
controller feeds it each period's applied parallelism and sends what it returns (worker mode only:
stock Pulsar has no warm pool).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from pulsar_autoscale.errors import ConfigError


@dataclass(frozen=True)
class WarmPoolConfig:
    """controller.yaml `warm_pool:`; off by default (the worker's own --warm-pool size stays)."""

    enabled: bool = False
    min: int = 0
    max: int = 4
    window_s: float = 600.0

    def __post_init__(self):
        if self.min < 0 or self.max < self.min:
            raise ConfigError(f"warm_pool: need 0 <= min <= max, got min {self.min}, max {self.max}")
        if self.window_s <= 0:
            raise ConfigError(f"warm_pool.window_s must be > 0, got {self.window_s}")


def pool_size(history: list[tuple[float, int]], now: float, config: WarmPoolConfig) -> int:
    """Standbys for one function from its (time, parallelism) history, oldest first, the last entry current."""
    recent = [(t, k) for t, k in history if now - t <= config.window_s]
    if not recent:
        return config.min
    current = recent[-1][1]
    largest_step = max((b - a for (_, a), (_, b) in zip(recent, recent[1:])), default=0)
    to_peak = max(k for _, k in recent) - current
    return max(config.min, min(config.max, max(largest_step, to_peak)))


class WarmPoolSizer:
    """Per-function parallelism history and the size last sent (sent again only when it changes, or after
    the worker refused or failed it)."""

    def __init__(self, config: WarmPoolConfig):
        self.config = config
        self._history: dict[str, deque[tuple[float, int]]] = {}
        self._sent: dict[str, int] = {}

    def observe(self, function: str, parallelism: int, now: float) -> None:
        history = self._history.setdefault(function, deque())
        if not history or history[-1][1] != parallelism:
            history.append((now, parallelism))
        while len(history) > 1 and now - history[1][0] > self.config.window_s:
            history.popleft()  # the oldest entry stays while it is still the parallelism at the window's start

    def changes(self, now: float) -> dict[str, int]:
        """Functions whose pool should change now, with the new size."""
        out = {}
        for fn, history in self._history.items():
            entries = list(history)
            if entries and now - entries[0][0] > self.config.window_s:
                entries[0] = (now - self.config.window_s, entries[0][1])  # held since before the window
            size = pool_size(entries, now, self.config)
            if self._sent.get(fn) != size:
                out[fn] = size
        return out

    def sent(self, function: str, size: int | None) -> None:
        """Record what the worker accepted (None: it did not, so it is asked again next period)."""
        if size is None:
            self._sent.pop(function, None)
        else:
            self._sent[function] = size

    def forget(self, keep: set[str]) -> None:
        for fn in set(self._history) - keep:
            self._history.pop(fn, None)
            self._sent.pop(fn, None)
