"""The planner's accuracy on the five simulated apps at budgets 2-22x the largest measured one, against
'linear from one instance' and 'DS2 one-shot' (pulsar_autoscale.planning.validate; about 2 s)."""

from __future__ import annotations

import pytest

from pulsar_autoscale.planning.plan import predict
from pulsar_autoscale.planning.validate import TARGET_MAX, validate, validate_app

pytestmark = pytest.mark.slow

LEARNABLE = ("linear", "zipf", "windowed", "fanin")


@pytest.fixture(scope="module")
def result():
    return validate(LEARNABLE)


def test_accuracy_targets(result):
    assert result["median_error"] <= 0.05
    assert result["max_error"] <= TARGET_MAX


# windowed is not here: its non-linearity (an emission stall that parallelism divides) fades at large
# budgets, where the linear downstream function is the bottleneck, so the baselines come close there.
@pytest.mark.parametrize("app", ["zipf", "fanin"])
def test_baselines_are_worse_on_non_linear_apps(result, app):
    assert result["per_app"][app]["baselines_worse"]


@pytest.mark.xfail(strict=True, reason="per-worker interpreter lock shared by co-located functions: the "
                                       "per-function profiles do not compose, no family fits within 8%")
def test_interpreter_bound_app_within_target():
    rows, _ = validate_app("interpreter")
    assert max(r.error for r in rows) <= TARGET_MAX


def test_interpreter_bound_app_is_refused_not_mispredicted():
    rows, model = validate_app("interpreter")
    assert all(not predict(model, r.budget).band.trusted for r in rows)
