"""Parsing broker /metrics: pulsar-lite's short topic labels and Apache Pulsar's full names both
resolve to full topic names; backlogs counted in entries are scaled to messages."""

from pulsar_autoscale.broker.metrics import parse

LITE = """
# TYPE pulsar_in_messages_total counter
pulsar_in_messages_total{cluster="pulsar-lite",namespace="public/default",partition="-1",topic="images"} 1000
# TYPE pulsar_subscription_back_log gauge
pulsar_subscription_back_log{cluster="pulsar-lite",namespace="public/default",partition="-1",subscription="public/default/f",topic="images"} 100
# TYPE pulsar_broker_in_messages_total gauge
pulsar_broker_in_messages_total 1000
# TYPE pulsar_entry_size histogram
pulsar_entry_size_bucket{le="+Inf"} 100
pulsar_entry_size_count 100
pulsar_entry_size_sum 12000
"""

APACHE = """
# TYPE pulsar_in_messages_total gauge
pulsar_in_messages_total{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/x"} 42
# TYPE pulsar_subscription_back_log gauge
pulsar_subscription_back_log{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/x",subscription="t/ns/g"} 7
"""


def test_lite_labels_and_batch_correction():
    m = parse(LITE, now=1.0)
    assert m.in_messages == {"persistent://public/default/images": 1000}
    assert m.messages_per_entry == 10.0  # 1,000 messages in 100 entries: producers batched
    assert m.backlog_messages("persistent://public/default/images", "public/default/f") == 1000
    assert m.backlog_messages("persistent://public/default/images", "other") is None


def test_apache_full_topic_names():
    m = parse(APACHE, now=1.0)
    assert m.in_messages == {"persistent://t/ns/x": 42}
    assert m.backlog_messages("persistent://t/ns/x", "t/ns/g") == 7
    assert m.messages_per_entry == 1.0
