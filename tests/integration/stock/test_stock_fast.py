"""The fast check on a stock Pulsar cluster (the contract-checked fake): arrival rate and backlog
from the broker's topic stats, service rate from FunctionStats. A burst that outruns the
instances is answered by a `kind: fast` scale-out within a few fast periods, once (the stock
cooldown holds the next restart off); a steady load gets none."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.fast import topic_snapshot
from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.snapshot import FunctionSnapshot, InputReading
from tests.support.contracts.fake_cluster import FakeCluster
from tests.support.controller import IN_TOPIC, base
from tests.support.scenario import lead

FQFN = "public/default/enrich"
SERVICE_MS = 50.0  # mu = 20/s per instance


@dataclass
class StockLoad:
    """One function on the fake cluster, advanced a second at a time: `rate` msg/s published, each
    instance completing 1000 / SERVICE_MS msg/s; the cluster's topic and function stats follow."""

    cluster: FakeCluster
    rate: float
    published: float = 0.0
    backlog: float = 0.0
    processed: dict = field(default_factory=dict)  # instance id -> processed (Pulsar counts per instance)

    def parallelism(self) -> int:
        return int(self.cluster.state.functions[FQFN]["parallelism"])

    def advance(self, seconds: float = 1.0) -> None:
        k = self.parallelism()
        self.published += self.rate * seconds
        done = min(self.backlog + self.rate * seconds, k * 1000.0 / SERVICE_MS * seconds)
        self.backlog += self.rate * seconds - done
        for i in range(k):
            self.processed[i] = self.processed.get(i, 0.0) + done / k
        self.publish()

    def publish(self) -> None:
        metrics = [
            {
                "instanceId": i,
                "metrics": {
                    "receivedTotal": int(n),
                    "processedSuccessfullyTotal": int(n),
                    "systemExceptionsTotal": 0,
                    "userExceptionsTotal": 0,
                    "avgProcessLatency": SERVICE_MS,
                    "lastInvocation": 0,
                    "userMetrics": {},
                    "1min": {"receivedTotal": 0, "processedSuccessfullyTotal": 0},
                },
            }
            for i, n in self.processed.items()
            if i < self.parallelism()
        ]
        total = int(sum(m["metrics"]["processedSuccessfullyTotal"] for m in metrics))
        self.cluster.state.function_stats[FQFN] = {
            "receivedTotal": total,
            "processedSuccessfullyTotal": total,
            "instances": metrics,
            "lastInvocation": 0,
        }
        self.cluster.state.topics[IN_TOPIC] = {
            "msgRateIn": self.rate,
            "msgRateOut": self.rate,
            "msgInCounter": int(self.published),
            "subscriptions": {FQFN: {"msgBacklog": int(self.backlog), "type": "Shared", "consumers": []}},
        }


def run(broker, tmp_path, rates: list[float]) -> tuple[list[dict], FakeCluster, StockLoad]:
    """A steady 30 msg/s (rho 0.75 at k = 2), one regular period, then one fast check a second
    with `rates[i]` msg/s published in second i + 1."""
    cluster = FakeCluster()
    host = cluster.add_host("w1")
    cluster.state.functions[FQFN] = {
        "tenant": "public",
        "namespace": "default",
        "name": "enrich",
        "className": "enrich.Fn",
        "inputs": [IN_TOPIC],
        "parallelism": 2,
        "runtime": "PYTHON",
        "py": "enrich.py",
    }
    load = StockLoad(cluster, rate=30.0)
    load.advance(30.0)
    config = ControllerConfig.from_mapping(
        {
            **base(broker, tmp_path),
            "policy": "queueing",
            "period_s": 60.0,
            "window_s": 60.0,
            "mode": "stock",
            "admin_url": host.url,
            "fast": {"enabled": True, "period_s": 1.0, "window_s": 2.0},
        }
    )
    controller = Controller(config)
    lead(controller.elector)
    try:
        t0 = 1000.0
        first = controller.iterate(now=t0)
        assert not [d for d in first.decisions if d["applied"] and d["new"] != d["old"]], first.decisions
        for s, rate in enumerate(rates, start=1):
            load.rate = rate
            load.advance()
            controller.fast_iterate(now=t0 + s)
        assert cluster.state.violations == [], "a request outside Pulsar's documented API"
        return [r for r in controller.log.read() if r.get("kind") == "fast"], cluster, load
    finally:
        controller.elector.release()
        cluster.close()


def test_a_burst_in_the_topic_stats_scales_out_within_a_few_fast_periods(broker, tmp_path):
    # 120/s vs 2 x 20/s: the backlog grows 80/s; then 600/s outruns even the new parallelism
    fast, cluster, load = run(broker, tmp_path, [120.0] * 4 + [600.0] * 4)
    assert len(fast) == 1, f"one restart of every instance, not one per fast check: {fast}"
    d = fast[0]
    assert d["function"] == FQFN and d["applied"] and d["old"] == 2 and d["new"] > 2
    assert d["time"] - 1000.0 <= 3, "the burst should be answered within 3 fast periods"
    assert d["reason"].startswith("fast: lambda 120.0/s")
    assert "headroom 0.25" in d["reason"]  # stock mode's restart-aware plan applies to fast actions
    assert "restart_cost_s" in d  # and its decision records what the restart costs
    assert cluster.state.functions[FQFN]["parallelism"] == d["new"]
    # falling behind again at 600/s, but stock mode's cooldown (3 periods) holds the next restart off
    assert load.backlog > 1000, load.backlog


def test_a_steady_load_gets_no_fast_decision(broker, tmp_path):
    fast, cluster, _ = run(broker, tmp_path, [30.0] * 8)
    assert fast == []
    assert cluster.state.functions[FQFN]["parallelism"] == 2


def test_topic_snapshot_prefers_the_in_counter_over_the_brokers_rate():
    fs = FunctionSnapshot(name=FQFN, parallelism=2, service_rate=20.0)
    first = InputReading(time=10.0, rate_in=30.0, in_counter=1000.0, backlog=5.0)
    assert topic_snapshot(fs, None, first).arrival_rate == 30.0  # first reading: msgRateIn
    later = InputReading(time=12.0, rate_in=30.0, in_counter=1240.0, backlog=165.0)
    got = topic_snapshot(fs, first, later)
    assert (got.arrival_rate, got.backlog, got.service_rate) == (pytest.approx(120.0), 165.0, 20.0)
    reloaded = InputReading(time=14.0, rate_in=90.0, in_counter=40.0, backlog=170.0)  # topic reloaded
    assert topic_snapshot(fs, later, reloaded).arrival_rate == 90.0
    assert topic_snapshot(fs, later, None) is fs  # topic stats unread: unchanged
