"""A function's state on one worker: key-grouped, local, and durable through its changelog.

Context.incr_counter/get_counter/put_state/get_state/del_counter for a message go to the key group
of the message's key (docs/state.md). Each key group is its own SQLite file (WAL) in the store's
group directory, which the function's stores on one worker share (its thread and process instances,
and on a keyedState function every instance's store), so a group moves between stores on one worker
without a copy (ScalaSSC: state stays where it is served): release flushes the changelog and records
in the group's file the changelog position the file covers (its connection stays open, shared in the
process); open reads that position and applies the changelog after it. A group whose file is missing, or was not closed by a
release (kill -9 while it was served: it may hold changes the changelog never got), is rebuilt from
the whole changelog (functions/state/restore.py). Every change is also a changelog record
(functions/state/changelog.py) sent before the input message is acked; a message's state calls, one
transaction under EFFECTIVELY_ONCE: functions/state/message_scope.py. The files themselves, shared in the
process: functions/state/group_files.py.

Rows are never deleted while their group is owned: a deletion leaves a tombstone with the next
version, so a replay that sees an older value of the key cannot bring it back.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import AbstractSet, Callable, cast

import pulsar

from pulsar_autoscale.functions.model.keygroups import DEFAULT_NUM_KEY_GROUPS, key_group
from pulsar_autoscale.functions.state.changelog import COUNTER, VALUE, Changelog, ChangelogWriter, Record, check_value_size
from pulsar_autoscale.functions.state.group_files import (
    GroupFile,
    discard,
    inode,
    is_current,
    is_open,
    prune_applied,
    served,
    shared,
)
from pulsar_autoscale.functions.state.groups import NONE_KEY, GroupView, one_group
from pulsar_autoscale.functions.state.message_scope import MessageScope
from pulsar_autoscale.functions.state.pacing import Pacer
from pulsar_autoscale.functions.state.restore import RestoreStats, read_tail


class StateRemovedError(RuntimeError):
    """The store's files were removed under it: its function was deleted while an instance still ran."""


class NotOwnedError(RuntimeError):
    """A state call for a key group this store does not own (it is elsewhere or moving)."""


class StateStore(MessageScope):
    """The function's key groups on this worker. `owned` None: every group (a single worker, no routing)."""

    def __init__(
        self, path: str | Path, num_key_groups: int = DEFAULT_NUM_KEY_GROUPS, owned: set[int] | None = None, keyed: bool = True
    ):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._home = str(Path(path).parent)  # its identity: a function created again under the name has another
        self._home_inode = inode(self._home)
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
        # The group files this store used (their connections are shared in the process: group_files); an
        # EFFECTIVELY_ONCE message holds its group's lock from begin to commit.
        self._files: dict[int, GroupFile] = {}
        self._applied_since_prune = 0
        self.duplicates_skipped = 0  # EFFECTIVELY_ONCE: messages whose id was applied already (in this process)
        self.restore_stats = RestoreStats()

    # ---- group files -----------------------------------------------------------------------------
    def group_path(self, group: int) -> Path:
        return self.snapshot_dir / f"kg-{group}.sqlite"

    def _file(self, group: int) -> GroupFile:
        f = self._files.get(group)
        if f is not None and is_current(f):
            return f
        if inode(self._home) != self._home_inode:
            # Its directory was moved away under it (the function was deleted, its instance still drains), and the
            # path may hold another function's files by now (created again under that name): never take those.
            raise StateRemovedError(f"key group {group}: the state directory {self._home} was removed (the function was deleted)")
        f = self._files[group] = shared(self.group_path(group))
        return f

    def _close(self, group: int) -> None:
        f = self._files.pop(group, None)
        if f is not None:
            discard(f)

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
                if self._changelog is None:  # attach_changelog sets _log with _client
                    self._changelog = ChangelogWriter(self._client, cast(Changelog, self._log))
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
                if f.conn.execute(
                    "SELECT 1 FROM kv WHERE key = ? AND dead = 0" + ("" if kind is None else " AND kind = ?"),
                    (key,) if kind is None else (key, kind),
                ).fetchone():
                    return g
        return None

    # ---- reads and writes in a group -------------------------------------------------------------
    def _write(self, sql: str, args: tuple, kind: str, key: str, group: int, deleted: bool = False):
        self._check_owned(group)
        f = self._file(group)
        with f.lock:
            row = served(f).execute(sql, args).fetchone()
        if row is None:
            return None
        value, version = row
        self._record(Record(group, kind, key, None if deleted else value, version, deleted))
        return value

    def incr(self, group: int, key: str, amount: int) -> int:
        return self._write(
            "INSERT INTO kv(kind, key, ival, ver) VALUES('c', ?, ?, 1) ON CONFLICT DO UPDATE SET "
            "ival = CASE WHEN dead THEN excluded.ival ELSE ival + excluded.ival END, ver = ver + 1, dead = 0 "
            "RETURNING ival, ver",
            (key, int(amount)),
            COUNTER,
            key,
            group,
        )

    def put(self, group: int, key: str, value) -> None:
        value = value.encode() if isinstance(value, str) else value
        check_value_size(key, value)
        self._write(
            "INSERT INTO kv(kind, key, bval, ver) VALUES('s', ?, ?, 1) ON CONFLICT DO UPDATE SET "
            "bval = excluded.bval, ver = ver + 1, dead = 0 RETURNING bval, ver",
            (key, value),
            VALUE,
            key,
            group,
        )

    def set_count(self, group: int, key: str, value: int) -> None:
        self.delete(group, VALUE, key)
        self._write(
            "INSERT INTO kv(kind, key, ival, ver) VALUES('c', ?, ?, 1) ON CONFLICT DO UPDATE SET "
            "ival = excluded.ival, ver = ver + 1, dead = 0 RETURNING ival, ver",
            (key, int(value)),
            COUNTER,
            key,
            group,
        )

    def delete(self, group: int, kind: str, key: str) -> None:
        self._write(
            "UPDATE kv SET ival = NULL, bval = NULL, ver = ver + 1, dead = 1 "
            "WHERE kind = ? AND key = ? AND dead = 0 RETURNING ival, ver",
            (kind, key),
            kind,
            key,
            group,
            deleted=True,
        )

    def read(self, group: int, kind: str, key: str):
        self._check_owned(group)
        f = self._file(group)
        with f.lock:
            row = f.conn.execute("SELECT ival, bval FROM kv WHERE kind = ? AND key = ? AND dead = 0", (kind, key)).fetchone()
        return None if row is None else row[0] if kind == COUNTER else row[1]

    # ---- by key alone: REST querystate/putstate, and callers without a message -------------------
    def incr_counter(self, key: str, amount: int) -> int:
        return self.incr(self._group_of(COUNTER, key), key, amount)

    def get_counter(self, key: str) -> int:
        return self.read(self._group_of(COUNTER, key), COUNTER, key) or 0

    def has_counter(self, key: str) -> bool:
        return self.read(self._group_of(COUNTER, key), COUNTER, key) is not None

    def del_counter(self, key: str) -> None:
        self.delete(self._group_of(COUNTER, key), COUNTER, key)

    def set_counter(self, key: str, value: int) -> None:
        """Pulsar's putstate with a numberValue: the key becomes a counter with that value."""
        self.set_count(self._group_of(COUNTER, key), key, value)

    def put_state(self, key: str, value) -> None:
        self.put(self._group_of(VALUE, key), key, value)

    def get_state(self, key: str):
        return self.read(self._group_of(VALUE, key), VALUE, key)

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
                for kind, key, ival, bval in f.conn.execute("SELECT kind, key, ival, bval FROM kv WHERE dead = 0"):
                    out[(kind, key, g)] = (ival, bval)
        return out

    # ---- release and open: the group files and the changelog -------------------------------------
    def snapshot(self, groups: set[int]) -> None:
        """Flush, then record in each group's file the changelog position it covers (nothing is copied),
        so opening the group on this worker again replays only the changelog after it."""
        writer = self.changelog
        shard = self._log.shard if self._log is not None else (lambda g: 0)
        marks = writer.mark({shard(g) for g in groups}) if writer is not None else {}  # flushed too
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

    def open(
        self,
        groups: set[int],
        restore: bool = True,
        client: pulsar.Client | None = None,
        changelog: Changelog | None = None,
        refresh: AbstractSet[int] = frozenset(),
    ) -> RestoreStats:
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
                raise ValueError("restoring key groups needs the changelog: attach_changelog first or pass client and changelog")
            self._mark_copied(refresh, self._restore(groups | refresh, client, changelog, stats))
        self._owned = None if self._owned is None else self._owned | groups
        stats.seconds = time.perf_counter() - started
        self.restore_stats = stats
        return stats

    def prepare(
        self, groups: set[int], client: pulsar.Client, changelog: Changelog, duty: float = 1.0, mb_per_s: float | None = None
    ) -> RestoreStats:
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
                if g not in self.owned():  # opened meanwhile (a prepare that outlived its wait): served now
                    f.conn.execute("INSERT OR REPLACE INTO meta VALUES (0, ?, 1)", (positions.get(g),))
                    f.clean = True

    def _restore(
        self,
        groups: set[int],
        client: pulsar.Client,
        changelog: Changelog,
        stats: RestoreStats,
        pace: Callable[..., None] | None = None,
    ) -> dict[int, bytes | None]:
        """Bring the groups' files up to now in one pass over each changelog shard that holds some of them, from
        the oldest position a group of the shard needs (a group's records at or before its own position are in
        its file already); returns the position each group's file now covers (its shard's end). `pace`: a paced
        read (changelog.read_changelog), and paced writes: a group's rows at a time, then a pause by the duty (tens
        of MB written at once would hold up the disk's other writers, the broker's among them, for as long)."""
        positions: dict[int, bytes | None] = {}  # None: from the changelog's start
        for g in groups:
            path = self.group_path(g)
            meta = None
            if path.exists() or is_open(str(path)):
                f = self._file(g)
                with f.lock:
                    meta = f.conn.execute("SELECT position, clean FROM meta").fetchone()
                    if meta is not None and meta[1]:
                        stats.snapshot_rows += f.conn.execute("SELECT count(*) FROM kv").fetchone()[0]
            if meta is not None and meta[1]:
                positions[g] = meta[0]
                stats.from_snapshot += 1
            else:  # never released here: its rows may be ahead of the changelog, or it is not there at all
                self._close(g)
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
                positions[g] = None
        tail = read_tail(client, changelog, positions, stats, pace)
        for g in sorted(groups):
            group_rows, group_applied = tail.rows.get(g, ()), tail.applied.get(g, ())
            f = self._file(g)
            with f.lock:
                conn = served(f)
                if not group_rows and not group_applied:
                    continue  # nothing of it in the read (most groups of a refresh): no transaction
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT OR IGNORE INTO applied(mid) VALUES (?)", ((m,) for m in group_applied))
                conn.executemany(  # over the file's row only when newer
                    "INSERT INTO kv(kind, key, ival, bval, ver, dead) VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT DO UPDATE SET ival = excluded.ival, bval = excluded.bval, ver = excluded.ver, "
                    "dead = excluded.dead WHERE excluded.ver > kv.ver",
                    group_rows,
                )
                prune_applied(conn)
                conn.execute("COMMIT")
            if pace is not None:
                pace()  # the duty alone: the read's rate is for the broker (Pacer)
        return tail.ends
