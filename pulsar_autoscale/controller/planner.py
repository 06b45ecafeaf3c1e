"""The Plan step: what every policy's proposal goes through, once, before anything is executed.

Policies say what they would like; the Plan step holds the operational rules, so no policy
re-implements them (Ray Serve wraps user policies the same way). Per function, in order:

0. a paused function is left as it is; a function at parallelism 0 wakes (to its min, at least
   1) as soon as its input has a backlog or arrivals; a function whose min is 0 goes to 0 after
   `idle_s` with an empty backlog and no arrivals (scale to zero);
1. bounds: the function's own (FunctionPlan, from its controls), else the first glob pattern in
   `bounds` that matches the name, else the defaults;
2. scale-in stabilization: scale in only to the highest recommendation of the last
   `scale_in_stabilization_s` seconds (Kubernetes HPA's downscale stabilization); and for
   `fast_scale_in_hold_s` after a fast scale-out, no regular period scales in below it: until
   then the period's metrics window still holds the time before the burst, so its lower
   recommendation says nothing about whether the load has fallen (after the hold it does);
3. no scale-in while the backlog is above `draining_backlog` (FLINK-31318: scaling in a job
   that is still catching up makes it fall behind again); an unknown backlog does not block;
4. at most `max_step` instances added or removed;
5. cooldown: no change within `cooldown_s` of the last change that was applied, i.e. that the
   next period's `current` shows; a recommendation that was not applied (dry run, failed
   execution) does not start a cooldown;
6. bounds again: they are hard limits and win over steps 2-5 when `current` lies outside them.

At a fast check (`fast=True`, controller.fast) the proposal holds scale-outs only; its
recommendations enter the stabilization window only where they scale out, so a second of "keep"
never blocks the regular period's scale-in.

Pure: time comes in as `now` and memory goes in and out as PlanState, so the simulator runs the
very same code and a period can be replayed.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.policies.base import Proposal
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot


class PolicyError(PulsarAutoscaleError):
    """A policy returned something the Plan step cannot use."""


@dataclass(frozen=True)
class PlanConfig:
    min_parallelism: int = 1
    max_parallelism: int = 15
    bounds: tuple[tuple[str, int, int], ...] = ()  # (glob on tenant/namespace/name, min, max); first match wins
    cooldown_s: float = 0.0  # no change to a function this soon after its last applied one
    scale_in_stabilization_s: float = 0.0  # scale in only to the max recommendation of this window
    fast_scale_in_hold_s: float = 0.0  # no period scales in below a fast scale-out for this long
    max_step: int | None = None  # most instances added or removed in one decision
    no_scale_in_while_draining: bool = True
    draining_backlog: float = 100.0  # messages: above this a backlog counts as draining
    scale_out_headroom: float = 0.0  # scale out to ceil(target * (1 + headroom)): fewer, larger steps
    min_scale_in: int = 1  # scale in only when it frees at least this many instances
    scale_to_zero_idle_s: float = 300.0  # a function with min 0 goes to 0 after this long idle

    def __post_init__(self):
        for pattern, lo, hi in ((None, self.min_parallelism, self.max_parallelism), *self.bounds):
            if not (0 <= lo <= hi and hi >= 1):
                where = f"bounds {pattern!r}" if pattern is not None else "min/max_parallelism"
                raise ConfigError(f"plan {where}: need 0 <= min <= max and max >= 1, got {lo} and {hi}")
        if self.scale_to_zero_idle_s < 0:
            raise ConfigError(f"plan scale_to_zero_idle_s must be >= 0 seconds, got {self.scale_to_zero_idle_s}")
        if self.max_step is not None and self.max_step < 1:
            raise ConfigError(f"plan max_step must be >= 1 (or None), got {self.max_step}")
        if self.scale_out_headroom < 0 or self.min_scale_in < 1:
            raise ConfigError(
                f"plan scale_out_headroom must be >= 0 and min_scale_in >= 1, got "
                f"{self.scale_out_headroom} and {self.min_scale_in}"
            )

    def limits(self, function: str) -> tuple[int, int]:
        for pattern, lo, hi in self.bounds:
            if fnmatch.fnmatchcase(function, pattern):
                return lo, hi
        return self.min_parallelism, self.max_parallelism

    def rules(self, function: str) -> "FunctionPlan":
        return FunctionPlan(*self.limits(function), idle_s=self.scale_to_zero_idle_s)


@dataclass(frozen=True)
class FunctionPlan:
    """One function's own rules, from its controls (controls.py): bounds, pause, idle time."""

    min: int
    max: int
    paused: bool = False
    idle_s: float = 300.0


class Stamped(NamedTuple):
    """A parallelism at a time: a recommendation, or a change that was decided."""

    time: float
    parallelism: int


@dataclass(frozen=True)
class PlanState:
    """What the Plan step remembers between periods; `plan` returns a new one, never mutates."""

    last_change: Mapping[str, Stamped] = field(default_factory=dict)
    recent: Mapping[str, tuple[Stamped, ...]] = field(default_factory=dict)  # recommendations in the window
    idle_since: Mapping[str, float] = field(default_factory=dict)  # min-0 functions: idle since (empty input)
    fast_out: Mapping[str, Stamped] = field(default_factory=dict)  # the last fast scale-out, while it holds


@dataclass(frozen=True)
class Decision:
    function: str
    old: int
    proposed: int  # what the policy asked for
    new: int  # what the Plan step allows
    reason: str  # the policy's reason, then every rule that changed the value
    inputs: FunctionSnapshot | None = None
    changed: bool = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "changed", self.new != self.old)


def validate_proposal(proposal: object, graph_or_names: Container[str]) -> None:
    """Refuse what no Plan step can repair: not a Proposal, unknown functions, parallelism that is
    not an integer (a bool is not one) or is below 1."""
    if not isinstance(proposal, Proposal):
        raise PolicyError(f"decide() returned {type(proposal).__name__}, not a Proposal")
    for fn, value in proposal.targets.items():
        if fn not in graph_or_names:
            raise PolicyError(f"policy proposed parallelism {value!r} for unknown function {fn!r}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise PolicyError(f"policy proposed a non-integer parallelism {value!r} for {fn}")
        if value < 1:
            raise PolicyError(f"policy proposed parallelism {value} for {fn}: must be at least 1")


class Planner:
    def __init__(self, config: PlanConfig | None = None):
        self.config = config or PlanConfig()

    def plan(
        self,
        proposal: Proposal,
        snapshot: Snapshot,
        current: Mapping[str, int],
        state: PlanState,
        now: float,
        fast: bool = False,
        rules: Mapping[str, FunctionPlan] | None = None,
    ) -> tuple[list[Decision], PlanState]:
        """One Decision per function in `current` (a function the proposal omits keeps its value);
        `rules` are per-function bounds, pause and idle time (default: the config's)."""
        c = self.config
        last_change = {fn: s for fn, s in state.last_change.items() if fn in current}
        recent: dict[str, tuple[Stamped, ...]] = {}
        idle_since: dict[str, float] = {}
        fast_out = {fn: s for fn, s in state.fast_out.items() if fn in current and now - s.time < c.fast_scale_in_hold_s}
        decisions = []
        for fn, old in current.items():
            rule = (rules or {}).get(fn) or c.rules(fn)
            fs = snapshot.functions.get(fn)
            zero = _scale_to_zero(fn, old, rule, fs, float(state.idle_since.get(fn, now)), now, fast)
            if isinstance(zero, float):
                idle_since[fn] = zero
            elif zero is not None:
                if zero.changed:
                    last_change[fn] = Stamped(now, zero.new)
                decisions.append(zero)
                continue
            proposed = proposal.targets.get(fn, old)
            why = [proposal.reasons.get(fn, "") if fn in proposal.targets else "no proposal: keep"]
            lo, hi = rule.min, rule.max
            new = min(max(proposed, lo), hi)
            if new != proposed:
                why.append(f"bounded to [{lo}, {hi}]")
            if c.scale_in_stabilization_s > 0:
                window = tuple(s for s in state.recent.get(fn, ()) if now - s.time < c.scale_in_stabilization_s)
                recent[fn] = window + ((Stamped(now, new),) if not fast or new > old else ())
                stable = min(max((s.parallelism for s in recent[fn]), default=new), old)
                if new < stable:
                    why.append(f"stabilization: highest recommendation in {c.scale_in_stabilization_s:g}s is {stable}")
                    new = stable
            held = fast_out.get(fn)
            if not fast and held is not None and new < min(held.parallelism, old):
                why.append(
                    f"fast scale-out to {held.parallelism} {now - held.time:.0f}s ago: no scale-in within "
                    f"{c.fast_scale_in_hold_s:g}s of it"
                )
                new = min(held.parallelism, old)
            if new > old and c.scale_out_headroom > 0:
                grown = math.ceil(new * (1 + c.scale_out_headroom) - 1e-9)
                if grown > new:
                    why.append(f"headroom {c.scale_out_headroom:g}: {grown}")
                    new = grown
            if new < old and old - new < c.min_scale_in:
                why.append(f"scale-in by {old - new} < min_scale_in {c.min_scale_in}: keep")
                new = old
            if (
                new < old
                and c.no_scale_in_while_draining
                and fs is not None
                and fs.backlog is not None
                and fs.backlog > c.draining_backlog
            ):
                why.append(f"no scale-in while backlog {fs.backlog:.0f} > {c.draining_backlog:g} drains")
                new = old
            if c.max_step is not None and abs(new - old) > c.max_step:
                new = old + (c.max_step if new > old else -c.max_step)
                why.append(f"max step {c.max_step}")
            last = last_change.get(fn)
            if new != old and last is not None and last.parallelism == old and now - last.time < c.cooldown_s:
                why.append(f"cooldown: last change {now - last.time:.0f}s ago < {c.cooldown_s:g}s")
                new = old
            if not lo <= new <= hi:
                new = min(max(new, lo), hi)
                why.append(f"outside bounds [{lo}, {hi}]: {new}")
            if new != old:
                last_change[fn] = Stamped(now, new)
                if fast and new > old and c.fast_scale_in_hold_s > 0:
                    fast_out[fn] = Stamped(now, new)
            decisions.append(Decision(fn, old, proposed, new, "; ".join(w for w in why if w), fs))
        return decisions, PlanState(last_change=last_change, recent=recent, idle_since=idle_since, fast_out=fast_out)


def _scale_to_zero(
    fn: str, old: int, rule: FunctionPlan, fs: FunctionSnapshot | None, idle_since: float, now: float, fast: bool
) -> Decision | float | None:
    """Pause, sleep and wake, before any policy: a Decision when they decide, the time the function
    has been idle since while it counts towards scale to zero, None when the policy decides. Only the
    regular period puts a function to sleep; a fast check may wake one."""
    if rule.paused:
        return Decision(fn, old, old, old, "paused by operator: left as it is", fs)
    backlog = fs.backlog if fs is not None else None
    arrivals = fs.arrival_rate if fs is not None else None
    busy = (backlog or 0) > 0 or (arrivals or 0) > 0
    if old == 0:
        if busy or rule.min > 0:
            new = max(rule.min, 1)
            why = f"wake: backlog {backlog or 0:.0f}, arrivals {arrivals or 0:.2f}/s" if busy else f"below min {rule.min}"
            return Decision(fn, 0, new, new, why, fs)
        return Decision(fn, 0, 0, 0, "asleep: input empty", fs)
    if rule.min > 0 or busy:
        return None
    if backlog is None:
        # A fast check that saw nothing received has no backlog figure: it carries the idle clock on, where a
        # reset would keep a function with the fast path on from ever going to sleep.
        return idle_since if fast else None
    if not fast and now - idle_since >= rule.idle_s:
        return Decision(
            fn, old, 0, 0, f"idle {now - idle_since:.0f}s with an empty backlog >= {rule.idle_s:g}s: scale to zero", fs
        )
    return idle_since


# Where every update restarts all instances (stock Pulsar), fewer and larger changes pay off: wait
# three periods between updates, scale in only on five periods of evidence and by two instances or
# more, and scale out a quarter beyond the target so the next step up needs no second restart.
RESTART_AWARE = {"cooldown_periods": 3, "stabilization_periods": 5, "scale_out_headroom": 0.25, "min_scale_in": 2}


def restart_aware(plan: Mapping, period_s: float) -> dict:
    """Plan settings for a runtime that restarts every instance on each update; explicit ones win."""
    out = dict(plan)
    out.setdefault("cooldown_s", RESTART_AWARE["cooldown_periods"] * period_s)
    out.setdefault("scale_in_stabilization_s", RESTART_AWARE["stabilization_periods"] * period_s)
    out.setdefault("scale_out_headroom", RESTART_AWARE["scale_out_headroom"])
    out.setdefault("min_scale_in", RESTART_AWARE["min_scale_in"])
    return out


def apply_caps(decisions: list[Decision], caps: Mapping[str, int]) -> list[Decision]:
    """Never plan more instances than can consume: under FAILOVER (retainOrdering) one instance per
    input partition is active and the rest sit idle, so parallelism is capped at the partition count."""
    out = []
    for d in decisions:
        cap = caps.get(d.function)
        if cap is not None and d.new > cap and d.new > d.old:  # growing past the cap adds idle instances
            d = Decision(
                d.function,
                d.old,
                d.proposed,
                max(cap, d.old),
                f"{d.reason}; FAILOVER: only {cap} input partition(s) can be consumed",
                d.inputs,
            )
        out.append(d)
    return out
