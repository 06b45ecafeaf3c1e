"""Reading a broker's Prometheus /metrics: per-topic message counters and per-subscription backlogs.

Topic labels differ: Apache Pulsar labels the full name (persistent://t/ns/x), pulsar-lite the
short name plus a namespace label; both are normalised to the full name here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Collection, Mapping

import requests
from prometheus_client.parser import text_string_to_metric_families

from pulsar_autoscale.errors import BrokerError


@dataclass(frozen=True)
class BrokerMetrics:
    time: float
    in_messages: dict[str, float] = field(default_factory=dict)  # topic -> cumulative messages in
    backlog: dict[tuple[str, str], float] = field(default_factory=dict)  # (topic, subscription) -> entries
    messages_per_entry: float = 1.0  # broker-wide: backlogs count entries (batches), not messages
    unacked: dict[tuple[str, str], float] = field(default_factory=dict)  # (topic, subscription) -> messages
    batching: dict[str, float] = field(default_factory=dict)  # topic -> its own messages per entry

    def backlog_messages(self, topic: str, subscription: str) -> float | None:
        entries = self.backlog.get((topic, subscription))
        return None if entries is None else entries * self.topic_messages_per_entry(topic)

    def topic_messages_per_entry(self, topic: str) -> float:
        """The topic's own batching where the broker tells it (Apache Pulsar), so that an unbatched input beside
        batched topics is not read as batched; the broker-wide figure where the broker counts entries only
        broker-wide (pulsar-lite B17)."""
        return self.batching.get(topic, self.messages_per_entry)

    def remembering(self, known: Mapping[str, float], topics: Collection[str]) -> "BrokerMetrics":
        """These figures, with the batching of `topics` that this scrape does not tell taken from `known` (an
        earlier scrape's): an idle topic's backlog keeps the batching it was written with."""
        return replace(self, batching={t: v for t, v in {**known, **self.batching}.items() if t in topics})


def topic_batching(entry_count: float, entry_bytes: float, messages: float, message_bytes: float) -> float | None:
    """A topic's messages per entry from Apache Pulsar's figures: its entries' mean size (pulsar_entry_size_sum /
    _count) over its messages' mean size (pulsar_in_bytes_total / pulsar_in_messages_total); None when one is
    unknown. Sizes, not counts: the entry figures cover the last managed-ledger stats period only (60 s by default;
    an idle topic's are 0), the message counters everything since the topic was loaded, so their counts cannot be
    divided (a topic that had 600 messages and 10 entries in the last period read as 60 messages per entry),
    while mean sizes stay comparable as long as the producers' batching and message sizes do."""
    if min(entry_count, entry_bytes, messages, message_bytes) <= 0:
        return None
    return max((entry_bytes / entry_count) / (message_bytes / messages), 1.0)


def _topic(labels: dict) -> str:
    topic = labels.get("topic", "")
    if "://" in topic:
        return topic
    return f"persistent://{labels.get('namespace', 'public/default')}/{topic}"


PER_TOPIC = (
    "pulsar_in_messages_total{",
    "pulsar_in_bytes_total{",
    "pulsar_subscription_back_log{",
    "pulsar_subscription_unacked_messages{",
    "pulsar_entry_size_count{",
    "pulsar_entry_size_sum{",
)
BROKER_WIDE = ("pulsar_broker_in_messages_total", "pulsar_entry_size_count ")


def relevant(text: str, topics: Collection[str]) -> str:
    """Only the samples parse() reads, and of the per-topic ones only those of `topics`.

    A broker's /metrics grows with every topic and subscription (about 30 lines each): a session broker
    with a few thousand of them answered with 10^5 lines, and parsing all of them with the Prometheus
    parser made one controller period take more than 10 s on 2 cores. String tests on each line cost
    little; the parser then sees a few lines per input topic."""
    needles = tuple({f'topic="{n}' for t in topics for n in (t, t.rsplit("/", 1)[-1])})  # a superset: parse() resolves names
    return "\n".join(
        line
        for line in text.splitlines()
        if line.startswith(BROKER_WIDE) or (line.startswith(PER_TOPIC) and any(n in line for n in needles))
    )


def parse(text: str, now: float, topics: Collection[str] | None = None) -> BrokerMetrics:
    """The broker's counters and backlogs; with `topics` (full names), of those topics only."""
    in_messages: dict[str, float] = {}
    backlog: dict[tuple[str, str], float] = {}
    unacked: dict[tuple[str, str], float] = {}
    per_topic: dict[str, dict[str, float]] = {}  # topic -> entry count, entry bytes, message bytes
    totals = {"messages": 0.0, "entries": 0.0}
    for family in text_string_to_metric_families(text if topics is None else relevant(text, topics)):
        for sample in family.samples:
            name, labels = sample.name, sample.labels
            if name == "pulsar_in_messages_total" and "topic" in labels:
                t = _topic(labels)
                in_messages[t] = in_messages.get(t, 0.0) + sample.value
            elif name == "pulsar_subscription_back_log" and "subscription" in labels:
                key = (_topic(labels), labels["subscription"])
                backlog[key] = backlog.get(key, 0.0) + sample.value
            elif name == "pulsar_subscription_unacked_messages" and "subscription" in labels:
                key = (_topic(labels), labels["subscription"])
                unacked[key] = unacked.get(key, 0.0) + sample.value
            elif name == "pulsar_broker_in_messages_total":
                totals["messages"] = sample.value
            elif name in ("pulsar_entry_size_count", "pulsar_entry_size_sum", "pulsar_in_bytes_total") and "topic" in labels:
                figures = per_topic.setdefault(_topic(labels), {})
                figures[name] = figures.get(name, 0.0) + sample.value
            elif name == "pulsar_entry_size_count":
                totals["entries"] += sample.value
    ratio = totals["messages"] / totals["entries"] if totals["entries"] > 0 and totals["messages"] > 0 else 1.0
    batching = {}
    for t, f in per_topic.items():
        mpe = topic_batching(
            f.get("pulsar_entry_size_count", 0.0),
            f.get("pulsar_entry_size_sum", 0.0),
            in_messages.get(t, 0.0),
            f.get("pulsar_in_bytes_total", 0.0),
        )
        if mpe is not None:
            batching[t] = mpe
    if topics is not None:  # relevant() kept a superset (names sharing a prefix)
        in_messages = {t: v for t, v in in_messages.items() if t in topics}
        backlog = {k: v for k, v in backlog.items() if k[0] in topics}
        unacked = {k: v for k, v in unacked.items() if k[0] in topics}
        batching = {t: v for t, v in batching.items() if t in topics}
    return BrokerMetrics(now, in_messages, backlog, max(ratio, 1.0), unacked, batching)


def fetch(metrics_url: str, now: float, timeout_s: float = 5.0, topics: Collection[str] | None = None) -> BrokerMetrics:
    try:
        resp = requests.get(metrics_url, timeout=timeout_s)
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise BrokerError(f"cannot read broker metrics at {metrics_url}: {exc}") from exc
    return parse(resp.text, now, topics)
