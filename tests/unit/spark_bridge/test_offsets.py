"""Offsets and option parsing without Spark or a broker."""

from __future__ import annotations

import json

import pulsar
import pytest

from pulsar_autoscale.spark_bridge.offsets import BATCH_END, EARLIEST, Position, TopicRange, offsets_from_json, offsets_to_json
from pulsar_autoscale.spark_bridge.options import PulsarOptionError, parse_sink_options, parse_source_options

T = "persistent://public/default/t"


def test_split_cuts_at_entry_boundaries_and_covers_the_range():
    rng = TopicRange(T, Position(0, 9, 3), Position(0, 99, BATCH_END))
    pieces = rng.split(3)
    assert [p.start for p in pieces][0] == rng.start and pieces[-1].end == rng.end
    assert all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
    assert [p.end for p in pieces[:-1]] == [Position(0, 39, BATCH_END), Position(0, 69, BATCH_END)]
    assert TopicRange(T, Position(0, 5, 1), Position(0, 5, 7)).split(4) == [TopicRange(T, Position(0, 5, 1), Position(0, 5, 7))]
    assert TopicRange(T, EARLIEST, Position(3, 1, -1)).split(2)[0].end == Position(3, 0, BATCH_END)


def test_position_of_a_batch_s_last_message_is_its_entry_end():
    last = pulsar.MessageId.deserialize(bytes([8, 0, 16, 4, 32, 9, 48, 10]))  # batch index 9 of 10
    middle = pulsar.MessageId.deserialize(bytes([8, 0, 16, 4, 32, 3, 48, 10]))
    assert Position.of(last) == Position(0, 4, BATCH_END)
    assert Position.of(middle) == Position(0, 4, 3)
    assert Position.of(pulsar.MessageId.earliest) == EARLIEST


def test_offsets_json_round_trip_uses_message_id_bytes():
    offsets = {T: Position(2, 7, BATCH_END), T + "2": EARLIEST}
    data = offsets_to_json(offsets)
    assert json.loads(json.dumps(data)) == data and offsets_from_json(data) == offsets


@pytest.mark.parametrize(
    "options,named",
    [
        ({"topic": "a", "topics": "a,b"}, "exactly one"),
        ({"topic": "a", "endingOffsets": "earliest"}, "endingOffsets"),
        ({"topic": "a", "startingOffsets": '{"b": "earliest"}'}, "not read"),
        ({"topic": "a/b"}, "topic"),
        ({"topic": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"topic": "a", "service.url": "http://x"}, "service.url"),
    ],
)
def test_bad_source_options_name_the_option(options, named):
    with pytest.raises(PulsarOptionError, match=named):
        parse_source_options({"service.url": "pulsar://h:6650", **options})


def test_source_defaults_and_short_topic_names():
    opts = parse_source_options({"service.url": "pulsar://h:6650", "topics": "a, persistent://x/y/b"})
    assert opts.topics == ("persistent://public/default/a", "persistent://x/y/b")
    assert opts.starting.special == "earliest" and opts.max_records_per_trigger is None and opts.fail_on_data_loss
    assert parse_sink_options({"service.url": "pulsar://h:6650"}).topic is None
