"""Prometheus /metrics for the worker, with Pulsar's pulsar_function_* names and labels."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LABELS = ["tenant", "namespace", "name", "instance_id", "cluster", "fqfn"]


class WorkerCollector(Collector):
    def __init__(self, worker, cluster: str = "pulsar-autoscale"):
        self._worker = worker
        self._cluster = cluster

    def collect(self):
        counters = {
            "received": ("pulsar_function_received", "messages received"),
            "processed": ("pulsar_function_processed_successfully", "messages processed successfully"),
            "user_exceptions": ("pulsar_function_user_exceptions", "user exceptions"),
            "system_exceptions": ("pulsar_function_system_exceptions", "system exceptions"),
            "outputs": ("pulsar_function_output", "messages produced to the output topic"),
            "busy_s": ("pulsar_function_busy_seconds", "seconds spent inside process()"),
            "wait_s": ("pulsar_function_wait_seconds", "seconds messages waited from publish to receive (summed)"),
        }
        fams = {k: CounterMetricFamily(n, h, labels=LABELS) for k, (n, h) in counters.items()}
        latency = GaugeMetricFamily("pulsar_function_process_latency_ms", "mean process latency (ms)", labels=LABELS)
        last = GaugeMetricFamily("pulsar_function_last_invocation", "last invocation time (ms since epoch)", labels=LABELS)
        restarts = GaugeMetricFamily("pulsar_function_restarts", "restarts of the instance", labels=LABELS)
        instances = GaugeMetricFamily(
            "pulsar_function_instances", "configured parallelism", labels=["tenant", "namespace", "name", "cluster", "fqfn"]
        )
        running = GaugeMetricFamily(
            "pulsar_function_instances_running", "running instances", labels=["tenant", "namespace", "name", "cluster", "fqfn"]
        )
        for cfg in self._worker.functions():
            try:
                cfg, figs, restart_counts = self._worker.instance_figures(cfg.fqfn)
            except Exception:  # deleted between the list and the read
                continue
            fn_labels = [cfg.tenant, cfg.namespace, cfg.name, self._cluster, cfg.fqfn]
            instances.add_metric(fn_labels, cfg.parallelism)
            running.add_metric(fn_labels, sum(1 for f in figs.values() if f.running))
            for i, fig in figs.items():
                labels = [cfg.tenant, cfg.namespace, cfg.name, str(i), self._cluster, cfg.fqfn]
                for key, fam in fams.items():
                    fam.add_metric(labels, getattr(fig, key))
                latency.add_metric(labels, fig.avg_latency_ms)
                last.add_metric(labels, fig.last_invocation_ms)
                restarts.add_metric(labels, restart_counts.get(i, 0))
        yield from fams.values()
        yield from (latency, last, restarts, instances, running)
