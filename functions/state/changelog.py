"""A function's state changelog on Pulsar: every state change, as the key's new absolute value.

Kafka Streams' design, on a Pulsar topic: a state store is a cache of its changelog, so a key
group's state is rebuilt on any worker by replaying the records of that group (docs/state.md).
A record is keyed `{group}:{kind}:{state key}` so that topic compaction (Apache Pulsar) keeps the
latest value of each, and carries its group (`kg`), its kind (counter, state value, deleted), a
per-key version (restore keeps the highest, so records of two producers can never reorder a key),
and under EFFECTIVELY_ONCE the input message id that applied it, with its place among that
message's records (`part` of `parts`): a restore applies a message's records only once all arrived.

A keyedState function's changelog is sharded (`Changelog`): `changelogShards` topics over contiguous key-group
ranges, so that opening a few groups after a move reads the tail of their range only, not every group's records
(at 500 MB of state the whole tail was what made a migration's opens slow, BENCHMARKS.md).

Where the changelog ends is found with a marker record: a reader reads up to the marker it has just
published, which needs no `has_message_available` or `get_last_message_id` (both unreliable on
pulsar-lite, docs/dev/pulsar-lite-defects.md) and no seek (B5).
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, Iterator, cast

import pulsar

from pulsar_autoscale.broker.lite.readers import MIN_READER_QUEUE, reader_queue

if TYPE_CHECKING:
    from pulsar_autoscale.functions.model.config import FunctionConfig

COUNTER, VALUE, DELETED = "c", "s", "d"
MARKER_KEY = "__marker__"
log = logging.getLogger(__name__)
# A reader with nothing for READ_STALL_MS before the end marker is reopened from the last record read (a
# pulsar-lite reader sometimes stops short of the end, docs/state.md; on Apache Pulsar a reopen is a reconnect);
# after READ_TIMEOUT_MS without a record the broker counts as down.
READ_STALL_MS = 1_000
READ_TIMEOUT_MS = 15_000
# Receiver queues, shared by the readers of one restore that read shards side by side: what the broker pushes at
# a reader's start, unpaced. A paced read (a pre-copy, beside the function's traffic) holds about
# PACED_READER_BYTES, at most PACED_READER_QUEUE records: it starts with the smallest queue and, once its first
# record tells the records' size, reads again from its start with the queue they allow (200 records of 50 KB
# were 10 MB pushed through the broker at once, in the first moments of a change).
READER_QUEUE = 5000  # pulsar-lite readers with small queues deliver more duplicates
PACED_READER_QUEUE = 200
PACED_READER_BYTES = 1_000_000
# A paced read calls its pace after every PACE_BYTES read (at most PACE_RECORDS records): the read's average rate
# is the pace's, and its bursts are what a live topic's records wait behind in the broker. Paced every 50 records of
# 50 KB (2.5 MB at full speed, then a sleep), a catch-up read at 20 MB/s raised another topic's p99 on pulsar-lite
# from 0.7 ms to 6.3-8.2 ms; every 100 KB, to 0.8-1.2 ms (BENCHMARKS.md, "A catch-up read's bursts").
PACE_BYTES = 100_000
PACE_RECORDS = 50
# A record not persisted within this fails its flush (an error naming the topic) instead of blocking a drain
# forever while the broker is away; nothing after it is acked, so its input comes again.
SEND_TIMEOUT_MS = 30_000


def state_topic(tenant: str, namespace: str, name: str, state_id: str, what: str) -> str:
    """A topic of a function's state (`what`: changelog, assignment, ...), named for the function's stateId
    (FunctionConfig.stateId): a function created again under a deleted one's name never reads its topics."""
    incarnation = f"-{state_id}" if state_id else ""
    return f"persistent://{tenant}/{namespace}/__state-{name}{incarnation}-{what}"


def changelog_topic(tenant: str, namespace: str, name: str, state_id: str = "") -> str:
    return state_topic(tenant, namespace, name, state_id, "changelog")


@dataclass(frozen=True)
class Changelog:
    """Where a function's changelog lives: `topic` alone, or `shards` topics `{topic}-{s}`, shard s holding the
    records of a contiguous range of the `num_key_groups` groups (a group's records stay in one topic, in order)."""

    topic: str
    shards: int = 1
    num_key_groups: int = 1

    def __post_init__(self):
        if self.shards > 1 and self.shards > self.num_key_groups:
            raise ValueError(f"a changelog of {self.num_key_groups} key groups has at most that many shards, not {self.shards}")

    def __str__(self) -> str:
        return self.topic

    def shard(self, group: int) -> int:
        return group * self.shards // self.num_key_groups if self.shards > 1 else 0

    def shard_topic(self, shard: int) -> str:
        return self.topic if self.shards == 1 else f"{self.topic}-{shard}"


# Pulsar's default maxMessageSize (5 MiB), less room for the record's key and properties: each change is one
# changelog message, so a larger value could be stored here and never reach the changelog (lost by a failover).
MAX_VALUE_BYTES = 5 * 1024 * 1024 - 16 * 1024


class StateValueTooLarge(ValueError):
    """A state value that one changelog record cannot carry: refused before anything is stored."""


def check_value_size(key: str, value) -> None:
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) > MAX_VALUE_BYTES:
        raise StateValueTooLarge(
            f"the state value of {key!r} is {len(value):,} bytes, over the {MAX_VALUE_BYTES:,} "
            f"one changelog record (one Pulsar message, 5 MiB) can carry: nothing was stored"
        )


def changelog_of(cfg: "FunctionConfig") -> Changelog:
    return Changelog(
        changelog_topic(cfg.tenant, cfg.namespace, cfg.name, cfg.stateId), cfg.changelogShards or 1, cfg.numKeyGroups
    )


@dataclass(frozen=True)
class Record:
    """One state change: `value` is the counter (int), the state bytes, or None for a deletion."""

    group: int
    kind: str  # COUNTER or VALUE; a deletion has `deleted` set and keeps the kind it deleted
    key: str
    value: int | bytes | None
    version: int
    deleted: bool = False
    msg_id: str | None = None
    part: int = 0
    parts: int = 1

    def encode(self) -> tuple[bytes, dict]:
        """(payload, send kwargs)."""
        props = {"kg": str(self.group), "kind": DELETED if self.deleted else self.kind, "ver": str(self.version)}
        if self.deleted:
            props["of"] = self.kind
        if self.msg_id is not None:
            props.update(mid=self.msg_id, part=str(self.part), parts=str(self.parts))
        if self.deleted:
            payload = b""
        elif self.kind == COUNTER:  # a counter's record holds its int (None only for a deletion, handled above)
            payload = str(int(cast(int, self.value))).encode()
        else:  # a state value's record holds its bytes
            payload = bytes(cast(bytes, self.value))
        return payload, {"partition_key": f"{self.group}:{self.kind}:{self.key}", "properties": props}

    @classmethod
    def decode(cls, msg) -> "Record | None":
        """The record in a changelog message; None for a marker."""
        props = msg.properties()
        if "kg" not in props:
            return None
        kind = props["kind"]
        deleted = kind == DELETED
        if deleted:
            kind = props["of"]
        key = msg.partition_key().split(":", 2)[2]
        data = msg.data()
        value = None if deleted else (int(data) if kind == COUNTER else data)
        mid = props.get("mid")
        return cls(
            int(props["kg"]),
            kind,
            key,
            value,
            int(props["ver"]),
            deleted,
            mid,
            int(props.get("part", 0)),
            int(props.get("parts", 1)),
        )


class ChangelogWriter:
    """The function's changelog producers in one process (one per shard, made at its first record); `flush`
    returns once every record sent is persisted."""

    def __init__(self, client: pulsar.Client, changelog: Changelog):
        self.changelog = changelog
        self._client = client
        self._producers: dict[int, pulsar.Producer] = {}
        self._lock = threading.Lock()
        self._failed: pulsar.Result | None = None
        self.records = self.bytes = 0
        # Per shard: records sent, records persisted so far (callbacks of one producer come in order), the id of
        # the last one persisted; and the callbacks waiting for counts (in order, so the first waits longest).
        self._sent = [0] * changelog.shards
        self._persisted = [0] * changelog.shards
        self._last_id: list[pulsar.MessageId | None] = [None] * changelog.shards
        self._waiting: deque[tuple[list[tuple[int, int]], Callable[[], None]]] = deque()
        self._waiting_lock = threading.Lock()

    def _producer(self, shard: int) -> pulsar.Producer:
        """The shard's producer (the caller holds the lock)."""
        producer = self._producers.get(shard)
        if producer is None:
            producer = self._client.create_producer(
                self.changelog.shard_topic(shard),
                block_if_queue_full=True,
                batching_enabled=True,
                batching_max_publish_delay_ms=1,
                send_timeout_millis=SEND_TIMEOUT_MS,
            )
            self._producers[shard] = producer
        return producer

    def _done(self, shard: int, result, msg_id) -> None:
        if result != pulsar.Result.Ok:
            self._failed = result
        ready = []
        with self._waiting_lock:
            self._persisted[shard] += 1
            if result == pulsar.Result.Ok:
                self._last_id[shard] = msg_id
            while self._waiting and all(self._persisted[s] >= n for s, n in self._waiting[0][0]):
                ready.append(self._waiting.popleft()[1])
        if self._failed is not None:
            return  # a record was lost: nothing after it is acked, so its input comes again
        for callback in ready:
            try:
                callback()
            except Exception:  # an ack on a consumer closed meanwhile: the message is redelivered
                log.warning("changelog %s: a callback after persistence failed", self.changelog, exc_info=True)

    def send(self, records: list[Record]) -> None:
        """Enqueue in order (one producer keeps the order of what it is given, and a group has one shard)."""
        with self._lock:
            for r in records:
                shard = self.changelog.shard(r.group)
                payload, kwargs = r.encode()
                self.records += 1
                self.bytes += len(payload)
                self._sent[shard] += 1
                self._producer(shard).send_async(payload, partial(self._done, shard), **kwargs)

    def when_persisted(self, callback: Callable[[], None]) -> None:
        """Call back (now, or on the client's thread) once every record sent so far is persisted: how the
        instance acks an input after its state changes without waiting for them."""
        with self._waiting_lock:
            pending = [(s, n) for s, n in enumerate(self._sent) if n > self._persisted[s]]
            if pending:
                self._waiting.append((pending, callback))
                return
        callback()

    def flush(self) -> None:
        for shard, producer in list(self._producers.items()):
            try:
                producer.flush()
            except pulsar.PulsarException as exc:
                raise pulsar.PulsarException(
                    f"changelog {self.changelog.shard_topic(shard)}: records were not "
                    f"persisted within {SEND_TIMEOUT_MS} ms: {exc}"
                ) from exc
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise pulsar.PulsarException(f"changelog {self.changelog}: a record was not persisted: {failed}")

    def mark(self, shards: set[int]) -> dict[int, bytes]:
        """Positions in these shards (serialized ids) after everything sent so far: once all is persisted, a
        shard's last record's id (callbacks come in order); a marker only where this writer sent nothing yet, so
        a release costs no extra round trip to the broker."""
        self.flush()
        with self._waiting_lock:
            marks = {s: last.serialize() for s in shards if (last := self._last_id[s]) is not None}
        for shard in sorted(set(shards) - set(marks)):
            with self._lock:
                try:
                    msg_id = self._producer(shard).send(uuid.uuid4().hex.encode(), partition_key=MARKER_KEY)
                except pulsar.PulsarException as exc:
                    raise pulsar.PulsarException(
                        f"changelog {self.changelog.shard_topic(shard)}: a marker was not "
                        f"persisted within {SEND_TIMEOUT_MS} ms: {exc}"
                    ) from exc
            marks[shard] = msg_id.serialize()
        self.flush()
        return marks

    def close(self) -> None:
        for producer in self._producers.values():
            try:
                producer.flush()
                producer.close()
            except pulsar.PulsarException:
                pass


@dataclass
class ReadStats:
    records: int = 0
    bytes: int = 0
    duplicates: int = 0  # delivered again by the reader, skipped
    end: builtins.bytes | None = None  # the end marker's position: everything before it was read


def read_changelog(
    client: pulsar.Client,
    topic: str,
    after: bytes | None = None,
    stats: ReadStats | None = None,
    groups: set[int] | None = None,
    pace: Callable[..., None] | None = None,
    side_by_side: int = 1,
) -> Iterator[tuple[pulsar.MessageId, Record]]:
    """Every record from `after` (a position from `mark`, exclusive) or the start, up to now, with its id;
    only those of `groups` when given (the others are skipped before they are decoded). `pace` (a background
    read that must not crowd out the function's traffic) is called every PACE_BYTES (or PACE_RECORDS messages)
    read with their bytes, the read's lag behind the log and the topic (state.Pacer), and the reader's queue is
    small, so the broker sends no faster than the reading goes. `side_by_side`: readers of other shards read at
    the same time, sharing the queue budget.

    "Now" is a marker this call publishes first: everything persisted before it is read. Apache
    Pulsar serves a compacted changelog (only the latest record of each key) with read_compacted.
    """
    nonce = uuid.uuid4().hex.encode()
    producer = client.create_producer(topic)
    try:
        producer.send(nonce, partition_key=MARKER_KEY)
    finally:
        producer.close()
    start = position = pulsar.MessageId.deserialize(after) if after else pulsar.MessageId.earliest
    waited_ms, read_any, n, paced_bytes = 0, False, 0, 0
    sized = pace is None  # a paced read sizes its queue at its first record
    queue = reader_queue(READER_QUEUE // side_by_side) if sized else MIN_READER_QUEUE
    reader = client.create_reader(topic, position, receiver_queue_size=queue)
    try:
        while True:
            try:
                msg = reader.read_next(READ_STALL_MS)
            except pulsar.Timeout:
                # a new reader from the last record read goes on (a record read twice is skipped below)
                waited_ms += READ_STALL_MS
                if waited_ms >= READ_TIMEOUT_MS:
                    raise TimeoutError(
                        f"changelog {topic}: no record for {READ_TIMEOUT_MS} ms before the end "
                        f"marker (the reader reopened every {READ_STALL_MS} ms); the broker may be "
                        "down"
                    ) from None
                reader.close()
                reader = client.create_reader(topic, position, receiver_queue_size=queue)
                continue
            size = len(msg.data())
            waited_ms, n, paced_bytes = 0, n + 1, paced_bytes + size
            if not sized and msg.partition_key() != MARKER_KEY:
                sized = True
                fits = min(PACED_READER_QUEUE, PACED_READER_BYTES // max(size, 1)) // side_by_side
                if fits > queue:  # from the start again: this record comes again and is skipped below
                    queue = fits
                    reader.close()
                    reader = client.create_reader(topic, start, receiver_queue_size=queue)
            if pace is not None and (paced_bytes >= PACE_BYTES or n % PACE_RECORDS == 0):
                pace(paced_bytes, time.time() - msg.publish_timestamp() / 1000, topic)  # the bytes, the lag
                paced_bytes = 0
            msg_id = msg.message_id()
            if read_any and not position < msg_id:
                if stats is not None:
                    stats.duplicates += 1
                continue  # a pulsar-lite reader delivered it again: ids only grow in a topic
            position, read_any = msg_id, True
            key = msg.partition_key()
            if key == MARKER_KEY:
                if msg.data() == nonce:
                    if stats is not None:
                        stats.end = msg_id.serialize()
                    return
                continue
            if stats is not None:
                stats.records += 1
                stats.bytes += size
            if groups is not None and int(key.split(":", 1)[0]) not in groups:
                continue
            record = Record.decode(msg)
            if record is not None:
                yield msg_id, record
    finally:
        reader.close()
