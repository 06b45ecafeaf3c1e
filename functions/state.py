"""A function's state on one worker: key-grouped, local, and durable through its changelog.

Context.incr_counter/get_counter/put_state/get_state/del_counter for a message go to the key group
of the message's key (docs/state.md). Rows live in one SQLite file per function per worker (WAL:
shared by the function's thread and process instances on the worker, atomic increments without a
state server), tagged with their group, so a group is released (flushed, snapshotted, forgotten) and
opened elsewhere (snapshot + changelog tail, or the whole changelog) as a unit. Every change is also
a changelog record (functions/changelog.py) sent before the input message is acked.

Rows are never deleted while their group is owned: a deletion leaves a tombstone with the next
version, so a replay that sees an older value of the key cannot bring it back.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pulsar

from .changelog import COUNTER, VALUE, ChangelogWriter, ReadStats, Record, read_changelog
from .keygroups import DEFAULT_NUM_KEY_GROUPS, key_group

# Pulsar's sticky key for a message with neither an ordering nor a partition key (Commands.peekStickyKey):
# Key_Shared sends all such messages to the owner of this key's group, so their state lives there too.
NONE_KEY = "NONE_KEY"
# EFFECTIVELY_ONCE remembers this many applied message ids per key group (why it is enough: docs/state.md).
DEDUPE_WINDOW = 10_000
_PRUNE_EVERY = 1_000


class NotOwnedError(RuntimeError):
    """A state call for a key group this store does not own (it is elsewhere or moving)."""


def message_group(message, num_key_groups: int) -> int:
    """The key group of an input message: of its ordering key, else its partition key, else NONE_KEY."""
    ordering = getattr(message, "ordering_key", None)
    key = (ordering() if ordering is not None else None) or message.partition_key() or NONE_KEY
    return key_group(key, num_key_groups)


@dataclass
class RestoreStats:
    """The last open(restore=True): what was replayed and how fast (bench/state_replay.py)."""

    groups: int = 0
    from_snapshot: int = 0
    snapshot_rows: int = 0
    records: int = 0
    bytes: int = 0
    duplicates: int = 0      # records a pulsar-lite reader delivered again (skipped)
    seconds: float = 0.0

    @property
    def groups_per_s(self) -> float:
        return self.groups / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0


@dataclass
class _Scope:
    """The state calls of the message being processed on this thread."""

    group: int
    msg_id: str | None = None            # set: EFFECTIVELY_ONCE, the updates are one transaction
    pending: dict = field(default_factory=dict)   # (kind, key) -> Record, the latest change of each


class StateStore:
    """The function's key groups on this worker. `owned` None: every group (a single worker, no routing)."""

    def __init__(self, path: str | Path, num_key_groups: int = DEFAULT_NUM_KEY_GROUPS,
                 owned: set[int] | None = None):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._path = str(path)
        # Local snapshots of every group: one SQLite file in this directory (stores may share one).
        self.snapshot_dir = Path(f"{path}.snapshots")
        self.num_key_groups = num_key_groups
        self._owned = None if owned is None else set(owned)
        self._local = threading.local()
        self._changelog: ChangelogWriter | None = None
        self._client: pulsar.Client | None = None
        self._topic: str | None = None
        self._attach_lock = threading.Lock()
        self._applied_since_prune = 0
        self.duplicates_skipped = 0   # EFFECTIVELY_ONCE: messages whose id was applied already (in this process)
        self.restore_stats = RestoreStats()
        c = self._conn()
        # (kind, key, kg): a key's lookup is a prefix of the primary key, in its group or in any.
        c.execute("CREATE TABLE IF NOT EXISTS kv (kind TEXT NOT NULL, key TEXT NOT NULL, kg INTEGER NOT NULL, "
                  "ival INTEGER, bval BLOB, ver INTEGER NOT NULL, dead INTEGER NOT NULL DEFAULT 0, "
                  "PRIMARY KEY (kind, key, kg)) WITHOUT ROWID")
        c.execute("CREATE TABLE IF NOT EXISTS applied (kg INTEGER NOT NULL, mid TEXT NOT NULL, "
                  "PRIMARY KEY (kg, mid))")
        c.execute("CREATE INDEX IF NOT EXISTS applied_kg ON applied(kg)")
        # release/snapshot/open select a group's rows: without this index each is a scan of every row here
        c.execute("CREATE INDEX IF NOT EXISTS kv_kg ON kv(kg)")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self._path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    # ---- the changelog ---------------------------------------------------------------------------
    def attach_changelog(self, client: pulsar.Client, topic: str) -> None:
        """Send every change to `topic` from now on. The producer starts at the first change, so a stateless
        function never creates the topic; thread instances share the store, and so one producer."""
        with self._attach_lock:
            if self._client is None:
                self._client, self._topic = client, topic

    @property
    def changelog(self) -> ChangelogWriter | None:
        if self._changelog is None and self._client is not None:
            with self._attach_lock:
                if self._changelog is None:
                    self._changelog = ChangelogWriter(self._client, self._topic)
        return self._changelog

    def close(self) -> None:
        if self._changelog is not None:
            self._changelog.close()
            self._changelog = None

    # ---- groups --------------------------------------------------------------------------------
    def owned(self) -> set[int]:
        return set(range(self.num_key_groups)) if self._owned is None else set(self._owned)

    def _check_owned(self, group: int) -> None:
        if self._owned is not None and group not in self._owned:
            raise NotOwnedError(f"key group {group} is not owned by this instance")

    def for_key(self, key: str | bytes | None) -> "GroupView":
        """The store of a message key's group (None: a message without a key, NONE_KEY's group)."""
        return GroupView(self, key_group(key if key else NONE_KEY, self.num_key_groups))

    def group(self, group: int) -> "GroupView":
        return GroupView(self, group)

    def _group_of(self, kind: str, key: str) -> int:
        """A key addressed without a message (REST, putstate): the group that holds it, else its own group."""
        row = self._conn().execute("SELECT kg FROM kv WHERE kind = ? AND key = ? AND dead = 0 ORDER BY kg LIMIT 1",
                                   (kind, key)).fetchone()
        return row[0] if row else key_group(key, self.num_key_groups)

    # ---- message scope: EFFECTIVELY_ONCE and flush-before-ack ------------------------------------
    def begin(self, group: int, msg_id: str | None = None) -> bool:
        """Start a message's state calls in `group`. With msg_id (EFFECTIVELY_ONCE) they become one
        transaction with the id; False: that id is applied in this group already (skip the message)."""
        self._check_owned(group)
        self._local.scope = _Scope(group, msg_id)
        if msg_id is None:
            return True
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        if conn.execute("SELECT 1 FROM applied WHERE kg = ? AND mid = ?", (group, msg_id)).fetchone():
            conn.execute("ROLLBACK")
            self._local.scope = None
            self.duplicates_skipped += 1
            return False
        return True

    def apply_once(self, msg_id: str, group: int) -> bool:
        """STATE.md's name for begin(group, msg_id)."""
        return self.begin(group, msg_id)

    def commit(self) -> None:
        """End the message: its transaction and its changelog records (sent, not yet flushed)."""
        scope = self._take_scope()
        if scope is None:
            return
        records = list(scope.pending.values())
        if scope.msg_id is not None:
            conn = self._conn()
            if records:
                conn.execute("INSERT INTO applied(kg, mid) VALUES (?, ?)", (scope.group, scope.msg_id))
                records = [Record(r.group, r.kind, r.key, r.value, r.version, r.deleted, scope.msg_id, i,
                                  len(records)) for i, r in enumerate(records)]
            conn.execute("COMMIT")
            if records:
                self._prune(scope.group)
        self._send(records)

    def abort(self) -> None:
        """The function raised: under EFFECTIVELY_ONCE nothing happened; otherwise its changes stand (as
        Pulsar's state does) and go to the changelog."""
        scope = self._take_scope()
        if scope is None:
            return
        if scope.msg_id is not None:
            self._conn().execute("ROLLBACK")
        else:
            self._send(list(scope.pending.values()))

    def flush_before_ack(self) -> None:
        """A function acks by itself (autoAck false, MANUAL) while processing: its changes so far go to the
        changelog and are persisted first (under EFFECTIVELY_ONCE the instance acks, after commit)."""
        scope = getattr(self._local, "scope", None)
        if scope is not None and scope.msg_id is None:
            self._send(list(scope.pending.values()))
            scope.pending.clear()
        self.flush()

    def flush(self, everything: bool = False) -> None:
        """Return once every change this thread sent (everything: any thread) is persisted in the changelog."""
        if getattr(self._local, "dirty", False) or (everything and self._changelog is not None):
            self._local.dirty = False
            self._changelog.flush()

    def when_persisted(self, callback) -> None:
        """Run callback (an input's ack) once the changes sent so far are in the changelog, without waiting
        here: the instance goes on with the next message meanwhile."""
        if self._changelog is None:
            callback()
        else:
            self._changelog.when_persisted(callback)

    def _take_scope(self) -> _Scope | None:
        scope = getattr(self._local, "scope", None)
        self._local.scope = None
        return scope

    def _send(self, records: list[Record]) -> None:
        if records and self.changelog is not None:
            self._changelog.send(records)
            self._local.dirty = True

    def _record(self, record: Record) -> None:
        scope = getattr(self._local, "scope", None)
        if scope is not None and scope.group == record.group:
            scope.pending[(record.kind, record.key)] = record
        else:  # outside a message (REST): at once
            self._send([record])
            self.flush()

    def _prune(self, group: int) -> None:
        self._applied_since_prune += 1
        if self._applied_since_prune < _PRUNE_EVERY:
            return
        self._applied_since_prune = 0
        _prune_applied(self._conn(), group)

    # ---- reads and writes in a group -------------------------------------------------------------
    def _write(self, sql: str, args: tuple, kind: str, key: str, group: int, deleted: bool = False):
        self._check_owned(group)
        row = self._conn().execute(sql, args).fetchone()
        if row is None:
            return None
        value, version = row
        self._record(Record(group, kind, key, None if deleted else value, version, deleted))
        return value

    def incr(self, group: int, key: str, amount: int) -> int:
        return self._write(
            "INSERT INTO kv(kind, key, kg, ival, ver) VALUES('c', ?, ?, ?, 1) ON CONFLICT DO UPDATE SET "
            "ival = CASE WHEN dead THEN excluded.ival ELSE ival + excluded.ival END, ver = ver + 1, dead = 0 "
            "RETURNING ival, ver", (key, group, int(amount)), COUNTER, key, group)

    def put(self, group: int, key: str, value) -> None:
        if isinstance(value, str):
            value = value.encode()
        self._write("INSERT INTO kv(kind, key, kg, bval, ver) VALUES('s', ?, ?, ?, 1) ON CONFLICT DO UPDATE SET "
                    "bval = excluded.bval, ver = ver + 1, dead = 0 RETURNING bval, ver",
                    (key, group, value), VALUE, key, group)

    def set_count(self, group: int, key: str, value: int) -> None:
        self._delete(group, VALUE, key)
        self._write("INSERT INTO kv(kind, key, kg, ival, ver) VALUES('c', ?, ?, ?, 1) ON CONFLICT DO UPDATE SET "
                    "ival = excluded.ival, ver = ver + 1, dead = 0 RETURNING ival, ver",
                    (key, group, int(value)), COUNTER, key, group)

    def _delete(self, group: int, kind: str, key: str) -> None:
        self._write("UPDATE kv SET ival = NULL, bval = NULL, ver = ver + 1, dead = 1 "
                    "WHERE kind = ? AND key = ? AND kg = ? AND dead = 0 RETURNING ival, ver",
                    (kind, key, group), kind, key, group, deleted=True)

    def _read(self, group: int, kind: str, key: str):
        self._check_owned(group)
        row = self._conn().execute("SELECT ival, bval FROM kv WHERE kind = ? AND key = ? AND kg = ? AND dead = 0",
                                   (kind, key, group)).fetchone()
        return None if row is None else row[0] if kind == COUNTER else row[1]

    # ---- by key alone: REST querystate/putstate, and callers without a message -------------------
    def incr_counter(self, key: str, amount: int) -> int:
        return self.incr(self._group_of(COUNTER, key), key, amount)

    def get_counter(self, key: str) -> int:
        return self._read(self._group_of(COUNTER, key), COUNTER, key) or 0

    def has_counter(self, key: str) -> bool:
        return self._read(self._group_of(COUNTER, key), COUNTER, key) is not None

    def del_counter(self, key: str) -> None:
        self._delete(self._group_of(COUNTER, key), COUNTER, key)

    def set_counter(self, key: str, value: int) -> None:
        """Pulsar's putstate with a numberValue: the key becomes a counter with that value."""
        self.set_count(self._group_of(COUNTER, key), key, value)

    def put_state(self, key: str, value) -> None:
        self.put(self._group_of(VALUE, key), key, value)

    def get_state(self, key: str):
        return self._read(self._group_of(VALUE, key), VALUE, key)

    def counters(self) -> dict[str, int]:
        """Every live counter of the owned groups (a key in several groups: their sum)."""
        out: dict[str, int] = {}
        for key, kg, value in self._conn().execute("SELECT key, kg, ival FROM kv WHERE kind = 'c' AND dead = 0"):
            if self._owned is None or kg in self._owned:
                out[key] = out.get(key, 0) + value
        return out

    # ---- release and open: snapshots and the changelog -------------------------------------------
    @property
    def snapshot_path(self) -> Path:
        return self.snapshot_dir / "groups.sqlite"

    def snapshot(self, groups: set[int]) -> None:
        """Flush, then write the groups' rows and EFFECTIVELY_ONCE ids with the changelog position they cover,
        so opening a group here again replays only the changelog after it. Atomic per call."""
        writer = self.changelog
        position = writer.mark() if writer is not None else None   # after everything sent: flushed too
        conn = self._conn()
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        conn.execute("ATTACH DATABASE ? AS snap", (str(self.snapshot_path),))
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS snap.kv (kg INTEGER, kind TEXT, key TEXT, ival INTEGER, "
                         "bval BLOB, ver INTEGER, dead INTEGER)")
            conn.execute("CREATE INDEX IF NOT EXISTS snap.kv_kg ON kv(kg)")
            conn.execute("CREATE TABLE IF NOT EXISTS snap.applied (kg INTEGER, mid TEXT)")
            conn.execute("CREATE INDEX IF NOT EXISTS snap.applied_kg ON applied(kg)")
            conn.execute("CREATE TABLE IF NOT EXISTS snap.meta (kg INTEGER PRIMARY KEY, position BLOB)")
            conn.execute("BEGIN IMMEDIATE")
            for chunk, marks in _chunks(groups):
                conn.execute(f"DELETE FROM snap.kv WHERE kg IN ({marks})", chunk)
                conn.execute(f"DELETE FROM snap.applied WHERE kg IN ({marks})", chunk)
                conn.execute(f"INSERT INTO snap.kv SELECT kg, kind, key, ival, bval, ver, dead FROM main.kv "
                             f"WHERE kg IN ({marks})", chunk)
                conn.execute(f"INSERT INTO snap.applied SELECT kg, mid FROM main.applied WHERE kg IN ({marks}) "
                             f"ORDER BY rowid", chunk)
            conn.executemany("INSERT OR REPLACE INTO snap.meta VALUES (?, ?)", ((g, position) for g in groups))
            conn.execute("COMMIT")
        finally:
            conn.execute("DETACH DATABASE snap")

    def release(self, groups: set[int]) -> None:
        """Give groups up: flush, snapshot, forget them here (their owner is elsewhere from now on)."""
        groups = set(groups)
        self.snapshot(groups)
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        _delete_groups(conn, groups)
        conn.execute("COMMIT")
        self._owned = self.owned() - groups

    def open(self, groups: set[int], restore: bool = True, client: pulsar.Client | None = None,
             topic: str | None = None) -> RestoreStats:
        """Own groups from now on. restore: rebuild them from their local snapshot (if any) and the changelog
        after it, else from the whole changelog (the attached one, or `client`/`topic`)."""
        groups = set(groups)
        stats = RestoreStats(groups=len(groups))
        started = time.perf_counter()
        if restore:
            client = client or self._client
            topic = topic or self._topic
            if client is None or topic is None:
                raise ValueError("restoring key groups needs the changelog: attach_changelog first or pass "
                                 "client and topic")
            self._restore(groups, client, topic, stats)
        self._owned = None if self._owned is None else self._owned | groups
        stats.seconds = time.perf_counter() - started
        self.restore_stats = stats
        return stats

    def _restore(self, groups: set[int], client: pulsar.Client, topic: str, stats: RestoreStats) -> None:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        _delete_groups(conn, groups)
        conn.execute("COMMIT")
        starts: dict[bytes | None, set[int]] = {}
        if self.snapshot_path.exists():   # local snapshots are copied by SQLite itself, not row by row
            conn.execute("ATTACH DATABASE ? AS snap", (str(self.snapshot_path),))
            try:
                conn.execute("BEGIN IMMEDIATE")
                for chunk, marks in _chunks(groups):
                    for g, position in conn.execute(f"SELECT kg, position FROM snap.meta WHERE kg IN ({marks})",
                                                    chunk).fetchall():
                        starts.setdefault(position, set()).add(g)
                        stats.from_snapshot += 1
                    stats.snapshot_rows += conn.execute(
                        f"INSERT INTO kv(kind, key, kg, ival, bval, ver, dead) SELECT kind, key, kg, ival, bval, "
                        f"ver, dead FROM snap.kv WHERE kg IN ({marks})", chunk).rowcount
                    conn.execute(f"INSERT INTO applied(kg, mid) SELECT kg, mid FROM snap.applied "
                                 f"WHERE kg IN ({marks}) ORDER BY rowid", chunk)
                conn.execute("COMMIT")
            finally:
                conn.execute("DETACH DATABASE snap")
        without = groups - set().union(*starts.values())
        if without:
            starts.setdefault(None, set()).update(without)   # no snapshot here: the whole changelog
        rows: dict[tuple[str, str, int], tuple] = {}       # (kind, key, kg) -> (ival, bval, ver, dead)
        applied: list[tuple[int, str]] = []
        for position, wanted in starts.items():
            read = ReadStats()
            partial: dict[tuple[int, str], dict[int, Record]] = {}
            for r in read_changelog(client, topic, position, read):
                if r.group not in wanted:
                    continue
                if r.msg_id is None:
                    _apply(rows, r)
                    continue
                parts = partial.setdefault((r.group, r.msg_id), {})
                parts[r.part] = r             # by index: a record read twice is one part
                if len(parts) == r.parts:     # every record of the message arrived: apply them together
                    del partial[(r.group, r.msg_id)]
                    for p in parts.values():
                        _apply(rows, p)
                    applied.append((r.group, r.msg_id))
            stats.records += read.records
            stats.bytes += read.bytes
            stats.duplicates += read.duplicates
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT OR IGNORE INTO applied(kg, mid) VALUES (?, ?)", applied)
        conn.executemany(   # over a snapshot's row only when newer
            "INSERT INTO kv(kind, key, kg, ival, bval, ver, dead) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT DO UPDATE SET ival = excluded.ival, bval = excluded.bval, ver = excluded.ver, "
            "dead = excluded.dead WHERE excluded.ver > kv.ver", (k + v for k, v in rows.items()))
        for g in groups:
            _prune_applied(conn, g)
        conn.execute("COMMIT")


def _prune_applied(conn: sqlite3.Connection, group: int) -> None:
    """Keep the newest DEDUPE_WINDOW applied ids of a group."""
    conn.execute("DELETE FROM applied WHERE kg = ? AND rowid <= (SELECT rowid FROM applied WHERE kg = ? "
                 "ORDER BY rowid DESC LIMIT 1 OFFSET ?)", (group, group, DEDUPE_WINDOW))


def _chunks(groups: set[int]):
    """Groups in chunks of at most 500 with their `?,?,...`: many groups in few statements (kv is keyed by
    key first, so a statement on groups is one scan)."""
    ordered = sorted(groups)
    for i in range(0, len(ordered), 500):
        chunk = ordered[i:i + 500]
        yield chunk, ",".join("?" * len(chunk))


def _delete_groups(conn: sqlite3.Connection, groups: set[int]) -> None:
    for chunk, marks in _chunks(groups):
        conn.execute(f"DELETE FROM kv WHERE kg IN ({marks})", chunk)
        conn.execute(f"DELETE FROM applied WHERE kg IN ({marks})", chunk)


def _apply(rows: dict, r: Record) -> None:
    """Keep the highest version of each key (a tombstone too)."""
    k = (r.kind, r.key, r.group)
    old = rows.get(k)
    if old is not None and old[2] >= r.version:
        return
    if r.deleted:
        rows[k] = (None, None, r.version, 1)
    elif r.kind == COUNTER:
        rows[k] = (r.value, None, r.version, 0)
    else:
        rows[k] = (None, r.value, r.version, 0)


@dataclass(frozen=True)
class GroupView:
    """One key group of a store, with the Context's state verbs."""

    store: StateStore
    group: int

    def incr_counter(self, key: str, amount: int) -> int:
        return self.store.incr(self.group, key, amount)

    def get_counter(self, key: str) -> int:
        return self.store._read(self.group, COUNTER, key) or 0

    def del_counter(self, key: str) -> None:
        self.store._delete(self.group, COUNTER, key)

    def put_state(self, key: str, value) -> None:
        self.store.put(self.group, key, value)

    def get_state(self, key: str):
        return self.store._read(self.group, VALUE, key)
