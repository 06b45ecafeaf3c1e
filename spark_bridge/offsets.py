"""Offsets: one Pulsar message id per topic partition, as Spark checkpoints them.

The JSON form is StreamNative's pulsar-spark connector's: ``{"<topic>": [8, 11, 16, 101]}``,
the bytes of ``MessageId.serialize()`` (Pulsar's MessageIdData protobuf). The same bytes are
the source's ``messageId`` column, so ``list(row.messageId)`` is a valid offset. A topic may
also map to ``"earliest"`` or ``"latest"``.

A Spark range ``(start, end]`` is exclusive at the start and inclusive at the end, per topic.
Ordering is Pulsar's: (ledger, entry, batch index).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

# A batch index past any real one: Position(l, e, BATCH_END) sorts after every message of entry e.
BATCH_END = 2**31 - 1


@dataclass(frozen=True, order=True)
class Position:
    """A point in one topic partition's log; a real message id or an entry boundary."""

    ledger: int
    entry: int
    batch: int = -1

    @classmethod
    def of(cls, message_id) -> "Position":
        """The canonical position: the last message of an entry is the entry's end.

        So a range ending at an entry boundary stops on that entry's last message instead of
        waiting for a next one that may never come (pulsar-lite reports the last message id
        without its batch index).
        """
        if message_id.ledger_id() < 0:
            return EARLIEST
        batch = message_id.batch_index()
        if batch < 0 or batch == _batch_size(message_id.serialize()) - 1:
            batch = BATCH_END
        return cls(message_id.ledger_id(), message_id.entry_id(), batch)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Position":
        import pulsar

        return cls.of(pulsar.MessageId.deserialize(bytes(data)))

    def key(self) -> tuple[int, int, int]:
        return (self.ledger, self.entry, self.batch)

    def message_id(self):
        """The pulsar.MessageId a Reader starts after (exclusive)."""
        import pulsar

        if self == EARLIEST:
            return pulsar.MessageId.earliest
        return pulsar.MessageId(-1, self.ledger, self.entry, self.batch)

    def to_json(self) -> list[int]:
        return list(self.message_id().serialize())


EARLIEST = Position(-1, -1, -1)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _batch_size(serialized: bytes) -> int:
    """Field 6 (batch_size) of Pulsar's MessageIdData protobuf; 0 when absent."""
    i = 0
    while i < len(serialized):
        tag, i = _varint(serialized, i)
        if tag & 7 == 2:  # length-delimited (first_chunk_message_id): skip it
            length, i = _varint(serialized, i)
            i += length
            continue
        value, i = _varint(serialized, i)
        if tag >> 3 == 6:
            return value
    return 0


@dataclass(frozen=True)
class StartSpec:
    """What an offsets option asked for: 'earliest'/'latest' for all topics, or per topic."""

    special: str | None = None
    per_topic: Mapping[str, "Position | str"] = field(default_factory=dict)

    def for_topic(self, topic: str, default: str) -> "Position | str":
        """A Position, or 'earliest'/'latest' still to be resolved against the broker."""
        if self.special:
            return self.special
        return self.per_topic.get(topic, default)


def offsets_to_json(offsets: Mapping[str, Position]) -> dict[str, list[int]]:
    """The dict Spark checkpoints (and a user may pass back as startingOffsets)."""
    return {topic: pos.to_json() for topic, pos in sorted(offsets.items())}


def offsets_from_json(data: Mapping[str, list[int]]) -> dict[str, Position]:
    return {topic: Position.from_bytes(bytes(b & 0xFF for b in raw)) for topic, raw in data.items()}


@dataclass(frozen=True)
class TopicRange:
    """Messages of one topic partition with start < id <= end."""

    topic: str
    start: Position
    end: Position

    @property
    def empty(self) -> bool:
        return self.end <= self.start

    def split(self, pieces: int) -> list["TopicRange"]:
        """Cut at entry boundaries of the end's ledger; entries of a ledger are contiguous.

        Entries in earlier ledgers are not known without the admin API, so they stay in the
        first piece. A range that cannot be cut (one entry) stays whole.
        """
        first = self.start.entry + 1 if self.start.ledger == self.end.ledger else 0
        count = self.end.entry - first + 1  # entries first..end.entry; a cut c starts a piece at entry c
        cuts = sorted({first + count * i // pieces for i in range(1, pieces)})
        bounds = [
            self.start,
            *(Position(self.end.ledger, c - 1, BATCH_END) for c in cuts if first < c <= self.end.entry),
            self.end,
        ]
        return [TopicRange(self.topic, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]

    def entries(self) -> int:
        """Entries in the range when it lies in one ledger, else those of the end's ledger."""
        first = self.start.entry if self.start.ledger == self.end.ledger else -1
        return max(0, self.end.entry - first)
