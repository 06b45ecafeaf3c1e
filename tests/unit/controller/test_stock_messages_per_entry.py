"""The stock adapter's backlog in messages from Apache Pulsar's msgBacklog, which counts entries."""

from pulsar_autoscale.admin.stock import messages_per_entry


def test_the_consumers_figure_scales_the_entries():
    # Apache Pulsar 4.0.8, a subscription of 100 messages sent in batches of 10 (msgBacklog 10)
    sub = {"msgBacklog": 10, "consumers": [{"avgMessagesPerEntry": 10, "msgOutCounter": 10}]}
    assert messages_per_entry(sub) == 10


def test_consumers_before_their_first_dispatch_do_not_count():
    sub = {"msgBacklog": 10, "consumers": [{"avgMessagesPerEntry": 0}, {"avgMessagesPerEntry": 8}]}
    assert messages_per_entry(sub) == 8


def test_without_a_figure_the_backlog_reads_as_entries():
    assert messages_per_entry({"msgBacklog": 10, "consumers": []}) == 1
    assert messages_per_entry({"msgBacklog": 10}) == 1
    assert messages_per_entry({"consumers": [{"avgMessagesPerEntry": True}, "x", {"avgMessagesPerEntry": None}]}) == 1
