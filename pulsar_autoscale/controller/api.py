"""What the controller's HTTP routes (rest.py) call: rest.py depends on this interface, not on the loop,
so the loop can serve it without the two modules importing each other, and a test can serve a stand-in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Protocol

if TYPE_CHECKING:
    from pulsar_autoscale.admin.api import FunctionsApi
    from pulsar_autoscale.controller.config import ControllerConfig
    from pulsar_autoscale.controller.controls import Effective
    from pulsar_autoscale.controller.metrics import ControllerMetrics


class ControllerApi(Protocol):
    @property
    def config(self) -> ControllerConfig: ...

    @property
    def admin(self) -> FunctionsApi: ...  # asked whether a function not yet seen by a period exists

    @property
    def metrics(self) -> ControllerMetrics: ...

    @property
    def effective(self) -> Mapping[str, Effective]: ...  # the functions of the last period

    def status(self) -> dict: ...

    def controls_of(self, fn: str) -> dict: ...

    def set_controls(self, fn: str, update: dict) -> dict: ...

    def clear_controls(self, fn: str) -> dict: ...

    def why_with_leader(self, fn: str, limit: int = 10) -> tuple[list[dict], str | None]: ...

    def reload(self) -> dict: ...
