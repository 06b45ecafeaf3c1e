"""Applications for the simulator: functions, the topics between them, and service-time distributions.

`paper-image` is the paper's Fig. 3 (and our demo's) application. The paper reports no service
times, so we chose them from what such functions cost on one core, each lognormal because
per-image work grows with image size and has a right tail:

- resize (both copies): mean 20 ms, cv 0.5: a JPEG decode + downscale of a phone-sized image;
- recognition: mean 250 ms, cv 0.5: a small CNN (MobileNet-class TensorFlow model) on a CPU core.

With these, recognition is the only function that needs more than one instance at the `paper`
workload's rates (4-14 msg/s), as in the paper, where it was the only one with a queue.

`dag6` is a 6-function DAG with fan-out (`ingest`'s topic feeds `parse` and `geo`) and fan-in
(`score` consumes the outputs of both), plus a second sink (`archive`), with mixed distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pulsar_autoscale.errors import ConfigError

NS = "public/default"


def topic(name: str) -> str:
    return f"persistent://{NS}/{name}"


@dataclass(frozen=True)
class ServiceTime:
    """Service-time distribution: exponential, lognormal, deterministic, or empirical samples (seconds)."""

    kind: str
    mean: float = 0.0
    cv: float = 1.0
    samples: tuple[float, ...] = ()

    KINDS = ("exponential", "lognormal", "deterministic", "empirical")

    def __post_init__(self):
        if self.kind not in self.KINDS:
            raise ConfigError(f"service time kind {self.kind!r} is unknown: use one of {', '.join(self.KINDS)}")
        if self.kind == "empirical" and not self.samples:
            raise ConfigError("an empirical service time needs measured samples")
        if self.kind != "empirical" and self.mean <= 0:
            raise ConfigError(f"service time mean must be > 0, got {self.mean}")

    @property
    def expected(self) -> float:
        return float(np.mean(self.samples)) if self.kind == "empirical" else self.mean

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.kind == "exponential":
            return rng.exponential(self.mean, n)
        if self.kind == "deterministic":
            return np.full(n, self.mean)
        if self.kind == "lognormal":
            sigma2 = np.log1p(self.cv**2)
            return rng.lognormal(np.log(self.mean) - sigma2 / 2, np.sqrt(sigma2), n)
        return rng.choice(np.asarray(self.samples, dtype=float), n)


@dataclass(frozen=True)
class SimFunction:
    name: str  # fully qualified, tenant/namespace/name, as the live monitor names it
    inputs: tuple[str, ...]
    output: str | None
    service: ServiceTime


@dataclass(frozen=True)
class SimApp:
    name: str
    sources: tuple[str, ...]  # topics the workload publishes to
    functions: tuple[SimFunction, ...]


def _fn(name: str, inputs: tuple[str, ...], output: str | None, service: ServiceTime) -> SimFunction:
    return SimFunction(f"{NS}/{name}", tuple(topic(t) for t in inputs), topic(output) if output else None, service)


def lognormal(mean_s: float, cv: float = 0.5) -> ServiceTime:
    return ServiceTime("lognormal", mean=mean_s, cv=cv)


APPS: dict[str, SimApp] = {
    "paper-image": SimApp(
        "paper-image",
        (topic("images"),),
        (
            _fn("resize-store", ("images",), "stored", lognormal(0.020)),
            _fn("resize-recognize", ("images",), "resized", lognormal(0.020)),
            _fn("recognize", ("resized",), "labels", lognormal(0.250)),
        ),
    ),
    # The live demo's application (pulsar_autoscale/cli/demo.py), for validating the simulator against it.
    "demo-image": SimApp(
        "demo-image",
        (topic("images"),),
        (
            _fn("resize-store", ("images",), "stored", lognormal(0.020, 0.5)),
            _fn("resize-recognize", ("images",), "resized", lognormal(0.020, 0.5)),
            _fn("recognize", ("resized",), "labels", lognormal(0.150, 1.0)),
        ),
    ),
    "dag6": SimApp(
        "dag6",
        (topic("events"),),
        (
            _fn("ingest", ("events",), "raw", ServiceTime("exponential", mean=0.010)),
            _fn("parse", ("raw",), "parsed", lognormal(0.040)),
            _fn("geo", ("raw",), "located", lognormal(0.120, 0.8)),
            _fn("score", ("parsed", "located"), "scored", lognormal(0.060)),
            _fn("alert", ("scored",), "alerts", ServiceTime("deterministic", mean=0.015)),
            _fn("archive", ("parsed",), None, ServiceTime("exponential", mean=0.030)),
        ),
    ),
}


def load_app(name: str) -> SimApp:
    try:
        return APPS[name]
    except KeyError:
        raise ConfigError(f"unknown app {name!r}: use one of {', '.join(APPS)}") from None
