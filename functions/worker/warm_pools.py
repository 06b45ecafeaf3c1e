"""Warm standbys of process-runtime functions (functions/runtimes/warm_pool.py), sized per function."""

from __future__ import annotations

from dataclasses import dataclass

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.instance.instance_user import InstanceUsers
from pulsar_autoscale.functions.runtimes.handles import ProcessInstance
from pulsar_autoscale.functions.runtimes.warm_pool import Standby, WarmPool
from pulsar_autoscale.functions.worker.broker_link import BrokerLink
from pulsar_autoscale.functions.worker.function_files import FunctionFiles
from pulsar_autoscale.functions.worker.hosted import HostedFunction


@dataclass(frozen=True)
class WarmPoolView:
    """A function's warm pool as GET .../warm-pool shows it: standbys asked, held (warm or warming), warm."""

    size: int
    held: int
    ready: int
    runtime: str  # "thread": no pool is kept, whatever the size


class WarmPools:
    """`size`: standbys per process-runtime function until the controller sizes its pool (--warm-pool)."""

    def __init__(
        self,
        size: int,
        link: BrokerLink,
        files: FunctionFiles,
        default_runtime: str,
        max_parallelism: int,
        users: InstanceUsers | None = None,
    ):
        if size < 0:
            raise ConfigError(f"warm pool size must be >= 0, got {size}")
        self.size = size
        self._link = link  # its client settings, and the broker's profile for a standby that subscribes itself
        self._files = files
        self._default_runtime = default_runtime
        self._max_parallelism = max_parallelism
        self._users = users  # whom each function's standbys run as (instance/instance_user.py)

    def renew(self, fn: HostedFunction) -> None:
        """Standbys hold the function's code and config: a new pool whenever those change."""
        if fn.warm_pool is not None:
            fn.warm_pool.close()
            fn.warm_pool = None
        size = self.size if fn.warm_pool_size is None else fn.warm_pool_size
        if size > 0 and fn.runtime(self._default_runtime) == "process" and not fn.failure:
            cfg, state_path = fn.config, str(self._files.fn_dir(fn.config) / "state.sqlite")
            fn.warm_pool = WarmPool(
                size,
                lambda: Standby(
                    ProcessInstance._ctx,
                    cfg,
                    self._link.settings,
                    self._link.profile,
                    fn.code_path,
                    state_path,
                    fn.num_instances,
                    fn.shared_input is not None or fn.keyed is not None,
                    self._users.of(cfg.fqfn) if self._users is not None else None,
                ),
            )

    def check_size(self, size: int) -> None:
        """At most max_parallelism standbys, as more could never all be taken."""
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= self._max_parallelism:
            raise ConfigError(
                f"standbys must be an integer from 0 to {self._max_parallelism} (the worker's max parallelism), got {size!r}"
            )

    def resize(self, fn: HostedFunction, size: int) -> None:
        """The controller sizes a function's warm pool (controller/warm_sizing.py), a size check_size passed.
        Kept until the worker restarts (then --warm-pool)."""
        fn.warm_pool_size = size
        if fn.warm_pool is not None and size > 0:
            fn.warm_pool.resize(size)
        elif (fn.warm_pool is None) != (size == 0):
            self.renew(fn)

    def view(self, fn: HostedFunction) -> WarmPoolView:
        pool = fn.warm_pool
        return WarmPoolView(
            size=self.size if fn.warm_pool_size is None else fn.warm_pool_size,
            held=pool.standby if pool else 0,
            ready=pool.ready_count() if pool else 0,
            runtime=fn.runtime(self._default_runtime),
        )
