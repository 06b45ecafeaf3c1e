"""Per-function parallelism that maximizes the source rate under a budget of instances.

The app sustains min over functions of capacity_f(k_f) / gain_f (gain: messages reaching f per source
message). With capacity curves that never decrease in k, adding the next instance to the current
bottleneck is exact: any allocation that beats greedy must give the bottleneck more instances than
greedy did, which greedy only withheld when it was not the bottleneck. A curve that stops rising
(a hot key group) stops the search: more instances there buy nothing, and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from pulsar_autoscale.errors import ConfigError

Curve = Callable[[int], float]


@dataclass(frozen=True)
class Allocation:
    parallelism: dict[str, int]
    rate: float  # source messages/s the allocation sustains (by the curves)
    budget: int  # instances allowed
    used: int  # instances used (less than budget when a bound or a capped curve stops it)
    limited_by: str  # what stopped it: "budget", "<function> at max bound", "<function> capped"


def _rate(curves: Mapping[str, Curve], gains: Mapping[str, float], k: Mapping[str, int]) -> tuple[float, str]:
    best, name = float("inf"), ""
    for f, c in curves.items():
        r = c(k[f]) / gains[f] if gains[f] > 0 else float("inf")
        if r < best:
            best, name = r, f
    return best, name


def allocation_path(
    curves: Mapping[str, Curve], gains: Mapping[str, float], budget: int, bounds: Mapping[str, tuple[int, int]] | None = None
) -> list[Allocation]:
    """Greedy allocations for every budget from the minimum up to `budget` (one pass: the greedy
    allocation for B+1 is that for B plus one instance), so a budget sweep costs one allocation."""
    bounds = bounds or {}
    k = {f: max(1, bounds.get(f, (1, 10**9))[0]) for f in curves}
    if sum(k.values()) > budget:
        raise ConfigError(f"budget {budget} is below the minimum parallelism of the functions ({sum(k.values())})")
    out: list[Allocation] = []
    limited = "budget"
    while True:
        rate, b = _rate(curves, gains, k)
        used = sum(k.values())
        out.append(Allocation(dict(k), rate, used, used, "budget"))
        if used >= budget:
            break
        hi = bounds.get(b, (1, 10**9))[1]
        if k[b] >= hi:
            limited = f"{b} at max bound {hi}"
            break
        if curves[b](k[b] + 1) <= curves[b](k[b]) * (1 + 1e-9):
            limited = f"{b} capped at {k[b]} instances"
            break
        k[b] += 1
    last = out[-1]
    out[-1] = Allocation(last.parallelism, last.rate, budget if limited == "budget" else last.used, last.used, limited)
    return out


def allocate(
    curves: Mapping[str, Curve], gains: Mapping[str, float], budget: int, bounds: Mapping[str, tuple[int, int]] | None = None
) -> Allocation:
    last = allocation_path(curves, gains, budget, bounds)[-1]
    return Allocation(last.parallelism, last.rate, budget, last.used, last.limited_by)


def for_rate(
    curves: Mapping[str, Curve],
    gains: Mapping[str, float],
    rate: float,
    max_budget: int,
    bounds: Mapping[str, tuple[int, int]] | None = None,
) -> Allocation | None:
    """The smallest greedy allocation that sustains `rate`, or None if `max_budget` does not."""
    for a in allocation_path(curves, gains, max_budget, bounds):
        if a.rate >= rate:
            return Allocation(a.parallelism, a.rate, a.used, a.used, "rate")
    return None


def fewest(ok: Callable[[int], bool], limit: int, hopeless: Callable[[int], bool] = lambda k: False) -> int | None:
    """The smallest k in 1..limit with ok(k), for an ok that turns true as k grows and stays true: doubling,
    then bisection. None when no k up to `limit` does, or once `hopeless(k)` says no larger k will."""
    prev, k = 0, 1
    while not ok(k):
        if k >= limit or hopeless(k):
            return None
        prev, k = k, min(2 * k, limit)
    lo = prev + 1
    while lo < k:
        mid = (lo + k) // 2
        if ok(mid):
            k = mid
        else:
            lo = mid + 1
    return k


Bound = Callable[[Mapping[str, int]], float]


def bounded_path(
    curves: Mapping[str, Curve],
    gains: Mapping[str, float],
    budget: int,
    shared: Bound,
    bounds: Mapping[str, tuple[int, int]] | None = None,
) -> list[Allocation]:
    """Allocations for every instance count up to `budget` when a shared resource also bounds the
    rate (`shared(parallelism)`: source messages/s it allows, e.g. the workers' interpreter locks).
    Adding an instance to the bottleneck is no longer always best (it may land on a worker whose lock
    is saturated), so each step tries every function and keeps the best rate; a step may lower the
    rate (more threads contend for a lock), so the allocation for a budget is the best of the path
    up to it (`best_within`)."""
    bounds = bounds or {}
    memo: dict[tuple[str, int], float] = {}

    def cap(f: str, k: int) -> float:
        if (f, k) not in memo:
            memo[(f, k)] = curves[f](k) / gains[f] if gains[f] > 0 else float("inf")
        return memo[(f, k)]

    def rate(k: Mapping[str, int]) -> tuple[float, str]:
        r, name = min((cap(f, k[f]), f) for f in curves)
        s = shared(k)
        return (s, "workers") if s < r else (r, name)

    k = {f: max(1, bounds.get(f, (1, 10**9))[0]) for f in curves}
    if sum(k.values()) > budget:
        raise ConfigError(f"budget {budget} is below the minimum parallelism of the functions ({sum(k.values())})")
    r, name = rate(k)
    out = [Allocation(dict(k), r, sum(k.values()), sum(k.values()), name)]
    while out[-1].used < budget:
        best = None
        for f in curves:
            if k[f] >= bounds.get(f, (1, 10**9))[1]:
                continue
            trial = {**k, f: k[f] + 1}
            tr, tn = rate(trial)
            if best is None or tr > best[0] * (1 + 1e-12):
                best = (tr, tn, trial)
        if best is None:
            break
        k, r, name = _improve(best[2], best[0], best[1], rate, bounds)
        out.append(Allocation(dict(k), r, sum(k.values()), sum(k.values()), name))
    return out


MOVE_SIZES = (1, 2, 4)  # instances moved at once: one placement shift can make a single move look worse


def _improve(
    k: dict[str, int], r: float, name: str, rate: Callable, bounds: Mapping[str, tuple[int, int]], rounds: int = 8
) -> tuple[dict[str, int], float, str]:
    """Move instances between functions while that raises the rate (the placement changes with every
    instance, so one greedy step can strand an instance where a worker's lock is saturated). Moves of
    several instances too: a better split can lie past splits that one instance at a time rates lower."""
    for _ in range(rounds):
        moved = False
        for size in MOVE_SIZES:
            for src in k:
                for dst in k:
                    if k[src] - size < max(1, bounds.get(src, (1, 10**9))[0]):
                        break  # a move would take src below its floor: no move of this size from it
                    if dst == src or k[dst] + size > bounds.get(dst, (1, 10**9))[1]:
                        continue
                    trial = {**k, src: k[src] - size, dst: k[dst] + size}
                    tr, tn = rate(trial)
                    if tr > r * (1 + 1e-9):
                        k, r, name, moved = trial, tr, tn, True
        if not moved:
            break
    return k, r, name


def best_within(path: list[Allocation], budget: int) -> Allocation:
    """The highest-rate allocation of `path` using at most `budget` instances (the fewest on a tie)."""
    best = None
    for a in path:
        if a.used > budget:
            break
        if best is None or a.rate > best.rate * (1 + 1e-12):
            best = a
    if best is None:
        raise ConfigError(f"budget {budget} is below the minimum parallelism of the functions")
    return Allocation(best.parallelism, best.rate, budget, best.used, best.limited_by)
