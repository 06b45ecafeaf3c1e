"""Model families for capacity against resources, chosen by how well they predict what they did not see.

StreamBed fits MST against budget with linear, logarithmic and square-root regressions and keeps
the one that best predicts the upper half of the measured budgets when trained on the lower half
(extrapolation is what the model is for, so that is what selection tests). We add a power law
(a x^p + c, which covers everything from a plateau to linear), for per-function curves `rate-cost`
(x = a y + b y^2: a per-message cost that grows with the rate, chosen only where the plain families
miss by more than the noise) and, for whole apps, `profile`: the
allocation over per-function capacity curves scaled by one fitted factor, which follows kinks
(a function that stops scaling, a bottleneck that moves) that no single smooth curve does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence, cast

import numpy as np

from pulsar_autoscale.errors import ConfigError

BASIS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "linear": lambda x: x,
    "log": np.log,
    "sqrt": np.sqrt,
}
POWERS = np.round(np.arange(0.1, 1.51, 0.02), 4)
FAMILIES = ("linear", "log", "sqrt", "power")
MAX_EXTRAPOLATION = 25.0  # beyond this many times the largest measured x, refuse
MAX_HELDOUT_ERROR = 0.10  # a chosen model worse than this on held-out points is not trusted
RATE_COST_MARGIN = 0.03  # rate-cost is chosen only where every plain family misses by more than this


@dataclass(frozen=True)
class Fit:
    family: str
    params: tuple[float, ...]  # linear/log/sqrt: (a, c); power: (a, p, c); profile: (alpha,)
    train_rmse: float
    heldout_error: float = math.nan  # mean |pred - y| / y on the held-out upper half
    heldout_max: float = math.nan  # max of the same
    x_max: float = math.nan  # largest x it was fitted on
    shape: Callable[[np.ndarray], np.ndarray] | None = None  # profile only: the unscaled curve

    def predict(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if self.family in BASIS:
            a, c = self.params
            return a * BASIS[self.family](x) + c
        if self.family == "power":
            a, p, c = self.params
            return a * x**p + c
        if self.family == "profile":
            # a profile Fit is built with its curve (fit() refuses one without)
            return self.params[0] * cast(Callable[[np.ndarray], np.ndarray], self.shape)(x)
        if self.family == "rate-cost":
            a, b = self.params
            if b <= 0:
                return x / a
            return (-a + np.sqrt(a * a + 4 * b * np.maximum(x, 0.0))) / (2 * b)
        raise ConfigError(f"unknown model family {self.family!r}")

    def formula(self) -> str:
        if self.family == "linear":
            return f"{self.params[0]:.4g}*x + {self.params[1]:.4g}"
        if self.family in ("log", "sqrt"):
            return f"{self.params[0]:.4g}*{self.family}(x) + {self.params[1]:.4g}"
        if self.family == "power":
            return f"{self.params[0]:.4g}*x^{self.params[1]:.3g} + {self.params[2]:.4g}"
        if self.family == "rate-cost":
            return f"y where x = {self.params[0]:.4g}*y + {self.params[1]:.4g}*y^2"
        return f"{self.params[0]:.4g}*profile(x)"

    def to_json(self) -> dict:
        return {
            "family": self.family,
            "params": list(self.params),
            "formula": self.formula(),
            "train_rmse": self.train_rmse,
            "heldout_error": self.heldout_error,
            "heldout_max": self.heldout_max,
            "x_max": self.x_max,
        }


def fit(
    family: str,
    xs: Sequence[float] | np.ndarray,
    ys: Sequence[float] | np.ndarray,
    shape: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Fit:
    """Least squares of one family."""
    x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    params: tuple[float, ...]
    if len(x) < 1 or np.any(x <= 0):
        raise ConfigError("model fits need at least one point with x > 0")
    if family in BASIS:
        if len(x) == 1:
            params = (float(y[0] / BASIS[family](x)[0]) if BASIS[family](x)[0] else 0.0, 0.0)
        else:
            A = np.column_stack([BASIS[family](x), np.ones_like(x)])
            params = tuple(float(v) for v in np.linalg.lstsq(A, y, rcond=None)[0])
    elif family == "power":
        best: tuple[float, tuple[float, float, float]] | None = None
        for p in POWERS:
            A = np.column_stack([x**p, np.ones_like(x)])
            (a, c), *_ = np.linalg.lstsq(A, y, rcond=None)
            err = float(np.sum((A @ np.array([a, c]) - y) ** 2))
            if best is None or err < best[0] - 1e-12:
                best = (err, (float(a), float(p), float(c)))
        assert best is not None  # POWERS is not empty
        params = best[1]
    elif family == "rate-cost":
        # x instances sustain y when x = a y + b y^2: a per-message cost that grows with the rate
        A = np.column_stack([y, y * y])
        a, b = np.linalg.lstsq(A, x, rcond=None)[0]
        if b < 0 or a <= 0:
            a, b = float(np.dot(x, y) / np.dot(y, y)), 0.0
        params = (float(a), float(b))
    elif family == "profile":
        if shape is None:
            raise ConfigError("the profile family needs the profile's curve")
        s = shape(x)
        params = (float(np.dot(s, y) / np.dot(s, s)) if np.dot(s, s) > 0 else 1.0,)
    else:
        raise ConfigError(f"unknown model family {family!r}: use one of {', '.join(FAMILIES)} or profile")
    f = Fit(family, params, 0.0, x_max=float(x.max()), shape=shape)
    rmse = float(np.sqrt(np.mean((f.predict(x) - y) ** 2)))
    return Fit(family, params, rmse, x_max=float(x.max()), shape=shape)


def heldout(
    family: str, xs: Sequence[float], ys: Sequence[float], shape: Callable[[np.ndarray], np.ndarray] | None = None
) -> tuple[float, float]:
    """Train on the lower half of x, test on the upper half: (mean, max) relative error."""
    order = np.argsort(xs)
    x, y = np.asarray(xs, dtype=float)[order], np.asarray(ys, dtype=float)[order]
    n_train = max(1, len(x) // 2)
    if len(x) - n_train < 1:
        return math.nan, math.nan
    f = fit(family, x[:n_train], y[:n_train], shape)
    rel = np.abs(f.predict(x[n_train:]) - y[n_train:]) / np.maximum(np.abs(y[n_train:]), 1e-12)
    return float(rel.mean()), float(rel.max())


def select(
    xs: Sequence[float],
    ys: Sequence[float],
    families: Sequence[str] = FAMILIES,
    shape: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[Fit, list[Fit]]:
    """Every family's held-out error, and the best one refitted on all points. A family needing more
    parameters than the training half has points is skipped (it would interpolate, not extrapolate)."""
    n_train = max(1, len(xs) // 2)
    candidates = []
    for fam in families:
        if fam == "profile" and shape is None:
            continue
        if fam == "power" and n_train < 3:
            continue
        mean, mx = heldout(fam, xs, ys, shape)
        full = fit(fam, xs, ys, shape)
        candidates.append(Fit(fam, full.params, full.train_rmse, mean, mx, full.x_max, shape))
    if not candidates:
        raise ConfigError("no model family could be fitted")
    scored = [c for c in candidates if not math.isnan(c.heldout_error)] or candidates
    key = lambda c: c.heldout_error if not math.isnan(c.heldout_error) else c.train_rmse  # noqa: E731
    best = min(scored, key=key)
    plain = [c for c in scored if c.family != "rate-cost"]
    if best.family == "rate-cost" and plain and key(min(plain, key=key)) <= RATE_COST_MARGIN:
        best = min(plain, key=key)  # the plain families already predict within the noise
    return best, candidates


def invert(f: Fit, target: float, x_lo: float = 1.0, x_hi: float = 1e6) -> float | None:
    """The smallest x where the model reaches `target` (models rise with x), or None if it never does."""
    if f.predict(x_hi) < target:
        return None
    if f.predict(x_lo) >= target:
        return x_lo
    lo, hi = x_lo, x_hi
    for _ in range(100):
        mid = math.sqrt(lo * hi) if hi / lo > 2 else (lo + hi) / 2
        if f.predict(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class Band:
    low: float
    high: float
    relative: float  # half-width as a share of the prediction
    extrapolation: float  # x / largest measured x
    trusted: bool
    note: str


def band(f: Fit, x: float, prediction: float) -> Band:
    """An error band: the held-out error (at least 2%: measurement noise), widened with the square root
    of how far past the held-out test range we go; past MAX_EXTRAPOLATION, or with a held-out error
    over MAX_HELDOUT_ERROR, the prediction is not trusted."""
    ext = x / f.x_max if f.x_max > 0 else math.inf
    base = max(f.heldout_max if not math.isnan(f.heldout_max) else 0.1, 0.02)
    rel = base * max(1.0, math.sqrt(max(ext, 1.0) / 2))
    trusted, note = True, "within limits"
    if ext > MAX_EXTRAPOLATION:
        trusted, note = False, f"{ext:.0f}x the largest measured budget (limit {MAX_EXTRAPOLATION:.0f}x): measure larger budgets"
    elif not math.isnan(f.heldout_error) and f.heldout_error > MAX_HELDOUT_ERROR:
        trusted, note = (
            False,
            (
                f"held-out error {f.heldout_error:.1%} > {MAX_HELDOUT_ERROR:.0%}: the model does "
                f"not extrapolate these measurements; measure larger budgets"
            ),
        )
    return Band(prediction * (1 - rel), prediction * (1 + rel), rel, ext, trusted, note)
