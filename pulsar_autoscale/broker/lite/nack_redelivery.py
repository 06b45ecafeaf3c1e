"""B13: a nacked message of a Failover subscription is never redelivered by pulsar-lite; Apache Pulsar
redelivers it without counting, so neither broker lets the Pulsar client's DeadLetterPolicy take a poison message.

Tests: tests/integration/broker_conformance/test_messages.py::test_negative_ack_redelivers_to_the_same_subscription
(the defect), tests/integration/worker/test_function_semantics.py::test_poison_message_is_delivered_three_times_then_dead_lettered
(the fence: it fails without it), tests/system/keyed/test_cluster_controls.py::test_an_update_of_the_retries_reaches_the_keyed_input
(a keyed function's Failover route topic on Apache Pulsar).
"""

from __future__ import annotations

import time
from collections import deque

import pulsar

from pulsar_autoscale.broker.profile import BrokerProfile

# What the Pulsar client adds to a message it dead-letters (DeadLetterPolicy).
DLQ_REAL_TOPIC, DLQ_ORIGIN_MESSAGE_ID = "REAL_TOPIC", "ORIGIN_MESSAGE_ID"


def fence_nacks(
    consumer,
    cfg,
    client: pulsar.Client,
    broker: BrokerProfile,
    redelivery_delay_s: float,
    subscription_type: str | None = None,
    dead_letter_topic: str | None = None,
):
    """A consumer whose nacks count against maxMessageRetries as Pulsar's DeadLetterPolicy counts them: where
    the broker does not count a FAILOVER consumer's redeliveries (B13; Apache Pulsar, see profile.APACHE) the
    consumer counts them itself, elsewhere it is returned as it is. `subscription_type`: the consumer's, when it
    is not the function's (a keyed route topic); `dead_letter_topic`: where the function's dead letters go,
    when not derived from the message's topic."""
    if not broker.nack_redelivery or (subscription_type or cfg.subscription_type).upper() != "FAILOVER":
        return consumer
    return NackRedelivery(consumer, cfg, client, redelivery_delay_s, dead_letter_topic)


class NackRedelivery:
    """B13 fence: a nacked message comes back from receive() after the nack delay, and after
    maxMessageRetries redeliveries goes to the dead-letter topic and is acked, as the Pulsar client's
    DeadLetterPolicy does with the broker's redelivery count (docs/dev/pulsar-lite-defects.md B13). The message never
    leaves this consumer's unacked set meanwhile, so a consumer that closes leaves it to the broker."""

    is_consumer = True  # stands for one consumer of its own: closing it redelivers what it handed out unacked

    def __init__(self, consumer, cfg, client: pulsar.Client, redelivery_delay_s: float, dead_letter_topic: str | None = None):
        self._consumer = consumer
        self._client = client
        self._delay_s = redelivery_delay_s
        self._max = cfg.maxMessageRetries
        self._dead_letter_topic = dead_letter_topic or cfg.deadLetterTopic
        self._subscription = cfg.subscription_name
        self._due: deque = deque()  # (due time, message), in nack order: one delay for all
        self._nacks: dict[str, int] = {}  # message id -> redeliveries so far
        self._producers: dict[str, pulsar.Producer] = {}
        self.redelivered = 0
        self.dead_lettered = 0

    def receive(self, timeout_millis: int):
        now = time.monotonic()
        if self._due and self._due[0][0] <= now:
            self.redelivered += 1
            return self._due.popleft()[1]
        if self._due:
            timeout_millis = max(1, min(timeout_millis, int((self._due[0][0] - now) * 1000) + 1))
        return self._consumer.receive(timeout_millis=timeout_millis)

    def acknowledge(self, msg) -> None:
        self._nacks.pop(str(msg.message_id()), None)
        self._consumer.acknowledge(msg)

    def negative_acknowledge(self, msg) -> None:
        mid = str(msg.message_id())
        count = self._nacks.get(mid, 0)
        if self._max is not None and count >= self._max:
            self._dead_letter(msg)
            self.acknowledge(msg)
            return
        self._nacks[mid] = count + 1
        self._due.append((time.monotonic() + self._delay_s, msg))

    def _dead_letter(self, msg) -> None:
        topic = msg.topic_name()
        base = topic.rsplit("-partition-", 1)[0] if "-partition-" in topic else topic
        dlq = self._dead_letter_topic or f"{base}-{self._subscription}-DLQ"
        producer = self._producers.get(dlq) or self._producers.setdefault(dlq, self._client.create_producer(dlq))
        properties = {**msg.properties(), DLQ_REAL_TOPIC: topic, DLQ_ORIGIN_MESSAGE_ID: str(msg.message_id())}
        kwargs = {"partition_key": msg.partition_key()} if msg.partition_key() else {}
        producer.send(msg.data(), properties=properties, **kwargs)
        self.dead_lettered += 1

    def close(self) -> None:
        for producer in self._producers.values():
            producer.close()
        self._consumer.close()

    def __getattr__(self, name):  # is_connected, unsubscribe, ...: the consumer's own
        return getattr(self._consumer, name)
