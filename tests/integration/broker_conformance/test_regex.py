"""Regex (topicsPattern) subscriptions: the client lists the namespace's topics (GetTopicsOfNamespace)
and subscribes to those that match. pulsar-lite never answers that request (B9), so the worker refuses
topicsPattern on pulsar-lite (lite.function_limits.check_function) and passes the pattern to the client on Apache Pulsar."""

from __future__ import annotations

import re

import pulsar
import pytest

from tests.support.conformance import client


@pytest.mark.lite_defect(
    raises=pulsar.PulsarException, reason="pulsar-lite B9: GetTopicsOfNamespace times out, so a regex subscription never opens"
)
def test_regex_subscription_receives_from_matching_topics(broker, topic):
    with client(broker.service_url, op_timeout_s=2) as c:
        producer = c.create_producer(topic)
        consumer = c.subscribe(
            re.compile(re.escape(topic[:-4]) + ".*"), "regex", initial_position=pulsar.InitialPosition.Earliest
        )
        producer.send(b"x")
        assert consumer.receive(5000).data() == b"x"
