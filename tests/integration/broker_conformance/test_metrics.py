"""The broker's Prometheus /metrics: the Monitor's view of topics and subscriptions.

The controller reads backlog (Q), arrival counts/rates (lambda) and delivery rates per
topic and subscription from /metrics. Gauges refresh about every 5 s, so every check
polls for the expected value with a deadline instead of sleeping.
"""

from __future__ import annotations

import pulsar
import pytest

from pulsar_autoscale.broker.metrics import fetch
from tests.support.conformance import client, drain, metric, produce, scrape, wait_for

REFRESH_S = 15  # three refresh periods
# Apache Pulsar refreshes its managed-ledger figures (entry sizes) every managedLedgerStatsPeriodSeconds: 5 s in the
# tests' standalone, 60 s by default, so the bound holds for a standalone of Pulsar's defaults too (two periods and more)
ENTRY_REFRESH_S = 150


def _when(broker, topic: str, sub: str, check, what: str) -> dict:
    def probe():
        samples = scrape(broker.metrics_url)
        values = {
            name: metric(samples, name, topic, sub if "subscription" in name else None)
            for name in (
                "pulsar_subscription_back_log",
                "pulsar_in_messages_total",
                "pulsar_rate_in",
                "pulsar_subscription_msg_rate_out",
                "pulsar_subscription_consumers_count",
                "pulsar_subscription_unacked_messages",
            )
        }
        return values if check(values) else None

    return wait_for(probe, REFRESH_S, what, interval_s=0.5)


def test_backlog_counter_and_rates_per_topic_and_subscription(broker, topic):
    n = 50
    with client(broker.service_url) as c:
        consumer = c.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1)
        produce(c, topic, n)
        before = _when(
            broker,
            topic,
            "fn",
            lambda v: v["pulsar_subscription_back_log"] == n and v["pulsar_in_messages_total"] == n,
            f"backlog == in_messages_total == {n}",
        )
        assert before["pulsar_subscription_consumers_count"] == 1
        assert before["pulsar_rate_in"] is not None, "no per-topic pulsar_rate_in"
        assert len(drain(consumer)) == n
        # the delivery rate is a rate over the last refresh period on Apache Pulsar: the refresh that covers
        # the drain shows it, and it may have dropped back to 0 by the time the backlog reads 0
        rates: list[float] = []
        after = _when(
            broker,
            topic,
            "fn",
            lambda v: (
                rates.append(v["pulsar_subscription_msg_rate_out"] or 0.0)
                or (v["pulsar_subscription_back_log"] == 0 and max(rates) > 0)
            ),
            "backlog 0 after acking everything, and a delivery rate reported",
        )
    assert after["pulsar_in_messages_total"] == n
    assert after["pulsar_subscription_unacked_messages"] == 0


def test_backlog_counts_entries_not_messages_when_batching(broker, topic):
    """The Monitor must not read backlog as messages when producers batch (real Pulsar counts entries too)."""
    n = 500
    with client(broker.service_url) as c:
        c.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1).close()
        produce(c, topic, n, batching=True)
        seen = _when(
            broker,
            topic,
            "fn",
            lambda v: v["pulsar_in_messages_total"] == n and v["pulsar_subscription_back_log"],
            f"in_messages_total == {n}",
        )
    assert 0 < seen["pulsar_subscription_back_log"] < n, (
        f"backlog {seen['pulsar_subscription_back_log']} for {n} batched messages"
    )


@pytest.mark.lite_defect(
    reason="pulsar-lite B14 (docs/dev/pulsar-lite-defects.md): an unsubscribed subscription's series stay "
    "in /metrics for good (backlog 0), and creating new subscriptions slows as they pile up"
)
def test_an_unsubscribed_subscription_leaves_the_metrics(broker, topic):
    """Apache Pulsar drops a deleted subscription's series. Why lite_quirks pads consumer ids on one
    subscription per slot instead of a fresh one per client."""
    with client(broker.service_url) as c:
        c.subscribe(topic, "gone", consumer_type=pulsar.ConsumerType.Shared).unsubscribe()
        c.subscribe(topic, "kept", consumer_type=pulsar.ConsumerType.Shared).close()
        produce(c, topic, 1)
        _when(
            broker,
            topic,
            "kept",
            lambda v: v["pulsar_subscription_back_log"] == 1,
            "backlog 1 on the kept subscription (the gauges refreshed after the unsubscribe)",
        )
    gone = metric(scrape(broker.metrics_url), "pulsar_subscription_back_log", topic, "gone")
    assert gone is None, f"the unsubscribed subscription still reports backlog {gone}"


@pytest.mark.lite_defect(
    reason="pulsar-lite B17 (docs/dev/pulsar-lite-defects.md): entries are counted broker-wide only "
    "(pulsar_entry_size_count has no topic label), so a topic's own batching is unknown"
)
def test_each_topic_tells_its_own_batching(broker, topic):
    """What turns one topic's backlog (entries) into messages: its own messages per entry, from its entries' and
    its messages' mean sizes (the entry figures cover the last stats period only). With one broker-wide ratio, an
    unbatched topic beside a batched one reads as batched (its backlog multiplied)."""
    n, plain = 200, f"{topic}-plain"
    with client(broker.service_url) as c:
        for t in (topic, plain):
            c.subscribe(t, "fn", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1).close()
        produce(c, topic, n, batching=True)
        produce(c, plain, n // 4)

        def both_known():
            samples = scrape(broker.metrics_url)
            broker_wide = [
                v for (name, labels), v in samples.items() if name == "pulsar_entry_size_count" and not dict(labels).get("topic")
            ]
            assert metric(samples, "pulsar_entry_size_count", topic) is not None or not broker_wide, (
                f"entries counted broker-wide only ({broker_wide[0]:.0f}), none for {topic}"
            )
            known = fetch(broker.metrics_url, 0.0, topics={topic, plain}).batching
            entries = metric(samples, "pulsar_entry_size_count", topic)
            return (known, entries) if topic in known and plain in known and entries else None

        known, entries = wait_for(
            both_known, ENTRY_REFRESH_S, f"the batching of {topic} and {plain} after {n} and {n // 4} messages", interval_s=0.5
        )
    assert entries < n, f"{entries} entries for {n} batched messages"
    assert abs(known[topic] - n / entries) <= 0.05 * n / entries, (known, n / entries)
    assert abs(known[plain] - 1.0) <= 0.05, known
