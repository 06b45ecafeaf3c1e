"""Reading Pulsar by message-id ranges through the binary protocol only.

pulsar-lite has no admin REST API and two defects that shape this module: B1 (duplicate
deliveries) and B5 (seek ignored or harmful). So a range is read with a fresh Reader started
after its start id, ids outside (start, end] or not past the last one yielded are dropped,
and nothing ever seeks. The same code is correct on Apache Pulsar, where a Reader delivers a
partition in id order.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, cast

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError

from .offsets import BATCH_END, Position, TopicRange
from .options import ConnectionOptions

if TYPE_CHECKING:
    import pulsar

log = logging.getLogger(__name__)

RECEIVER_QUEUE = 5000
STALL_REOPEN_MS = 2000


class TopicNotFoundError(ConfigError):
    """A topic to read does not exist (on pulsar-lite: was never written)."""


class DataLossError(PulsarAutoscaleError):
    """Messages of a checkpointed range can no longer be read (retention, or a broker reset)."""


@dataclass
class Connection:
    """A lazily opened pulsar.Client; pickles without the client so Spark can ship it to tasks."""

    options: ConnectionOptions
    _client: pulsar.Client | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def client(self) -> pulsar.Client:
        if self._client is None:
            from pulsar_autoscale.pulsar_client import open_client

            self._client = open_client(self.options.client, operation_timeout_seconds=self.options.operation_timeout_s)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __getstate__(self) -> dict:
        return {"options": self.options, "_client": None}


def partitions_of(conn: Connection, topic: str) -> list[str]:
    """The partition topics of `topic` (itself when not partitioned)."""
    return list(conn.client.get_topic_partitions(topic))


def list_topics(options: ConnectionOptions, pattern: str) -> list[str]:
    """Topics matching `pattern`, listed with Apache Pulsar's admin REST API (one namespace), with
    the client's token and TLS trust settings (as the pulsar-spark connector uses the client's
    credentials when no admin ones are given)."""
    import requests

    # parse_source_options accepts topicsPattern only with admin.url
    admin_url, client = cast(str, options.admin_url), options.client
    token = client.bearer_token()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    verify = False if client.tls_allow_insecure_connection else (client.tls_trust_certs_file_path or True)

    m = re.match(r"^(persistent|non-persistent)://([^/]+)/([^/]+)/", pattern)
    if not m:
        raise ConfigError(f"option 'topicsPattern': {pattern!r} must start with 'persistent://tenant/namespace/'")
    url = f"{admin_url.rstrip('/')}/admin/v2/{m.group(1)}/{m.group(2)}/{m.group(3)}"
    try:
        resp = requests.get(url, timeout=10, headers=headers, verify=verify)
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise ConfigError(f"option 'admin.url': cannot list topics at {url}: {exc}") from None
    regex = re.compile(pattern)
    return sorted(t for t in resp.json() if regex.fullmatch(t))


def last_position(conn: Connection, topic: str) -> Position | None:
    """The id of the topic's last message, None when it has none.

    Uses Consumer.getLastMessageId on a throwaway Shared subscription that is removed at once:
    Python's Reader has no such call, and a Reader at MessageId.latest with the inclusive flag
    (the Java idiom) returns nothing on pulsar-lite. On pulsar-lite an empty topic answers
    UnknownError; Apache Pulsar answers entry -1. The last message is the last of its entry: its end
    (BATCH_END), as Position.of makes it for a message read. Apache Pulsar answers its batch index
    without the batch size, which Position.of cannot tell from a message inside the batch (a range
    ending there left the last message out); pulsar-lite answers no batch index.
    """
    import pulsar

    try:
        consumer = conn.client.subscribe(
            topic,
            f"spark-probe-{uuid.uuid4().hex[:12]}",
            consumer_type=pulsar.ConsumerType.Shared,
            receiver_queue_size=1,
            initial_position=pulsar.InitialPosition.Latest,
        )
    except pulsar.TopicNotFound:
        raise TopicNotFoundError(f"topic {topic!r} does not exist") from None
    try:
        last = Position.of(consumer.get_last_message_id())
    except pulsar.UnknownError:
        return None
    finally:
        try:
            consumer.unsubscribe()
        except pulsar.PulsarException:
            consumer.close()
    return Position(last.ledger, last.entry, BATCH_END) if last.entry >= 0 else None


@dataclass
class Chunk:
    """Up to `chunk` messages of a range as one list per field: what the source's Arrow columns
    are built from, so no message object outlives its loop iteration."""

    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)
    ids: list = field(default_factory=list)  # MessageId.serialize()
    publish_ms: list = field(default_factory=list)
    event_ms: list = field(default_factory=list)  # None: no event time
    properties: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.values)


def lost(rng: TopicRange, last, poll_timeout_ms: int, fail_on_data_loss: bool) -> None:
    """Nothing came after `last` for poll_timeout_ms: raise DataLossError, or warn that the rest is skipped."""
    problem = (
        f"topic {rng.topic}: no message after {last} within {poll_timeout_ms} ms while "
        f"reading up to {rng.end}; the range was deleted (retention) or the broker lost it"
    )
    if fail_on_data_loss:
        raise DataLossError(problem + " (set failOnDataLoss=false to skip it)") from None
    log.warning("%s; skipping the rest of the range", problem)


def _native_id(pos: Position):
    """`pos` as the client's native MessageId, which compares by (ledger, entry, batch index) in
    C++ with `<` (its `==` also compares the partition, so only `<` is used)."""
    import _pulsar

    return _pulsar.MessageId(-1, *pos.key())


def read_range(
    conn: Connection, rng: TopicRange, poll_timeout_ms: int, fail_on_data_loss: bool, chunk: int = 8192
) -> Iterator[Chunk]:
    """Yield the messages of (start, end] exactly once each, in id order, in Chunks of up to `chunk`.

    A Reader that delivers nothing for STALL_REOPEN_MS is replaced by a new one started after
    the last message read (pulsar-lite's Readers stall now and then under load; on Apache
    Pulsar a reopen is only a reconnect); the range counts as lost only when nothing came for
    `poll_timeout_ms` in all.

    The per-message loop is the source's hot path (Spark's cost per message is mostly here): it
    calls the client's native Reader and Message (pulsar-client's Python wrappers add a frame
    and an object per call) and compares native ids, so a message costs one call per field. The
    accessors and list appends are bound once, not looked up per message (13% less loop CPU).
    """
    import _pulsar
    import pulsar

    M, serialize = _pulsar.Message, _pulsar.MessageId.serialize
    message_id, partition_key, data = M.message_id, M.partition_key, M.data
    publish_timestamp, event_timestamp, properties_of = M.publish_timestamp, M.event_timestamp, M.properties

    if rng.empty:
        return
    last, end = _native_id(rng.start), _native_id(rng.end)
    # A message at or past `tail` is in the end's entry: it ends the range when its canonical
    # position is the end (the entry's last message, for an end at an entry boundary).
    tail = _native_id(Position(rng.end.ledger, rng.end.entry)) if rng.end.batch == BATCH_END else end
    reader = conn.client.create_reader(rng.topic, rng.start.message_id(), receiver_queue_size=RECEIVER_QUEUE)
    waited_ms, done = 0, False
    wait_ms = min(STALL_REOPEN_MS, poll_timeout_ms)
    try:
        while not done:
            keys: list[str | None] = []
            values: list[bytes] = []
            ids: list[bytes] = []
            publish_ms: list[int] = []
            event_ms: list[int | None] = []
            properties: list[dict[str, str]] = []
            add_key, add_value, add_id = keys.append, values.append, ids.append
            add_publish, add_event, add_properties = publish_ms.append, event_ms.append, properties.append
            read_next = reader._reader.read_next  # the native reader (a reopen replaces it)
            while len(values) < chunk:
                try:
                    msg = read_next(wait_ms)
                except pulsar.Timeout:
                    waited_ms += wait_ms
                    wait_ms = min(STALL_REOPEN_MS, poll_timeout_ms - waited_ms)
                    if waited_ms < poll_timeout_ms:
                        log.info("topic %s: nothing after %s for %d ms; reopening the reader", rng.topic, last, waited_ms)
                        reader.close()
                        after = Position(last.ledger_id(), last.entry_id(), last.batch_index())
                        reader = conn.client.create_reader(rng.topic, after.message_id(), receiver_queue_size=RECEIVER_QUEUE)
                        read_next = reader._reader.read_next
                        continue
                    lost(rng, last, poll_timeout_ms, fail_on_data_loss)
                    done = True
                    break
                if waited_ms:
                    waited_ms, wait_ms = 0, min(STALL_REOPEN_MS, poll_timeout_ms)
                mid = message_id(msg)
                if not last < mid:
                    continue  # before the range, or a duplicate delivery (B1)
                in_tail = not mid < tail  # a native comparison costs a call: two per message before the end entry
                if in_tail and end < mid:
                    done = True
                    break
                last = mid
                add_key(partition_key(msg) or None)
                add_value(data(msg))
                add_id(serialize(mid))
                add_publish(publish_timestamp(msg))
                add_event(event_timestamp(msg) or None)
                add_properties(properties_of(msg))
                if in_tail and Position.of(mid) >= rng.end:
                    done = True
                    break
            if values:
                yield Chunk(keys, values, ids, publish_ms, event_ms, properties)
    finally:
        reader.close()


@dataclass
class Scout:
    """Walks one topic forward on the driver to find the id of the n-th next message.

    Admission control (maxRecordsPerTrigger) needs exact message counts, and message ids do
    not give them (batches, ledger roll-over). The reader stays open between triggers, so
    consecutive micro-batches read each message once here.
    """

    conn: Connection
    topic: str
    poll_timeout_ms: int
    _reader: pulsar.Reader | None = field(default=None, init=False, repr=False)
    _pos: Position | None = field(default=None, init=False)
    _pending: Position | None = field(default=None, init=False)

    def advance(self, start: Position, upto: Position, max_rows: int) -> tuple[Position, int]:
        """(id of the last of at most max_rows messages after start and <= upto, how many)."""
        import pulsar

        if self._pos != start or self._reader is None:
            self.close()
            self._reader = self.conn.client.create_reader(self.topic, start.message_id(), receiver_queue_size=RECEIVER_QUEUE)
            self._pos = start
        count = 0
        while count < max_rows and self._pos < upto:
            if self._pending is not None:
                pos, self._pending = self._pending, None
            else:
                try:
                    pos = Position.of(self._reader.read_next(self.poll_timeout_ms).message_id())
                except pulsar.Timeout:
                    # The topic has more (upto), yet nothing came: a stalled reader (pulsar-lite, docs/spark.md)
                    # would keep every later trigger empty; the next call reopens it at the position reached.
                    reached = self._pos
                    self.close()
                    return reached, count
            if pos <= self._pos:
                continue
            if pos > upto:
                self._pending = pos
                break
            self._pos = pos
            count += 1
        return self._pos, count

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._reader, self._pos, self._pending = None, None, None
