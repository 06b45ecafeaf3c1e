"""The part of the worker a cluster member drives (functions/cluster/member.py): the cluster's assignment
says which instance ids of each function run here; a spread keyedState function's groups are asked after here.

A mixin of Worker (worker.py), whose lock, hosted functions, broker link, files and parallelism it uses.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, cast

import pulsar

from pulsar_autoscale.functions.keyed.cluster import ClusterKeyed
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.state.owner_calls import OwnedState
from pulsar_autoscale.functions.worker.hosted import HostedFunction
from pulsar_autoscale.functions.worker.parallelism import Parallelism, keyed_stores

if TYPE_CHECKING:
    from pulsar_autoscale.functions.cluster.state_owner import StateOwnerRouter
    from pulsar_autoscale.functions.worker.broker_link import BrokerLink
    from pulsar_autoscale.functions.worker.function_files import FunctionFiles


class ClusterHosting:
    if TYPE_CHECKING:  # Worker's (worker.py), which this mixin uses
        link: BrokerLink
        files: FunctionFiles
        state_router: StateOwnerRouter | None
        _lock: threading.RLock
        _functions: dict[str, HostedFunction]
        _parallelism: Parallelism
        _creating: set[str]
        _deleting: set[str]

        def _hosted(
            self, cfg: FunctionConfig, code_path: str | None, digest: str | None = None, failure: str = ""
        ) -> HostedFunction: ...

        def _remove(self, fn: HostedFunction) -> None: ...

    @property
    def pulsar_client(self) -> pulsar.Client:
        """This incarnation's client, once the broker has answered (BrokerUnavailable after 30 s)."""
        self.link.require()
        # set: Worker._connect sets the client before it sets `connected`, which require() waits for
        return cast(pulsar.Client, self.link.client)

    def host_instances(self, cfg: FunctionConfig, code_path: str | None, ids: set[int], front: bool = False) -> None:
        """Run exactly `ids` of the function here: start the missing ones, drain the others (highest
        first); the rest keep running. A change of anything but parallelism restarts them, as update() does.
        `front`: a keyedState function's front runs here (instance 0 is assigned here, running or stopped)."""
        self.link.require()
        with self._lock:
            fn = self._functions.get(cfg.fqfn)
            if fn is None:
                fn = self._hosted(cfg, code_path)
            elif code_path != fn.code_path or replace(cfg, parallelism=fn.config.parallelism) != fn.config:
                self._parallelism.drain(fn, sorted(fn.instances, reverse=True))
                fn.restarts = {i: n + 1 for i, n in fn.restarts.items()}
            fn.config, fn.code_path = cfg, code_path
            router = self.state_router
            if router is not None and fn.keyed is None and fn.owned_state is None:
                # one copy of the state: every instance's calls go to the worker assigned instance 0
                fn.owned_state = owned = OwnedState(partial(router.handle, cfg.fqfn))
                owned.endpoint = router.endpoint(cfg.fqfn)  # process instances call it over HTTP
            assert fn.num_instances is not None  # Worker._hosted gives every function its count
            fn.num_instances.value = cfg.parallelism
            leaving = sorted((i for i in fn.instances if i not in ids), reverse=True)
            keyed = fn.keyed
            # a keyedState instance that leaves this worker forgets its stores: it restores when it comes back
            # (unless it is back already: started again here while it drained, it uses the same store)
            self._parallelism.drain(fn, leaving, then=None if keyed is None else lambda: self._forget_stores(fn, set(leaving)))
            for i in sorted(ids):
                if i not in fn.instances:
                    self._parallelism.start(fn, i)
            if keyed is not None:
                # spread: the cluster member set the worker's keyed_spread, so keyed_wiring made a ClusterKeyed
                spread = cast(ClusterKeyed, keyed)
                if front and cfg.parallelism > 0:
                    spread.start_front(cfg.parallelism)
                else:
                    spread.stop_front()
        if router is not None and keyed is None:
            router.follow(cfg.fqfn)  # gives the state up when instance 0 left this worker

    def _forget_stores(self, fn: HostedFunction, left: set[int]) -> None:
        assert fn.keyed is not None  # host_instances calls it for a keyedState function only
        stores = keyed_stores(fn.keyed)
        stores.snapshot(left)  # they drained; not under the worker's lock: a broker round trip
        with self._lock:  # a start of one of them waits: it must find its store open or gone, not closing
            stores.forget({i for i in left if i not in fn.instances})

    def keyed_holds_groups(self, fqfn: str, instance_id: int) -> bool:
        """Cluster: whether this worker's instance of a keyedState function still holds key groups."""
        with self._lock:
            fn = self._functions.get(fqfn)
            return fn is not None and isinstance(fn.keyed, ClusterKeyed) and fn.keyed.holds_groups(instance_id)

    def keyed_surplus(self, fqfn: str) -> set[int]:
        """Cluster, the front's worker: the keyedState function's instances beyond its parallelism that still
        own key groups (keyed_cluster.ClusterKeyed.surplus_owners)."""
        with self._lock:
            fn = self._functions.get(fqfn)
            if fn is None or not isinstance(fn.keyed, ClusterKeyed):
                return set()
            return fn.keyed.surplus_owners(fn.config.parallelism)

    def hosted_function(self, fqfn: str) -> HostedFunction | None:
        with self._lock:
            return self._functions.get(fqfn)

    def hosted_ids(self) -> dict[str, set[int]]:
        with self._lock:
            return {fqfn: set(fn.instances) for fqfn, fn in self._functions.items()}

    def unhost(self, fqfn: str) -> None:
        """Cluster mode: the function was deleted."""
        with self._lock:
            fn = self._functions.pop(fqfn, None)
            if fn is None:
                return
            self._deleting.add(fqfn)
        if self.state_router is not None:
            self.state_router.forget(fqfn)
        self._remove(fn)

    def discard_files_except(self, known: set[str]) -> list[str]:
        """Cluster: the files of functions the cluster no longer has (deleted while this worker was down),
        other than any hosted here; `known`: every function of the cluster's metadata, read to its end."""
        with self._lock:
            gone = self.files.move_aside_except(known | set(self._functions) | self._creating)
        for trash in gone.values():
            shutil.rmtree(trash, ignore_errors=True)
        return sorted(gone)
