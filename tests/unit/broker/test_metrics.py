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


APACHE_BATCHED = """
pulsar_in_messages_total{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/batched"} 600
pulsar_in_bytes_total{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/batched"} 8760
pulsar_in_messages_total{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/plain"} 10
pulsar_in_bytes_total{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/plain"} 146
pulsar_subscription_back_log{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/batched",subscription="s"} 10
pulsar_subscription_back_log{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/plain",subscription="s"} 10
pulsar_subscription_back_log{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/idle",subscription="s"} 10
pulsar_entry_size_count{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/batched"} 10
pulsar_entry_size_sum{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/batched"} 1460
pulsar_entry_size_count{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/plain"} 10
pulsar_entry_size_sum{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/plain"} 146
pulsar_entry_size_count{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/idle"} 0
pulsar_entry_size_sum{cluster="standalone",namespace="t/ns",topic="persistent://t/ns/idle"} 0
"""


def test_each_topic_backlog_is_scaled_by_its_own_batching():
    """Apache Pulsar's figures: 600 messages sent in batches of 10 of which the last stats period saw 10 entries
    (counting 600 / 10 would read 60 per entry), 10 messages sent unbatched, and an idle topic whose entries of
    the last period are 0: each backlog reads 10 entries; in messages they are 100, 10, and 10 (unknown batching:
    as entries)."""
    for topics in (None, {"persistent://t/ns/batched", "persistent://t/ns/plain", "persistent://t/ns/idle"}):
        m = parse(APACHE_BATCHED, now=1.0, topics=topics)
        assert m.backlog_messages("persistent://t/ns/batched", "s") == 100
        assert m.backlog_messages("persistent://t/ns/plain", "s") == 10
        assert m.backlog_messages("persistent://t/ns/idle", "s") == 10


def test_an_idle_topic_keeps_the_batching_it_was_written_with():
    busy = parse(APACHE_BATCHED, now=1.0)
    idle = parse(APACHE_BATCHED.replace('batched"} 10\n', 'batched"} 0\n').replace('batched"} 1460', 'batched"} 0'), now=2.0)
    assert idle.backlog_messages("persistent://t/ns/batched", "s") == 10  # no entries this period: unknown
    topics = {"persistent://t/ns/batched", "persistent://t/ns/plain"}
    later = idle.remembering(busy.batching, topics)
    assert later.backlog_messages("persistent://t/ns/batched", "s") == 100
    assert set(later.batching) == topics  # only the inputs asked for are kept


def test_apache_full_topic_names():
    m = parse(APACHE, now=1.0)
    assert m.in_messages == {"persistent://t/ns/x": 42}
    assert m.backlog_messages("persistent://t/ns/x", "t/ns/g") == 7
    assert m.messages_per_entry == 1.0


def _lite_metrics(topics: int) -> str:
    """A pulsar-lite /metrics page with many topics, one subscription each."""
    lines = [
        "# TYPE pulsar_broker_in_messages_total gauge",
        f"pulsar_broker_in_messages_total {topics * 10}",
        "pulsar_entry_size_count " + str(topics),
    ]
    for i in range(topics):
        base = 'cluster="pulsar-lite",namespace="public/default",partition="-1"'
        labels, sub = f'{base},topic="t{i}"', f'{base},subscription="public/default/f{i}",topic="t{i}"'
        lines += [
            f"pulsar_in_messages_total{{{labels}}} {i}",
            f"pulsar_rate_in{{{labels}}} 0",
            f"pulsar_subscription_back_log{{{sub}}} {i % 7}",
            f"pulsar_out_bytes_total{{{sub}}} 5",
        ]
    return "\n".join(lines) + "\n"


def test_only_the_asked_topics_are_parsed_and_their_figures_are_the_same():
    text = _lite_metrics(2000)
    asked = {"persistent://public/default/t8", "persistent://public/default/t1999"}
    every, some = parse(text, now=1.0), parse(text, now=1.0, topics=asked)
    assert set(some.in_messages) == asked and len(every.in_messages) == 2000
    assert {t: some.in_messages[t] for t in asked} == {t: every.in_messages[t] for t in asked}
    assert (
        some.backlog_messages("persistent://public/default/t8", "public/default/f8")
        == every.backlog_messages("persistent://public/default/t8", "public/default/f8")
        == 1 * 10
    )  # 8 % 7 entries
    assert some.messages_per_entry == every.messages_per_entry == 10.0
    # names that only share a prefix are not confused: t1 is not t17 or t1999
    assert parse(text, now=1.0, topics={"persistent://public/default/t1"}).in_messages == {"persistent://public/default/t1": 1}


def test_apache_full_names_are_filtered_too():
    assert parse(APACHE, now=1.0, topics={"persistent://t/ns/x"}).in_messages == {"persistent://t/ns/x": 42}
    assert parse(APACHE, now=1.0, topics={"persistent://t/ns/y"}).in_messages == {}
