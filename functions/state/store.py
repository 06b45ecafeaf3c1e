"""A function's state on one worker: key-grouped, local, and durable through its changelog.

Context.incr_counter/get_counter/put_state/get_state/del_counter for a message go to the key group
of the message's key (docs/state.md). Each key group is its own SQLite file (WAL) in the store's
group directory, which the function's stores on one worker share (its thread and process instances,
and on a keyedState function every instance's store), so a group moves between stores on one worker
without a copy (ScalaSSC: state stays where it is served): release flushes the changelog and records
in the group's file the changelog position the file covers (its connection stays open, shared in the
process); open reads that position and applies the changelog after it. A group whose file is missing, or was not closed by a
release (kill -9 while it was served: it may hold changes the changelog never got), is rebuilt from
the whole changelog. Every change is also a changelog record (functions/state/changelog.py) sent before
the input message is acked.

Rows are never deleted while their group is owned: a deletion leaves a tombstone with the next
version, so a replay that sees an older value of the key cannot bring it back.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable, Iterator

import pulsar

from pulsar_autoscale.functions.model.keygroups import DEFAULT_NUM_KEY_GROUPS, key_group
from pulsar_autoscale.functions.state.changelog import (
    COUNTER,
    VALUE,
    Changelog,
    ChangelogWriter,
    ReadStats,
    Record,
    read_changelog,
)

# Pulsar's sticky key for a message with neither an ordering nor a partition key (Commands.peekStickyKey):
# Key_Shared sends all such messages to the owner of this key's group, so their state lives there too.
NONE_KEY = "NONE_KEY"
# EFFECTIVELY_ONCE remembers this many applied message ids per key group (why it is enough: docs/state.md).
DEDUPE_WINDOW = 10_000
_PRUNE_EVERY = 1_000


# WAL of a group file: checkpointed at SQLite's default 1,000 pages and cut back to 512 KB (128 files per function).
_WAL_PAGES = 1000
_WAL_BYTES = 512 * 1024
_CACHE_KIB = 512   # SQLite's page cache per group connection (the OS caches the files too)


@dataclass
class _GroupFile:
    """An open group file, shared by every store of this process that uses it (a group moving between two
    instances on one worker keeps its connection: no close, no checkpoint, no reopen). `lock` serialises
    its threads; `clean`: the file holds nothing after its recorded changelog position."""

    path: str
    conn: sqlite3.Connection
    lock: threading.RLock
    clean: bool
    inode: int | None


_FILES: dict[str, _GroupFile] = {}
_FILES_LOCK = threading.Lock()


class StateRemovedError(RuntimeError):
    """The store's files were removed under it: its function was deleted while an instance still ran."""


class NotOwnedError(RuntimeError):
    """A state call for a key group this store does not own (it is elsewhere or moving)."""


def message_group(message, num_key_groups: int) -> int:
    """The key group of an input message: of its ordering key, else its partition key, else NONE_KEY."""
    ordering = getattr(message, "ordering_key", None)
    key = (ordering() if ordering is not None else None) or message.partition_key() or NONE_KEY
    return key_group(key, num_key_groups)


def state_group(message, num_key_groups: int, keyed: bool) -> int:
    """Where a message's state calls go. A keyedState function's: its message's group, which moves with the
    message's key. Any other function's: its one group, so that a state key has one copy whichever message writes
    it, as in Pulsar's table service (per message group, a counter that messages of 10 keys increment 10 times
    each would read 10, not 100)."""
    return message_group(message, num_key_groups) if keyed else one_group(num_key_groups)


def one_group(num_key_groups: int) -> int:
    """The group that holds all the state of a function without keyedState: unkeyed messages' NONE_KEY group."""
    return key_group(NONE_KEY, num_key_groups)


@dataclass
class RestoreStats:
    """The last open(restore=True): what was replayed and how fast (bench/state_replay.py)."""

    groups: int = 0
    from_snapshot: int = 0   # groups reopened from their released file (only the changelog after it replayed)
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
    file: "_GroupFile | None" = None     # EFFECTIVELY_ONCE: the file whose lock and transaction it holds
    pending: dict = field(default_factory=dict)   # (kind, key) -> Record, the latest change of each


class StateStore:
    """The function's key groups on this worker. `owned` None: every group (a single worker, no routing)."""

    def __init__(self, path: str | Path, num_key_groups: int = DEFAULT_NUM_KEY_GROUPS,
                 owned: set[int] | None = None, keyed: bool = True):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._home = str(Path(path).parent)   # its identity: a function created again under the name has another
        self._home_inode = _inode(self._home)
        # The group files `kg-N.sqlite` (a released group's file is its snapshot): stores of one function
        # on one worker may share this directory (functions/keyed/migration.py sets it), so a group moves
        # between them without a copy.
        self.snapshot_dir = Path(f"{path}.groups")
        self.num_key_groups = num_key_groups
        self._owned = None if owned is None else set(owned)
        # Not keyed (a function without keyedState): every key lives in this one group (state_group).
        self._one_group = None if keyed else one_group(num_key_groups)
        self._local = threading.local()
        self._changelog: ChangelogWriter | None = None
        self._client: pulsar.Client | None = None
        self._log: Changelog | None = None
        self._attach_lock = threading.Lock()
        # The group files this store used (their connections are shared in the process: _FILES); an
        # EFFECTIVELY_ONCE message holds its group's lock from begin to commit.
        self._files: dict[int, _GroupFile] = {}
        self._applied_since_prune = 0
        self.duplicates_skipped = 0   # EFFECTIVELY_ONCE: messages whose id was applied already (in this process)
        self.restore_stats = RestoreStats()

    # ---- group files -----------------------------------------------------------------------------
    def group_path(self, group: int) -> Path:
        return self.snapshot_dir / f"kg-{group}.sqlite"

    def _file(self, group: int) -> _GroupFile:
        f = self._files.get(group)
        if f is not None and _FILES.get(f.path) is f:
            return f
        path = str(self.group_path(group))
        if _inode(self._home) != self._home_inode:
            # Its directory was moved away under it (the function was deleted, its instance still drains), and the
            # path may hold another function's files by now (created again under that name): never take those.
            raise StateRemovedError(f"key group {group}: the state directory {self._home} was removed "
                                    "(the function was deleted)")
        with _FILES_LOCK:
            f = _FILES.get(path)
            if f is not None and _inode(path) != f.inode:
                del _FILES[path]   # its file was deleted (a deleted function): a new one is not its state
                f.conn.close()
                f = None
            if f is None:
                conn = self._connect(group)
                row = conn.execute("SELECT clean FROM meta").fetchone()
                f = _FILES[path] = _GroupFile(path, conn, threading.RLock(), bool(row and row[0]), _inode(path))
        self._files[group] = f
        return f

    def _connect(self, group: int) -> sqlite3.Connection:
        """A new connection to the group's file (created with its tables if missing)."""
        self.snapshot_dir.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.group_path(group), timeout=30, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_PAGES}")
        conn.execute(f"PRAGMA journal_size_limit={_WAL_BYTES}")
        conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
        # One transaction: a new group file costs one commit. applied's rowid is the order ids were applied;
        # meta: the changelog position the file covers, and clean: nothing after it here (a release wrote it).
        conn.executescript(
            "BEGIN; CREATE TABLE IF NOT EXISTS kv (kind TEXT NOT NULL, key TEXT NOT NULL, ival INTEGER, bval BLOB, "
            "ver INTEGER NOT NULL, dead INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (kind, key)) WITHOUT ROWID; "
            "CREATE TABLE IF NOT EXISTS applied (mid TEXT NOT NULL UNIQUE); "
            "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), position BLOB, "
            "clean INTEGER NOT NULL); COMMIT;")
        return conn

    @staticmethod
    def _served(f: _GroupFile) -> sqlite3.Connection:
        """The group file's connection, for a change (the caller holds its lock): the first change after a
        release marks the file as served, since from now on it may hold changes the changelog has not persisted,
        so a crash makes it untrusted (open replays the group's whole changelog)."""
        if f.clean:
            f.conn.execute("INSERT INTO meta VALUES (0, NULL, 0) ON CONFLICT DO UPDATE SET clean = 0")
            f.clean = False
        return f.conn

    def _close(self, group: int) -> None:
        """Closes the file this store used, never another one now at its path (a deleted function's store
        closes after a function created again under its name opened its own files there)."""
        f = self._files.pop(group, None)
        if f is None:
            return
        with _FILES_LOCK:
            if _FILES.get(f.path) is f:
                del _FILES[f.path]
        with f.lock:
            f.conn.close()

    def _existing(self) -> list[int]:
        """The owned groups that have a file here (reads by key alone look only in those); of a store that is not
        keyed, only its one group."""
        groups = self.owned() if self._one_group is None else {self._one_group} & self.owned()
        return [g for g in sorted(groups) if g in self._files or self.group_path(g).exists()]

    # ---- the changelog ---------------------------------------------------------------------------
    def attach_changelog(self, client: pulsar.Client, changelog: Changelog) -> None:
        """Send every change to `changelog` from now on. A shard's producer starts at its first change, so a
        stateless function never creates the topic; thread instances share the store, and so the producers."""
        with self._attach_lock:
            if self._client is None:
                self._client, self._log = client, changelog

    @property
    def changelog(self) -> ChangelogWriter | None:
        if self._changelog is None and self._client is not None:
            with self._attach_lock:
                if self._changelog is None:
                    self._changelog = ChangelogWriter(self._client, self._log)
        return self._changelog

    def close(self) -> None:
        if self._changelog is not None:
            self._changelog.close()
            self._changelog = None
        for g in list(self._files):
            self._close(g)

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
        if self._one_group is not None:
            return self._one_group
        g = self._holding(key, kind)
        return key_group(key, self.num_key_groups) if g is None else g

    def holds(self, key: str) -> bool:
        """Whether an owned group has the key (a counter or a value): a function writes state keys while
        processing a message key's records, so a state key may live in another key's group (REST looks here)."""
        return self._holding(key) is not None

    def _holding(self, key: str, kind: str | None = None) -> int | None:
        for g in self._existing():
            f = self._file(g)
            with f.lock:
                if f.conn.execute("SELECT 1 FROM kv WHERE key = ? AND dead = 0"
                                  + ("" if kind is None else " AND kind = ?"),
                                  (key,) if kind is None else (key, kind)).fetchone():
                    return g
        return None

    # ---- message scope: EFFECTIVELY_ONCE and flush-before-ack ------------------------------------
    def begin(self, group: int, msg_id: str | None = None) -> bool:
        """Start a message's state calls in `group`. With msg_id (EFFECTIVELY_ONCE) they become one
        transaction with the id (holding the group until commit/abort); False: that id is applied in this
        group already (skip the message)."""
        self._check_owned(group)
        self._local.scope = _Scope(group, msg_id)
        if msg_id is None:
            return True
        f = self._file(group)
        f.lock.acquire()
        try:
            conn = self._served(f)
            conn.execute("BEGIN IMMEDIATE")
            if conn.execute("SELECT 1 FROM applied WHERE mid = ?", (msg_id,)).fetchone():
                conn.execute("ROLLBACK")
                self._local.scope = None
                self.duplicates_skipped += 1
                f.lock.release()
                return False
        except BaseException:
            self._local.scope = None
            f.lock.release()
            raise
        self._local.scope.file = f
        return True

    def apply_once(self, msg_id: str, group: int) -> bool:
        """docs/state.md's name for begin(group, msg_id)."""
        return self.begin(group, msg_id)

    def commit(self) -> None:
        """End the message: its transaction and its changelog records (sent, not yet flushed)."""
        scope = self._take_scope()
        if scope is None:
            return
        records = list(scope.pending.values())
        if scope.msg_id is not None:
            try:
                conn = scope.file.conn
                if records:
                    conn.execute("INSERT INTO applied(mid) VALUES (?)", (scope.msg_id,))
                    records = [Record(r.group, r.kind, r.key, r.value, r.version, r.deleted, scope.msg_id, i,
                                      len(records)) for i, r in enumerate(records)]
                conn.execute("COMMIT")
                if records:
                    self._prune(conn)
            finally:
                scope.file.lock.release()
        self._send(records)

    def abort(self) -> None:
        """The function raised: under EFFECTIVELY_ONCE nothing happened; otherwise its changes stand (as
        Pulsar's state does) and go to the changelog."""
        scope = self._take_scope()
        if scope is None:
            return
        if scope.msg_id is not None:
            try:
                scope.file.conn.execute("ROLLBACK")
            finally:
                scope.file.lock.release()
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

    def _prune(self, conn: sqlite3.Connection) -> None:
        self._applied_since_prune += 1
        if self._applied_since_prune < _PRUNE_EVERY:
            return
        self._applied_since_prune = 0
        _prune_applied(conn)

    # ---- reads and writes in a group -------------------------------------------------------------
    def _write(self, sql: str, args: tuple, kind: str, key: str, group: int, deleted: bool = False):
        self._check_owned(group)
        f = self._file(group)
        with f.lock:
            row = self._served(f).execute(sql, args).fetchone()
        if row is None:
            return None
        value, version = row
        self._record(Record(group, kind, key, None if deleted else value, version, deleted))
        return value

    def incr(self, group: int, key: str, amount: int) -> int:
        return self._write(
            "INSERT INTO kv(kind, key, ival, ver) VALUES('c', ?, ?, 1) ON CONFLICT DO UPDATE SET "
            "ival = CASE WHEN dead THEN excluded.ival ELSE ival + excluded.ival END, ver = ver + 1, dead = 0 "
            "RETURNING ival, ver", (key, int(amount)), COUNTER, key, group)

    def put(self, group: int, key: str, value) -> None:
        if isinstance(value, str):
            value = value.encode()
        self._write("INSERT INTO kv(kind, key, bval, ver) VALUES('s', ?, ?, 1) ON CONFLICT DO UPDATE SET "
                    "bval = excluded.bval, ver = ver + 1, dead = 0 RETURNING bval, ver",
                    (key, value), VALUE, key, group)

    def set_count(self, group: int, key: str, value: int) -> None:
        self._delete(group, VALUE, key)
        self._write("INSERT INTO kv(kind, key, ival, ver) VALUES('c', ?, ?, 1) ON CONFLICT DO UPDATE SET "
                    "ival = excluded.ival, ver = ver + 1, dead = 0 RETURNING ival, ver",
                    (key, int(value)), COUNTER, key, group)

    def _delete(self, group: int, kind: str, key: str) -> None:
        self._write("UPDATE kv SET ival = NULL, bval = NULL, ver = ver + 1, dead = 1 "
                    "WHERE kind = ? AND key = ? AND dead = 0 RETURNING ival, ver",
                    (kind, key), kind, key, group, deleted=True)

    def _read(self, group: int, kind: str, key: str):
        self._check_owned(group)
        f = self._file(group)
        with f.lock:
            row = f.conn.execute("SELECT ival, bval FROM kv WHERE kind = ? AND key = ? AND dead = 0",
                                 (kind, key)).fetchone()
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
        for g in self._existing():
            f = self._file(g)
            with f.lock:
                rows = f.conn.execute("SELECT key, ival FROM kv WHERE kind = 'c' AND dead = 0").fetchall()
            for key, value in rows:
                out[key] = out.get(key, 0) + value
        return out

    def rows(self) -> dict[tuple[str, str, int], tuple]:
        """Every live row of the owned groups: (kind, key, group) -> (ival, bval) (tests, bench/state_replay.py)."""
        out = {}
        for g in self._existing():
            f = self._file(g)
            with f.lock:
                for kind, key, ival, bval in f.conn.execute(
                        "SELECT kind, key, ival, bval FROM kv WHERE dead = 0"):
                    out[(kind, key, g)] = (ival, bval)
        return out

    # ---- release and open: the group files and the changelog -------------------------------------
    def snapshot(self, groups: set[int]) -> None:
        """Flush, then record in each group's file the changelog position it covers (nothing is copied),
        so opening the group on this worker again replays only the changelog after it."""
        writer = self.changelog
        shard = self._log.shard if self._log is not None else (lambda g: 0)
        marks = writer.mark({shard(g) for g in groups}) if writer is not None else {}   # flushed too
        for g in sorted(groups):
            f = self._file(g)
            with f.lock:
                f.conn.execute("INSERT OR REPLACE INTO meta VALUES (0, ?, 1)", (marks.get(shard(g)),))
                f.clean = True

    def release(self, groups: set[int], snapshot: bool = True) -> None:
        """Give groups up: flush and record the position in their files (no copy: a file stays on this
        worker's disk, its connection open in this process, for whichever store opens the group next).
        snapshot=False: the files are not the groups' state (never restored here) and keep the position they had."""
        groups = set(groups)
        if snapshot:
            self.snapshot(groups)
        self._owned = self.owned() - groups

    def open(self, groups: set[int], restore: bool = True, client: pulsar.Client | None = None,
             changelog: Changelog | None = None, refresh: set[int] = frozenset()) -> RestoreStats:
        """Own groups from now on. restore: reopen a group's released file and apply the changelog after its
        position; a group without one (or whose file was in use when its worker died) replays the whole
        changelog (the attached one, or `client`/`changelog`). `refresh`: pre-copied groups that will open here
        later, brought up to now in the same read (so the next open's tail starts here, not at the pre-copy;
        the caller makes sure no store of this process uses their files)."""
        groups = set(groups)
        refresh = set(refresh) - groups - self.owned()
        stats = RestoreStats(groups=len(groups))
        started = time.perf_counter()
        if restore:
            client = client or self._client
            changelog = changelog or self._log
            if client is None or changelog is None:
                raise ValueError("restoring key groups needs the changelog: attach_changelog first or pass "
                                 "client and changelog")
            self._mark_copied(refresh, self._restore(groups | refresh, client, changelog, stats))
        self._owned = None if self._owned is None else self._owned | groups
        stats.seconds = time.perf_counter() - started
        self.restore_stats = stats
        return stats

    def prepare(self, groups: set[int], client: pulsar.Client, changelog: Changelog, duty: float = 1.0,
                mb_per_s: float | None = None) -> RestoreStats:
        """Pre-copy groups another worker serves, before they move here: bring their files up to now from the
        changelog and record that position, as a release does, so the later open replays only what changed
        meanwhile (a short tail) while the groups' records wait. The caller makes sure no store of this process
        uses their files. `duty`: the share of time the replay may take (it holds the GIL that this worker's
        instances need), as migration work is paced; `mb_per_s`: how fast it may read the changelog (the broker
        serves the function's records too)."""
        groups = set(groups) - self.owned()
        stats = RestoreStats(groups=len(groups))
        started = time.perf_counter()
        self._mark_copied(groups, self._restore(groups, client, changelog, stats, Pacer(duty, mb_per_s)))
        stats.seconds = time.perf_counter() - started
        return stats

    def _mark_copied(self, groups: set[int], positions: dict[int, bytes | None]) -> None:
        """Record that the files of these groups, not owned here, hold the changelog up to their `positions`."""
        for g in groups:
            f = self._file(g)
            with f.lock:
                if g not in self.owned():   # opened meanwhile (a prepare that outlived its wait): served now
                    f.conn.execute("INSERT OR REPLACE INTO meta VALUES (0, ?, 1)", (positions.get(g),))
                    f.clean = True

    def _restore(self, groups: set[int], client: pulsar.Client, changelog: Changelog, stats: RestoreStats,
                 pace: Callable[..., None] | None = None) -> dict[int, bytes | None]:
        """Bring the groups' files up to now in one pass over each changelog shard that holds some of them, from
        the oldest position a group of the shard needs (a group's records at or before its own position are in
        its file already); returns the position each group's file now covers (its shard's end). `pace`: a paced
        read (changelog.read_changelog), and paced writes: a group's rows at a time, then a pause by the duty (tens
        of MB written at once would hold up the disk's other writers, the broker's among them, for as long)."""
        positions: dict[int, bytes | None] = {}   # None: from the changelog's start
        for g in groups:
            path = self.group_path(g)
            meta = None
            if path.exists() or str(path) in _FILES:
                f = self._file(g)
                with f.lock:
                    meta = f.conn.execute("SELECT position, clean FROM meta").fetchone()
                    if meta is not None and meta[1]:
                        stats.snapshot_rows += f.conn.execute("SELECT count(*) FROM kv").fetchone()[0]
            if meta is not None and meta[1]:
                positions[g] = meta[0]
                stats.from_snapshot += 1
            else:   # never released here: its rows may be ahead of the changelog, or it is not there at all
                self._close(g)
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
                positions[g] = None
        starts = {g: pulsar.MessageId.deserialize(p) if p else None for g, p in positions.items()}
        rows: dict[tuple[str, str, int], tuple] = {}       # (kind, key, kg) -> (ival, bval, ver, dead)
        applied: dict[int, list[str]] = {}
        ends: dict[int, bytes | None] = {}
        partial: dict[tuple[int, str], dict[int, Record]] = {}
        reads: dict[int, tuple[set[int], ReadStats]] = {}   # shard -> (its groups, its read)
        for g in positions:
            reads.setdefault(changelog.shard(g), (set(), ReadStats()))[0].add(g)
        shard_reads = []
        for shard, (in_shard, read) in sorted(reads.items()):
            oldest = (None if any(positions[g] is None for g in in_shard)
                      else positions[min(in_shard, key=starts.__getitem__)])
            shard_reads.append(read_changelog(client, changelog.shard_topic(shard), oldest, read, in_shard, pace,
                                              len(reads)))
        for mid, r in _round_robin(shard_reads):
            start = starts[r.group]
            if start is not None and not start < mid:
                continue                  # before the group's own position: its file has it
            if r.msg_id is None:
                _apply(rows, r)
                continue
            parts = partial.setdefault((r.group, r.msg_id), {})
            parts[r.part] = r             # by index: a record read twice is one part
            if len(parts) == r.parts:     # every record of the message arrived: apply them together
                del partial[(r.group, r.msg_id)]
                for p in parts.values():
                    _apply(rows, p)
                applied.setdefault(r.group, []).append(r.msg_id)
        for in_shard, read in reads.values():
            stats.records += read.records
            stats.bytes += read.bytes
            stats.duplicates += read.duplicates
            ends.update(dict.fromkeys(in_shard, read.end))
        by_group: dict[int, list[tuple]] = {}
        for (kind, key, g), v in rows.items():
            by_group.setdefault(g, []).append((kind, key) + v)
        for g in sorted(groups):
            group_rows, group_applied = by_group.get(g, ()), applied.get(g, ())
            f = self._file(g)
            with f.lock:
                conn = self._served(f)
                if not group_rows and not group_applied:
                    continue   # nothing of it in the read (most groups of a refresh): no transaction
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT OR IGNORE INTO applied(mid) VALUES (?)", ((m,) for m in group_applied))
                conn.executemany(   # over the file's row only when newer
                    "INSERT INTO kv(kind, key, ival, bval, ver, dead) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT DO UPDATE SET ival = excluded.ival, bval = excluded.bval, ver = excluded.ver, "
                    "dead = excluded.dead WHERE excluded.ver > kv.ver", group_rows)
                _prune_applied(conn)
                conn.execute("COMMIT")
            if pace is not None:
                pace()   # the duty alone: the read's rate is for the broker (Pacer)
        return ends


class Pacer:
    """Sleeps after each stretch of work so that work takes at most `duty` of the time (duty 1: never) and,
    given `mb_per_s`, so that the bytes each stretch of reading handled go no faster than that.

    A read of a log that is still being written passes its lag (now minus the publish time of the record it
    reached): the rate only holds while the read, since its start, has gained CATCH_UP s of lag per s, i.e.
    reads the log at least 1 + CATCH_UP times as fast as it was written; so a log written faster than the rate
    allows (a busy function's changelog) is read at about that multiple of its write rate, and rounds of
    pre-copy shrink by as much each. Reads of several logs side by side (a restore's changelog shards) each pass
    their `source`: a log's lag is compared with its own first, and the verdict is on their mean gain (the shards
    are at different places in their history: one shard's lag against another's said nothing, and flipped the
    verdict from one call to the next). A call without a lag (the group files' writes after the read) is paced by
    the duty alone: the rate spares the broker, which the writes do not touch (held to it as well, a 500 MB
    pre-copy's rounds hardly shrank, BENCHMARKS.md "A catch-up read's bursts").
    """

    CATCH_UP = 2.0

    def __init__(self, duty: float, mb_per_s: float | None = None, stop: threading.Event | None = None):
        """`stop`: ends a sleep early (the work is being called off)."""
        self.duty = duty
        self.bytes_per_s = mb_per_s * 1e6 if mb_per_s else None
        self._stop = stop or threading.Event()
        self._t0 = time.perf_counter()
        self._gains: dict[Hashable, tuple[float, float, float | None]] = {}   # source -> (first call, lag, gain since)
        self._capped = True

    def __call__(self, nbytes: int = 0, lag_s: float | None = None, source: Hashable = None) -> None:
        now = time.perf_counter()
        worked = now - self._t0
        wait = worked * (1 - self.duty) / self.duty
        if self.bytes_per_s and lag_s is not None and self._catching_up(now, lag_s, source):
            wait = max(wait, nbytes / self.bytes_per_s - worked)
        if wait > 0:
            self._stop.wait(wait)   # pacing, not synchronisation
        self._t0 = time.perf_counter()

    def _catching_up(self, now: float, lag_s: float, source: Hashable) -> bool:
        first = self._gains.get(source)
        if first is None:
            self._gains[source] = (now, lag_s, None)
        elif now > first[0]:
            self._gains[source] = (first[0], first[1], (first[1] - lag_s) / (now - first[0]))
            gains = [g for _, _, g in self._gains.values() if g is not None]
            self._capped = sum(gains) / len(gains) >= self.CATCH_UP
        return self._capped


def _round_robin(iterators: list[Iterator]) -> Iterator:
    """One item of each in turn: the shards of a restore are read side by side, so a paced read's lag (the
    Pacer's catch-up rule) is that of all of them against their combined write rate, not of one at a time."""
    active = deque(iterators)
    while active:
        it = active.popleft()
        try:
            item = next(it)
        except StopIteration:
            continue
        active.append(it)
        yield item


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _prune_applied(conn: sqlite3.Connection) -> None:
    """Keep the newest DEDUPE_WINDOW applied ids of a group."""
    conn.execute("DELETE FROM applied WHERE rowid <= (SELECT rowid FROM applied ORDER BY rowid DESC LIMIT 1 "
                 "OFFSET ?)", (DEDUPE_WINDOW,))


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
