"""Monitor: every period, the app graph and a typed Snapshot per function.

Function configs and cumulative counters come from the workers' Functions REST API; arrivals
and backlogs from the broker's /metrics. Two readings a window apart become rates through
snapshot.window_snapshot, the same code the simulator uses. Whatever could not be read is
None in the snapshot (a policy keeps that function as it is) and is listed in `errors`.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import cast

from pulsar_autoscale.admin.api import FunctionsApi, TopicFigures
from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.broker.metrics import BrokerMetrics
from pulsar_autoscale.broker.metrics import fetch as fetch_broker_metrics
from pulsar_autoscale.controller.controls import FunctionControls, declared
from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.snapshot import FunctionCounters, FunctionSnapshot, Snapshot, window_snapshot

log = logging.getLogger(__name__)
# pulsar-lite refreshes its gauges about every 5 s: a backlog is at most this old.
BROKER_GAUGE_AGE_S = 5.0


@dataclass(frozen=True)
class FunctionInfo:
    """What the Monitor needs of one function's config."""

    node: FunctionNode
    subscription: str
    parallelism: int
    failover: bool = False  # retainOrdering / EFFECTIVELY_ONCE: one active consumer per input partition
    controls: FunctionControls = FunctionControls()  # declared in its customRuntimeOptions (controls.py)


@dataclass(frozen=True)
class Observation:
    graph: AppGraph
    snapshot: Snapshot
    current: dict[str, int]
    errors: tuple[str, ...] = ()
    caps: dict[str, int] = field(default_factory=dict)  # most instances that can consume (FAILOVER)
    declared: dict[str, FunctionControls] = field(default_factory=dict)  # controls in the functions' configs
    subscriptions: dict[str, str] = field(default_factory=dict)  # each function's input subscription


def function_info(config: dict) -> FunctionInfo:
    """From a Pulsar FunctionConfig body (ours or a stock worker's)."""
    from pulsar_autoscale.topics import normalize_topic

    tenant, namespace, name = config["tenant"], config["namespace"], config["name"]
    listed = list(config.get("inputs") or []) + [t for t in (config.get("inputSpecs") or {})]
    inputs = tuple(dict.fromkeys(normalize_topic(t, tenant, namespace) for t in listed))
    output = normalize_topic(config["output"], tenant, namespace) if config.get("output") else None
    fqfn = f"{tenant}/{namespace}/{name}"
    failover = bool(config.get("retainOrdering")) or config.get("processingGuarantees") == "EFFECTIVELY_ONCE"
    parallelism = config.get("parallelism")  # 0: scaled to zero
    return FunctionInfo(
        FunctionNode(fqfn, inputs, output),
        config.get("subName") or fqfn,
        1 if parallelism is None else int(parallelism),
        failover,
        declared(config),
    )


def counters_from_stats(stats: dict, now: float) -> tuple[FunctionCounters, int]:
    """Our worker's stats carry cumulative counters under "autoscale" (drained instances included)."""
    raw = dict(stats["autoscale"]["counters"])
    raw["time"] = now
    return FunctionCounters(**raw), len(stats.get("instances") or [])


@dataclass
class Monitor:
    admin: FunctionsApi
    metrics_url: str | None
    namespaces: tuple[str, ...] = ("public/default",)
    window_s: float = 30.0
    _history: dict[str, deque] = field(default_factory=dict)
    _batching: dict[str, float] = field(default_factory=dict)  # each input's last known messages per entry

    def observe(self, now: float) -> Observation:
        errors: list[str] = []
        infos = self._discover(errors)
        graph = AppGraph.build(info.node for info in infos)
        broker = self._broker(now, errors, {t for i in infos for t in i.node.inputs})
        functions: dict[str, FunctionSnapshot] = {}
        for info in infos:
            functions[info.node.name] = self._function(info, broker, now, errors)
        snapshot = Snapshot(time=now, window_s=self.window_s, functions=functions)
        caps = {i.node.name: self._partitions(i, errors) for i in infos if i.failover}
        return Observation(
            graph,
            snapshot,
            {i.node.name: i.parallelism for i in infos},
            tuple(errors),
            {name: cap for name, cap in caps.items() if cap},
            {i.node.name: i.controls for i in infos},
            {i.node.name: i.subscription for i in infos},
        )

    def _partitions(self, info: FunctionInfo, errors: list[str]) -> int | None:
        """Input partitions of a FAILOVER function: from topic metadata on a stock cluster, else one per
        input topic (pulsar-lite has no partitioned topics)."""
        if not isinstance(self.admin, TopicFigures):
            return len(info.node.inputs)
        try:
            return sum(max(self.admin.partitions(t), 1) for t in info.node.inputs)
        except (AdminError, PulsarAutoscaleError) as exc:
            errors.append(f"{info.node.name}: partitions unknown: {exc}")
            return None

    def _discover(self, errors: list[str]) -> list[FunctionInfo]:
        infos = []
        for ns in self.namespaces:
            tenant, namespace = ns.split("/", 1)
            for name in self.admin.list(tenant, namespace):  # an unreachable worker fails the whole period
                try:
                    infos.append(function_info(self.admin.get(tenant, namespace, name)))
                except (AdminError, KeyError, ValueError, PulsarAutoscaleError) as exc:
                    errors.append(f"{ns}/{name}: config unreadable: {exc}")
        return infos

    def _broker(self, now: float, errors: list[str], topics: set[str]) -> BrokerMetrics | None:
        """The broker's figures, each input's batching as last known: Apache Pulsar reports a topic's entries
        for the last stats period only, so an idle topic's backlog keeps the batching it had when it was written."""
        if not self.metrics_url:
            return None
        try:
            broker = fetch_broker_metrics(self.metrics_url, now, topics=topics)
        except PulsarAutoscaleError as exc:
            errors.append(str(exc))
            return None
        broker = broker.remembering(self._batching, topics)
        self._batching = broker.batching
        return broker

    def _function(self, info: FunctionInfo, broker: BrokerMetrics | None, now: float, errors: list[str]) -> FunctionSnapshot:
        name = info.node.name
        backlog: float | None = None
        arrived: float | None = None
        if broker is not None:
            parts = [broker.backlog_messages(t, info.subscription) for t in info.node.inputs]
            backlog = sum(cast("list[float]", parts)) if parts and all(p is not None for p in parts) else None
            ins = [broker.in_messages.get(t) for t in info.node.inputs]
            arrived = sum(cast("list[float]", ins)) if ins and all(v is not None for v in ins) else None
        tenant, namespace, fn = name.split("/")
        try:
            if isinstance(self.admin, TopicFigures):  # stock Pulsar: topic stats and its FunctionStats
                if broker is None:
                    backlog, arrived = self.admin.backlog_and_arrivals(info.node.inputs, info.subscription)
                cur, running = self.admin.counters_and_running(tenant, namespace, fn, now)
            else:
                stats = self.admin.stats(tenant, namespace, fn)
                cur, running = counters_from_stats(stats, now)
                if stats["autoscale"].get("backlog") is not None:  # a Spark stage reads with a Reader:
                    backlog = float(stats["autoscale"]["backlog"])  # its worker measures the backlog
        except (AdminError, KeyError, TypeError) as exc:
            errors.append(f"{name}: stats unreadable: {exc}")
            return FunctionSnapshot(name=name, parallelism=info.parallelism, backlog=backlog)
        cur = FunctionCounters(**{**cur.__dict__, "arrived": arrived})
        history = self._history.setdefault(name, deque())
        prev = self._reading_before(history, now - self.window_s)
        history.append(cur)
        while len(history) > 2 and history[1].time <= now - 2 * self.window_s:
            history.popleft()
        return window_snapshot(
            name, info.parallelism, prev, cur, backlog, running, age_s=BROKER_GAUGE_AGE_S if broker is not None else None
        )

    @staticmethod
    def _reading_before(history: deque, target: float) -> FunctionCounters | None:
        """The newest reading at or before `target`, else the oldest one (a shorter first window)."""
        best = None
        for reading in history:
            if reading.time <= target:
                best = reading
        return best or (history[0] if history else None)
