"""A function as the worker hosts it: its config, code, state and running instances, and their figures summed."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from pulsar_autoscale.functions.instance.stats import InstanceFigures
from pulsar_autoscale.functions.keyed.cluster import ClusterKeyed
from pulsar_autoscale.functions.keyed.migration import InstanceStateStores
from pulsar_autoscale.functions.keyed.scaler import KeyedScaler
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.runtimes.handles import InstanceHandle
from pulsar_autoscale.functions.runtimes.warm_pool import WarmPool
from pulsar_autoscale.functions.state.store import StateStore

if TYPE_CHECKING:
    from pulsar_autoscale.broker.lite.shared_input import SharedInput
    from pulsar_autoscale.functions.state.owner_calls import OwnedState


class SharedCount(Protocol):
    """HostedFunction.num_instances: a multiprocessing Value("i") (process runtime) or a Counter."""

    value: int


@dataclass
class HostedFunction:
    config: FunctionConfig
    code_path: str | None
    state: StateStore
    instances: dict[int, InstanceHandle] = field(default_factory=dict)
    restarts: dict[int, int] = field(default_factory=dict)
    last_restart: dict[int, float] = field(default_factory=dict)
    stopped: set[int] = field(default_factory=set)  # instances stopped by the user (start/stop API)
    retired: InstanceFigures | None = None  # sums of drained instances' figures
    history: deque = field(default_factory=deque)  # (time, FunctionCounters) for the "1min" window
    num_instances: SharedCount | None = None  # shared int for Context.get_num_instances
    shared_input: SharedInput | None = None  # pulsar-lite only, set by broker_link.share_input
    warm_pool: WarmPool | None = None  # process runtime: warm standbys
    warm_pool_size: int | None = None  # asked by the controller (None: the worker's)
    code_digest: str | None = None  # sha256 of code_path, which passed validation
    failure: str = ""  # why the function cannot run (no instances run)
    draining: list = field(default_factory=list)  # stopped instances finishing in-flight work
    abandoned: int = 0  # drains that did not finish within the bound
    # keyedState: key-group routing + live migration
    keyed: KeyedScaler[InstanceStateStores] | ClusterKeyed | None = None
    owned_state: OwnedState | None = None  # a cluster, not keyedState: calls to the state's owner

    def runtime(self, default: str) -> str:
        return self.config.instanceRuntime or default


def sum_figures(a: InstanceFigures | None, b: InstanceFigures) -> InstanceFigures:
    if a is None:
        return replace(b, latest_user_exceptions=(), latest_system_exceptions=(), user_metrics={})
    return replace(
        a,
        received=a.received + b.received,
        processed=a.processed + b.processed,
        user_exceptions=a.user_exceptions + b.user_exceptions,
        system_exceptions=a.system_exceptions + b.system_exceptions,
        outputs=a.outputs + b.outputs,
        busy_s=a.busy_s + b.busy_s,
        busy_sq_s2=a.busy_sq_s2 + b.busy_sq_s2,
        interarrival_n=a.interarrival_n + b.interarrival_n,
        interarrival_s=a.interarrival_s + b.interarrival_s,
        interarrival_sq_s2=a.interarrival_sq_s2 + b.interarrival_sq_s2,
        wait_s=a.wait_s + b.wait_s,
        newest_publish_ms=max(a.newest_publish_ms, b.newest_publish_ms),
        in_flight=a.in_flight + b.in_flight,
        last_invocation_ms=max(a.last_invocation_ms, b.last_invocation_ms),
    )


class Counter:
    """Same interface as multiprocessing.Value for the thread runtime."""

    def __init__(self, value: int):
        self.value = value
