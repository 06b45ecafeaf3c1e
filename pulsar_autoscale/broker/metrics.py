"""Reading a broker's Prometheus /metrics: per-topic message counters and per-subscription backlogs.

Topic labels differ: Apache Pulsar labels the full name (persistent://t/ns/x), pulsar-lite the
short name plus a namespace label; both are normalised to the full name here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection

import requests
from prometheus_client.parser import text_string_to_metric_families

from pulsar_autoscale.errors import BrokerError


@dataclass(frozen=True)
class BrokerMetrics:
    time: float
    in_messages: dict[str, float] = field(default_factory=dict)              # topic -> cumulative messages in
    backlog: dict[tuple[str, str], float] = field(default_factory=dict)      # (topic, subscription) -> entries
    messages_per_entry: float = 1.0   # broker-wide: backlogs count entries (batches), not messages
    unacked: dict[tuple[str, str], float] = field(default_factory=dict)      # (topic, subscription) -> messages
    entries: dict[str, float] = field(default_factory=dict)                  # topic -> cumulative entries in

    def backlog_messages(self, topic: str, subscription: str) -> float | None:
        entries = self.backlog.get((topic, subscription))
        return None if entries is None else entries * self.topic_messages_per_entry(topic)

    def topic_messages_per_entry(self, topic: str) -> float:
        """The topic's own batching (messages in / entries in, both counted since the topic was loaded), so that
        an unbatched input beside batched topics is not read as batched; the broker-wide figure where the broker
        counts entries only broker-wide (pulsar-lite B17)."""
        entries, messages = self.entries.get(topic, 0.0), self.in_messages.get(topic, 0.0)
        if entries > 0 and messages > 0:
            return max(messages / entries, 1.0)
        return self.messages_per_entry


def _topic(labels: dict) -> str:
    topic = labels.get("topic", "")
    if "://" in topic:
        return topic
    return f"persistent://{labels.get('namespace', 'public/default')}/{topic}"


PER_TOPIC = ("pulsar_in_messages_total{", "pulsar_subscription_back_log{", "pulsar_subscription_unacked_messages{",
             "pulsar_entry_size_count{")
BROKER_WIDE = ("pulsar_broker_in_messages_total", "pulsar_entry_size_count ")


def relevant(text: str, topics: Collection[str]) -> str:
    """Only the samples parse() reads, and of the per-topic ones only those of `topics`.

    A broker's /metrics grows with every topic and subscription (about 30 lines each): a session broker
    with a few thousand of them answered with 10^5 lines, and parsing all of them with the Prometheus
    parser made one controller period take more than 10 s on 2 cores. String tests on each line cost
    little; the parser then sees a few lines per input topic."""
    needles = tuple({f'topic="{n}' for t in topics for n in (t, t.rsplit("/", 1)[-1])})   # a superset: parse() resolves names
    return "\n".join(line for line in text.splitlines()
                     if line.startswith(BROKER_WIDE)
                     or (line.startswith(PER_TOPIC) and any(n in line for n in needles)))


def parse(text: str, now: float, topics: Collection[str] | None = None) -> BrokerMetrics:
    """The broker's counters and backlogs; with `topics` (full names), of those topics only."""
    in_messages: dict[str, float] = {}
    backlog: dict[tuple[str, str], float] = {}
    unacked: dict[tuple[str, str], float] = {}
    entries: dict[str, float] = {}
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
            elif name == "pulsar_entry_size_count" and "topic" in labels:
                t = _topic(labels)
                entries[t] = entries.get(t, 0.0) + sample.value
            elif name == "pulsar_entry_size_count":
                totals["entries"] += sample.value
    ratio = totals["messages"] / totals["entries"] if totals["entries"] > 0 and totals["messages"] > 0 else 1.0
    if topics is not None:   # relevant() kept a superset (names sharing a prefix)
        in_messages = {t: v for t, v in in_messages.items() if t in topics}
        backlog = {k: v for k, v in backlog.items() if k[0] in topics}
        unacked = {k: v for k, v in unacked.items() if k[0] in topics}
        entries = {t: v for t, v in entries.items() if t in topics}
    return BrokerMetrics(now, in_messages, backlog, max(ratio, 1.0), unacked, entries)


def fetch(metrics_url: str, now: float, timeout_s: float = 5.0, topics: Collection[str] | None = None
          ) -> BrokerMetrics:
    try:
        resp = requests.get(metrics_url, timeout=timeout_s)
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise BrokerError(f"cannot read broker metrics at {metrics_url}: {exc}") from exc
    return parse(resp.text, now, topics)
