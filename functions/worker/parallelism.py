"""Parallelism as a diff: start the missing instance ids, drain the surplus, restart what crashed.

Scaling out starts only the missing ids; scaling in drains and stops only the highest ids. Every other
instance keeps running: its numRestarts and start time do not change. A drain stops the instances'
receiving at once and waits for their in-flight work in the background, with a bound, so no request
waits on user code.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from pulsar_autoscale.functions.instance.instance_user import InstanceUsers
from pulsar_autoscale.functions.runtimes.handles import InstanceHandle, ProcessInstance, ThreadInstance
from pulsar_autoscale.functions.runtimes.remote_state import KeyedParts
from pulsar_autoscale.functions.worker.broker_link import BrokerLink
from pulsar_autoscale.functions.worker.function_files import FunctionFiles
from pulsar_autoscale.functions.worker.hosted import HostedFunction, sum_figures
from pulsar_autoscale.pulsar_client import ClientSettings

if TYPE_CHECKING:
    from pulsar_autoscale.functions.keyed.cluster import ClusterKeyed
    from pulsar_autoscale.functions.keyed.migration import InstanceStateStores
    from pulsar_autoscale.functions.keyed.protocol import RoutedStores
    from pulsar_autoscale.functions.keyed.scaler import KeyedScaler

log = logging.getLogger(__name__)
RESTART_BACKOFF_S = 5.0


def keyed_stores(keyed: KeyedScaler[InstanceStateStores] | ClusterKeyed) -> InstanceStateStores | RoutedStores:
    """The stores of a keyedState function's instances on this worker, as the worker wired them."""
    return keyed.stores


class Parallelism:
    def __init__(
        self,
        lock: threading.RLock,
        link: BrokerLink,
        files: FunctionFiles,
        settings: ClientSettings,
        default_runtime: str,
        drain_timeout_s: Callable[[], float],
        users: InstanceUsers | None = None,
    ):
        self._lock = lock
        self._link = link
        self._files = files
        self._settings = settings
        self._default_runtime = default_runtime
        self._drain_timeout_s = drain_timeout_s  # the worker's, which may change after start
        self._users = users  # whom each function's process instances run as
        self.retirers: list[threading.Thread] = []  # background drains (the list itself stays: close() joins it)

    def scale(self, fn: HostedFunction, target: int) -> None:
        assert fn.num_instances is not None  # Worker._hosted gives every function its count
        fn.num_instances.value = target
        fn.stopped = {i for i in fn.stopped if i < target}  # a keyed surplus instance runs to hand its groups over
        keyed = fn.keyed is not None and target > 0
        if keyed and fn.keyed is not None and not fn.stopped:
            for i in range(max(target, fn.keyed.router.assignment.parallelism)):
                if i not in fn.instances:  # the owners of the current assignment run before groups move
                    self.start(fn, i)
            fn.keyed.scale(target)
            return
        # keyed with a stopped owner: it cannot hand its groups over, so they move when it starts (as on a
        # cluster) and every instance keeps running meanwhile
        if not keyed:
            self.drain(fn, sorted((i for i in fn.instances if i >= target), reverse=True))
        for i in range(target):
            if i not in fn.instances and i not in fn.stopped:
                self.start(fn, i)

    @staticmethod
    def keyed_change_pending(fn: HostedFunction) -> bool:
        """A keyedState function whose groups are not yet spread over its parallelism (set while owners stopped)."""
        return fn.keyed is not None and fn.config.parallelism not in (0, fn.keyed.router.assignment.parallelism)

    def start(self, fn: HostedFunction, i: int) -> None:
        cfg = fn.config
        keyed = fn.keyed
        link = self._link
        user = self._users.of(cfg.fqfn) if self._users is not None else None
        standby = (
            fn.warm_pool.take() if fn.warm_pool is not None and fn.owned_state is None else None
        )  # a standby opened the local file: not a cluster's state
        if fn.runtime(self._default_runtime) == "process" and keyed is not None:
            handle: InstanceHandle = ProcessInstance(
                cfg,
                i,
                self._settings,
                link.profile,
                fn.code_path,
                None,
                fn.num_instances,
                None,
                standby=standby,
                keyed=KeyedParts(
                    lambda: keyed.open_input(i),
                    keyed_stores(keyed).store(i),
                    lambda: link.client,
                    cfg.numKeyGroups,
                    cfg.processingGuarantees == "EFFECTIVELY_ONCE",
                ),
                user=user,
            )
        elif fn.runtime(self._default_runtime) == "process":
            handle = ProcessInstance(
                cfg,
                i,
                self._settings,
                link.profile,
                fn.code_path,
                getattr(fn.owned_state, "endpoint", None) or str(self._files.fn_dir(cfg) / "state.sqlite"),
                fn.num_instances,
                fn.shared_input,  # set by broker_link.share_input
                standby=standby,
                user=user,
            )
        else:
            num_instances = fn.num_instances
            assert num_instances is not None  # Worker._hosted gives every function its count
            # owned_state: an OwnedState (cluster_hosting.host_instances) or None
            handle = ThreadInstance(
                cfg,
                i,
                link.client,
                fn.code_path,
                (fn.owned_state or fn.state) if keyed is None else keyed_stores(keyed).store(i),
                lambda: num_instances.value,
                open_input=(lambda: link.subscribe(cfg, f"{cfg.fqfn}:{i}")) if keyed is None else (lambda: keyed.open_input(i)),
            )
        fn.instances[i] = handle
        fn.restarts.setdefault(i, 0)
        log.info("started %s instance %d (%s)", cfg.fqfn, i, fn.runtime(self._default_runtime))

    def drain(self, fn: HostedFunction, ids: list[int], then=None) -> None:
        """Stop receiving on all of them now; a background thread waits, at most drain_timeout_s, for their
        in-flight work, abandons what is still busy (runtime.InstanceHandle.abandon) and retires them."""
        handles = [fn.instances.pop(i) for i in ids if i in fn.instances]
        for h in handles:
            h.stop()
        fn.draining.extend(handles)
        t = threading.Thread(target=self._retire, args=(fn, handles, then), name=f"drain-{fn.config.fqfn}", daemon=True)
        self.retirers[:] = [r for r in self.retirers if r.is_alive()] + [t]
        t.start()

    def _retire(self, fn: HostedFunction, handles: list[InstanceHandle], then) -> None:
        timeout_s = self._drain_timeout_s()
        deadline = time.monotonic() + timeout_s
        for h in handles:
            drained = h.join(max(deadline - time.monotonic(), 0.0))
            if not drained:
                h.abandon()
                log.error(
                    "%s instance %d did not drain within %.0f s: abandoned (its consumer is closed, its "
                    "unacknowledged messages are redelivered)",
                    fn.config.fqfn,
                    h.instance_id,
                    timeout_s,
                )
            with self._lock:
                fn.abandoned += 0 if drained else 1
                fn.draining.remove(h)
                fn.retired = sum_figures(fn.retired, h.figures())
            log.info("drained %s instance %d", fn.config.fqfn, h.instance_id)
        if then is not None:
            then()

    def restart_exited(self, fn: HostedFunction, now: float) -> None:
        """A crashed instance is restarted (counted in numRestarts), at most once per RESTART_BACKOFF_S."""
        for i, h in list(fn.instances.items()):
            if h.alive() or now - fn.last_restart.get(i, 0.0) < RESTART_BACKOFF_S:
                continue
            fn.retired = sum_figures(fn.retired, h.figures())
            del fn.instances[i]
            fn.restarts[i] = fn.restarts.get(i, 0) + 1
            fn.last_restart[i] = now
            log.warning("%s instance %d exited (%s); restarting", fn.config.fqfn, i, h.figures().error)
            self.start(fn, i)
