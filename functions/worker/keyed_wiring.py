"""A keyedState function's key-group router and scaler on this worker; its assignment survives restarts.

On one worker: one router over the function's input feeds the local instances (functions/keyed/routing.py)
and a KeyedScaler moves key groups live (functions/keyed/scaler.py, functions/keyed/migration.py). On a cluster:
the function's part on this worker, route inputs and, while instance 0 runs here, the front
(functions/keyed/cluster.py).
"""

from __future__ import annotations

import json
import os
from typing import Callable

from pulsar_autoscale.functions.keyed.cluster import ClusterKeyed
from pulsar_autoscale.functions.keyed.migration import InstanceStateStores
from pulsar_autoscale.functions.keyed.routing import KeyedRouter
from pulsar_autoscale.functions.keyed.scaler import KeyedScaler
from pulsar_autoscale.functions.model.keygroups import KeyGroupAssignment
from pulsar_autoscale.functions.model.migration_settings import keyed_migration
from pulsar_autoscale.functions.state.changelog import changelog_of
from pulsar_autoscale.functions.worker.broker_link import BrokerLink
from pulsar_autoscale.functions.worker.function_files import FunctionFiles
from pulsar_autoscale.functions.worker.hosted import HostedFunction


def wire_keyed(
    fn: HostedFunction,
    files: FunctionFiles,
    link: BrokerLink,
    spread: bool,
    start: Callable[[int], None],
    drain: Callable[[list[int]], None],
) -> KeyedScaler[InstanceStateStores] | ClusterKeyed:
    """`start`, `drain`: what the scaler asks of the worker for the function's instances; `spread`: on a cluster."""
    cfg = fn.config

    def open_consumer():  # with the config of the moment: an update (maxMessageRetries, ...) reopens it
        return link.keyed_input(fn.config)

    if spread:
        return ClusterKeyed(
            cfg,
            files.fn_dir(cfg) / "keyed-state",
            lambda: link.client,
            open_consumer,
            link.profile,
            lambda: fn.config,
            lambda: link.stall_fence,
        )
    path = files.fn_dir(fn.config) / "keygroups.json"
    new = not path.exists()
    if not new:
        saved = json.loads(path.read_text())
        assignment = KeyGroupAssignment(saved["num_key_groups"], tuple(saved["owners"]))
    else:
        assignment = KeyGroupAssignment.uniform(fn.config.numKeyGroups, max(fn.config.parallelism, 1))

    def save(a: KeyGroupAssignment) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"num_key_groups": a.num_key_groups, "owners": list(a.owners)}))
        os.replace(tmp, path)

    router = KeyedRouter(assignment, open_consumer, queue_size=lambda: fn.config.receiverQueueSize)
    stores = InstanceStateStores(
        files.fn_dir(cfg) / "keyed-state",
        cfg.numKeyGroups,
        lambda: router.assignment,
        lambda: link.client,
        changelog_of(cfg),
        new,
    )
    save(assignment)
    return KeyedScaler(router, stores, start, drain, save, settings=lambda: keyed_migration(fn.config))
