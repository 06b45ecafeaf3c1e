"""The planner's accuracy on the five simulated apps at budgets 2-22x the largest measured one, against
'linear from one instance' and 'DS2 one-shot' (pulsar_autoscale.planning.validate), and a plan for 2-3x
what the small testbed sustains checked in simulation (pulsar_autoscale.planning.sustain)."""

from __future__ import annotations

import pytest

from pulsar_autoscale.planning.mst import MstSettings
from pulsar_autoscale.planning.plan import build_model, default_budgets, predict
from pulsar_autoscale.planning.profile import profile_app
from pulsar_autoscale.planning.simbed import APPS, SimTestbed
from pulsar_autoscale.planning.sustain import sustain_app
from pulsar_autoscale.planning.validate import TARGET_MAX, TARGET_MEDIAN, validate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result():
    return validate()


def test_accuracy_targets(result):
    assert result["median_error"] <= TARGET_MEDIAN
    assert result["max_error"] <= TARGET_MAX


def test_interpreter_bound_app_within_target_and_trusted(result):
    assert result["per_app"]["interpreter"]["max_error"] <= TARGET_MAX
    assert result["models"]["interpreter"]["model"]["heldout_error"] <= 0.10


# windowed is not here: its non-linearity (an emission stall that parallelism divides) fades at large
# budgets, where the linear downstream function is the bottleneck, so the baselines come close there.
@pytest.mark.parametrize("app", ["interpreter", "zipf", "fanin"])
def test_baselines_are_worse_on_non_linear_apps(result, app):
    assert result["per_app"][app]["baselines_worse"]


def test_without_the_worker_probe_the_lock_app_is_refused_not_mispredicted():
    """The per-function profiles alone cannot compose a per-worker lock: the model misses the held-out
    budgets by more than 10% and the planner refuses rather than predicts."""
    tb = SimTestbed(APPS["interpreter"])
    model = build_model(tb, profile_app(tb, 8, MstSettings(), probe=False), default_budgets(3, 16))
    assert not predict(model, 64).band.trusted


# seed 5 of the interpreter-bound app: a plan that needs the better split of its 49 instances (more decode and
# publish threads, which wait less for the lock) to stay within the allowance rather than add a worker
@pytest.mark.parametrize("app, seed", [("linear", 0), ("interpreter", 0), ("interpreter", 5), ("fanin", 0)])
def test_plan_for_three_times_the_small_testbed(app, seed):
    row = sustain_app(app, seed=seed, factor=3.0)
    assert row.refused is None
    assert row.true_mst >= row.target  # the plan keeps up at 100%
    assert not row.overload_failed or row.true_mst < row.target * 1.15
    assert row.within_allowance  # at most the exhaustive minimum + max(1 per function, 10%)
    assert row.bare is not None and row.bare <= row.instances  # what the target needs without the headroom


def test_plan_is_refused_where_no_allocation_reaches_the_target():
    row = sustain_app("zipf", seed=0, factor=2.0)  # a hot key group caps count below 2x
    assert row.refused and row.exhaustive_min is None and row.passed
