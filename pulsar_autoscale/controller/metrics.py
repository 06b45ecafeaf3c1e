"""The controller's Prometheus metrics, on a registry of its own (served at /metrics), so that two
controllers in one process (tests, the demo) never share series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControllerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "pulsar_autoscale_decisions",
            "parallelism changes applied (not recommendations)",
            ["function", "direction"],
            registry=self.registry,
        )
        self.failures = Counter(
            "pulsar_autoscale_decision_failures",
            "parallelism changes the worker did not apply",
            ["function"],
            registry=self.registry,
        )
        self.errors = Counter("pulsar_autoscale_errors", "errors by stage", ["stage"], registry=self.registry)
        self.iteration = Histogram("pulsar_autoscale_iteration_seconds", "one MAPE iteration", registry=self.registry)
        self.target = Gauge(
            "pulsar_autoscale_target_parallelism", "parallelism after the last decision", ["function"], registry=self.registry
        )
        self.bursts = Counter(
            "pulsar_autoscale_bursts",
            "burst drains asked of the worker (or recommended in dry run)",
            ["function"],
            registry=self.registry,
        )
        self.leader = Gauge("pulsar_autoscale_leader", "1 while this replica is leader", registry=self.registry)
        self.epoch = Gauge("pulsar_autoscale_epoch", "leader epoch held by this replica (0: none)", registry=self.registry)
        self.paused = Gauge(
            "pulsar_autoscale_paused", "1 while an operator has paused the function", ["function"], registry=self.registry
        )
        self.max_parallelism = Gauge(
            "pulsar_autoscale_max_parallelism", "the function's upper bound (its controls)", ["function"], registry=self.registry
        )
        self.backlog = Gauge(
            "pulsar_autoscale_backlog", "messages waiting, as the last period measured them", ["function"], registry=self.registry
        )
        # 1 per (function, input): dashboards join the broker's per-topic series to functions with it.
        # The topic appears twice, as Apache Pulsar labels it (persistent://...) and as pulsar-lite does
        # (the local name, with the namespace label), so one join works on both brokers.
        self.function_input = Gauge(
            "pulsar_autoscale_function_input",
            "the function consumes this topic",
            ["function", "namespace", "topic", "subscription"],
            registry=self.registry,
        )
        self._inputs: dict[str, set[tuple]] = {}

    def describe_inputs(self, inputs: dict[str, tuple[tuple[str, ...], str]]) -> None:
        """function -> (its input topics, its subscription); a function not listed any more loses its
        series, here and in every per-function metric, so dashboards stop showing it."""
        for fn in set(self._inputs) - set(inputs):
            for metric, values in (
                (self.target, (fn,)),
                (self.paused, (fn,)),
                (self.failures, (fn,)),
                (self.max_parallelism, (fn,)),
                (self.backlog, (fn,)),
                (self.bursts, (fn,)),
                (self.decisions, (fn, "out")),
                (self.decisions, (fn, "in")),
                *((self.function_input, labels) for labels in self._inputs[fn]),
            ):
                try:
                    metric.remove(*values)
                except KeyError:
                    pass
            del self._inputs[fn]
        for fn, (topics, subscription) in inputs.items():
            labels = set()
            for topic in topics:
                namespace = "/".join(topic.split("://", 1)[-1].split("/")[:2])
                labels |= {(fn, namespace, topic, subscription), (fn, namespace, topic.rsplit("/", 1)[-1], subscription)}
            for stale in self._inputs.get(fn, set()) - labels:
                self.function_input.remove(*stale)
            for label in labels:
                self.function_input.labels(*label).set(1)
            self._inputs[fn] = labels
