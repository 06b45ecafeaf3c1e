"""A plan made on a small testbed for 2-3x what that testbed sustains, checked in simulation.

For each simulated app and seed: profile and measure budgets up to `largest` instances (the small
testbed: what this machine can run), take the MST of the largest measured budget as what the
machine sustains, plan for `factor` times that, then run the planned deployment on a fresh simulated
testbed (other noise) for `observe_s` (10 minutes) at 100% of the target (it must keep up with p99
under the SLO) and at 115% (it must fall behind: the plan is not padded beyond its headroom; a plan with
the exhaustive minimum's instances that keeps up there is not padded either: fewer instances do not cover the
target + headroom).

The plan is made for the SLO (functions fed by a window's bursts sized to drain one within it), and
its instance count is compared with the exhaustive minimum: the fewest instances, over every allocation
of the functions on the same workers rule, whose true MST covers the target plus the plan's headroom and
whose p99 at the target is under the SLO; the plan may use at most that plus max(one per function, 10%).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import Sequence

from pulsar_autoscale.planning.allocate import fewest
from pulsar_autoscale.planning.mst import MstSettings, judge
from pulsar_autoscale.planning.plan import build_model, default_budgets, plan_for_rate
from pulsar_autoscale.planning.profile import profile_app
from pulsar_autoscale.planning.simbed import APPS, SimTestbed
from pulsar_autoscale.planning.testbed import Phases, TestConfig

FACTORS = (2.0, 3.0)
SEEDS = (0, 1, 2, 3, 4)
OVERLOAD = 1.15
SLO_P99_S = 2.0
OBSERVE_S = 600.0


@dataclass(frozen=True)
class SustainRow:
    app: str
    seed: int
    factor: float
    machine_mst: float  # MST of the largest budget the small testbed measured
    target: float
    instances: int  # the plan's
    workers: int
    predicted: float
    true_mst: float  # the simulator's exact MST of the plan (ground truth)
    exhaustive_min: int | None  # fewest instances whose true MST covers target x (1 + headroom); None: none does
    allowed: int | None  # exhaustive_min + max(functions, 10%)
    refused: str | None
    sustained: bool  # 100%: kept up, p99 under the SLO
    p99_s: float | None
    reason: str
    overload_failed: bool  # 115%: fell behind (or broke the SLO)
    overload_reason: str
    bare: int | None = None  # the plan's `without_headroom` instances: what covers the target alone

    @property
    def within_allowance(self) -> bool:
        return self.allowed is not None and self.instances <= self.allowed

    @property
    def not_padded(self) -> bool:
        """Fell behind at 115%, or used no more than the exhaustive minimum: fewer instances do not cover the
        target + headroom, so a minimum that also keeps up at 115% is the step between instance counts."""
        return self.overload_failed or (self.exhaustive_min is not None and self.instances <= self.exhaustive_min)

    @property
    def passed(self) -> bool:
        """Planned and checked: sustained, not padded, within the allowance; or refused where no allocation
        reaches the target (the refusal is right)."""
        if self.refused:
            return self.exhaustive_min is None
        return self.sustained and self.not_padded and self.within_allowance


def exhaustive_min(
    testbed: SimTestbed,
    need: float,
    start: dict[str, int] | None = None,
    limit: int = 4096,
    slo: tuple[float, float] | None = None,
) -> int | None:
    """The fewest instances over every allocation whose true MST is at least `need` (the testbed's
    own workers rule) and, with `slo` = (rate, p99 seconds), whose p99 at that rate is under it; None if
    no function count up to `limit` does. Each function's lower bound is the fewest instances with which
    it does when every other function has plenty; allocations are enumerated from the sum of those up."""
    fns = testbed.functions()
    big = max(64, 4 * sum((start or {}).values()))

    def keeps_up(par: dict[str, int]) -> bool:  # true MST >= need (and the SLO), without the bisection
        cfg = TestConfig(par)
        return testbed.utilization(need, cfg)[0] < 1.0 and (slo is None or testbed.p99(slo[0], cfg) <= slo[1])

    def alone(f: str) -> int | None:  # f's fewest instances when every other function has plenty
        return fewest(lambda k: keeps_up({**{g: big for g in fns}, f: k}), limit)

    lower = {}
    for f in fns:
        k = alone(f)
        if k is None:
            return None
        lower[f] = k
    n = sum(lower.values())
    while n <= limit:
        extra = n - sum(lower.values())
        for split in _compositions(extra, len(fns)):
            par = {f: lower[f] + e for f, e in zip(fns, split)}
            if keeps_up(par):
                return n
        n += 1
    return None


def _compositions(total: int, parts: int):
    """Every way to write `total` as `parts` non-negative integers."""
    for cuts in itertools.combinations(range(total + parts - 1), parts - 1):
        prev, out = -1, []
        for c in cuts:
            out.append(c - prev - 1)
            prev = c
        out.append(total + parts - 1 - prev - 1)
        yield out


def sustain_app(
    name: str,
    seed: int,
    factor: float,
    largest: int = 16,
    profile_parallelism: int = 8,
    headroom: float = 0.10,
    slo_p99_s: float = SLO_P99_S,
    observe_s: float = OBSERVE_S,
    settings: MstSettings = MstSettings(),
) -> SustainRow:
    testbed = SimTestbed(APPS[name], seed=seed)
    profile = profile_app(testbed, profile_parallelism, settings)
    model = build_model(testbed, profile, default_budgets(len(testbed.functions()), largest), settings)
    machine = model.points[-1].measured.mst
    target = factor * machine
    plan = plan_for_rate(model, target, headroom, slo_p99_s=slo_p99_s)
    check = SimTestbed(APPS[name], seed=seed + 2000)
    least = exhaustive_min(check, target * (1 + headroom), plan.parallelism, slo=(target, slo_p99_s))
    allowed = None if least is None else least + max(len(plan.parallelism), math.ceil(0.1 * least))
    if plan.refused:
        return SustainRow(
            name,
            seed,
            factor,
            machine,
            target,
            sum(plan.parallelism.values()),
            plan.workers,
            plan.predicted_mst,
            math.nan,
            least,
            allowed,
            plan.refused,
            False,
            None,
            "refused",
            False,
            "refused",
        )
    cfg = TestConfig(dict(plan.parallelism))
    phases = Phases(settings.phases.cooldown_s, settings.phases.ramp_s, observe_s)
    slo = MstSettings(slo_p99_s=slo_p99_s, phases=phases)
    at = check.run(target, cfg, phases)
    over = check.run(target * OVERLOAD, cfg, phases)
    ok, reason = judge(at, slo)
    over_ok, over_reason = judge(over, slo)
    return SustainRow(
        name,
        seed,
        factor,
        machine,
        target,
        sum(plan.parallelism.values()),
        plan.workers,
        plan.predicted_mst,
        check.true_mst(cfg),
        least,
        allowed,
        None,
        ok,
        at.p99_s,
        reason,
        not over_ok,
        over_reason,
        plan.bare.budget if plan.bare else None,
    )


def sustain(apps: Sequence[str] = tuple(APPS), seeds: Sequence[int] = SEEDS, factors: Sequence[float] = FACTORS, **kw) -> dict:
    rows = [sustain_app(a, s, f, **kw) for a in apps for s in seeds for f in factors]
    ok = all(r.passed for r in rows)
    return {
        "rows": [
            asdict(r) | {"within_allowance": r.within_allowance, "not_padded": r.not_padded, "passed": r.passed} for r in rows
        ],
        "passed": ok,
        "slo_p99_s": kw.get("slo_p99_s", SLO_P99_S),
        "observe_s": kw.get("observe_s", OBSERVE_S),
        "overload": OVERLOAD,
    }


def format_sustain(result: dict) -> str:
    head = (
        f"{'app':<12}{'seed':>5}{'x':>4}{'machine':>9}{'target':>9}{'inst':>6}{'min':>5}{'wkrs':>5}"
        f"{'pred':>9}{'true':>9}{'100%':>6}{'p99 s':>7}{'115%':>7}{'bare':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        p99 = f"{r['p99_s']:.2f}" if r["p99_s"] is not None else "-"
        if r["refused"]:
            least = "none" if r["exhaustive_min"] is None else str(r["exhaustive_min"])
            lines.append(
                f"{r['app']:<12}{r['seed']:>5}{r['factor']:>4g}{r['machine_mst']:>9.0f}{r['target']:>9.0f}"
                f"  refused ({'right' if r['passed'] else 'WRONG'}: exhaustive minimum {least}): "
                f"{r['refused'][:60]}"
            )
            continue
        lines.append(
            f"{r['app']:<12}{r['seed']:>5}{r['factor']:>4g}{r['machine_mst']:>9.0f}{r['target']:>9.0f}"
            f"{r['instances']:>6}{r['exhaustive_min'] or '-':>5}{r['workers']:>5}{r['predicted']:>9.0f}"
            f"{r['true_mst']:>9.0f}{'ok' if r['sustained'] else 'FAIL':>6}{p99:>7}"
            f"{'fails' if r['overload_failed'] else ('min' if r['not_padded'] else 'KEPT'):>7}{r.get('bare') or '-':>6}"
        )
    lines.append(
        f"100%: sustained with p99 <= {result['slo_p99_s']} s over {result['observe_s']:.0f} s; "
        f"{result['overload']:.0%}: falls behind ('min': kept up, with the exhaustive minimum's instances, which is "
        "not padding); instances <= exhaustive minimum + max(1 per function, 10%): "
        f"{'PASSED' if result['passed'] else 'FAILED'}; bare: the plan's instances for the target "
        "without headroom"
    )
    return "\n".join(lines)
