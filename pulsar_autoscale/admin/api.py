"""What the controller asks of a Functions admin REST API: the seam between the MAPE loop and a worker.

Two kinds stand behind it: our worker (`FunctionsAdmin`), whose stats carry the consumers' own counters,
and a stock Pulsar functions worker (`StockPulsarAdmin`), which has none, so the controller builds the
same figures from the broker's topic stats and Pulsar's FunctionStats (`TopicFigures`). The monitor asks
`isinstance(admin, TopicFigures)` once, where it would otherwise probe for methods one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

if TYPE_CHECKING:
    from pulsar_autoscale.snapshot import FunctionCounters, InputReading


Names = list[str]  # module-level: inside the class, `list` is the method
Records = list[dict]


class FunctionsApi(Protocol):
    """Pulsar's /admin/v3/functions, and our worker's additions the controller drives (warm pool, burst,
    cluster view); epochs fence a deposed leader's writes."""

    def list(self, tenant: str, namespace: str) -> Names: ...

    def get(self, tenant: str, namespace: str, name: str) -> dict: ...

    def status(self, tenant: str, namespace: str, name: str) -> dict: ...

    def stats(self, tenant: str, namespace: str, name: str) -> dict: ...

    def set_parallelism(self, tenant: str, namespace: str, name: str, parallelism: int, epoch: int | None = None) -> None: ...

    def set_warm_pool(self, tenant: str, namespace: str, name: str, standbys: int, epoch: int | None = None) -> dict: ...

    def burst(
        self, tenant: str, namespace: str, name: str, messages: int, partitions: int, threads: int = 1, epoch: int | None = None
    ) -> dict: ...

    def cluster(self) -> Records: ...

    def assignments(self) -> dict: ...


@runtime_checkable
class TopicFigures(Protocol):
    """Stock Pulsar only: counters, backlog and arrivals from the broker's topic stats and FunctionStats,
    input partitions from topic metadata, and what one instance's restart costs."""

    def counters_and_running(self, tenant: str, namespace: str, name: str, now: float) -> tuple[FunctionCounters, int]: ...

    def input_reading(self, inputs: Sequence[str], subscription: str, now: float) -> InputReading | None: ...

    def backlog_and_arrivals(self, inputs: Sequence[str], subscription: str) -> tuple[float | None, float | None]: ...

    def partitions(self, topic: str) -> int: ...

    def restart_cost_s(self) -> float | None: ...
