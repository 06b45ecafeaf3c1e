"""A message's state calls on a StateStore (store.py): begun in the message's key group, then committed or
aborted as one. Under EFFECTIVELY_ONCE they are one transaction with the message's id, which the group's file
records among its applied ids (pruned now and then), so a message whose id was applied already is skipped;
otherwise its changes go to the changelog at its end, or before a function's own ack (flush_before_ack), and the
input's ack waits until they are persisted (docs/state.md).

A mixin of StateStore (store.py), whose group files, ownership check, thread-local scope and changelog writer it uses.
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from pulsar_autoscale.functions.state.changelog import ChangelogWriter, Record
from pulsar_autoscale.functions.state.group_files import GroupFile, prune_applied, served

_PRUNE_EVERY = 1_000  # EFFECTIVELY_ONCE: commits between two prunings of a group's applied ids


@dataclass
class _Scope:
    """The state calls of the message being processed on this thread."""

    group: int
    msg_id: str | None = None  # set: EFFECTIVELY_ONCE, the updates are one transaction
    file: "GroupFile | None" = None  # EFFECTIVELY_ONCE: the file whose lock and transaction it holds
    pending: dict = field(default_factory=dict)  # (kind, key) -> Record, the latest change of each


class MessageScope:
    """begin, then commit or abort: the state calls of the message each thread is processing."""

    if TYPE_CHECKING:  # StateStore's (store.py), which this mixin uses
        _local: threading.local
        _changelog: ChangelogWriter | None
        _applied_since_prune: int
        duplicates_skipped: int

        @property
        def changelog(self) -> ChangelogWriter | None: ...

        def _check_owned(self, group: int) -> None: ...

        def _file(self, group: int) -> GroupFile: ...

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
            conn = served(f)
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
            file = cast(GroupFile, scope.file)  # begin gives a scope with a msg_id the group's file
            try:
                conn = file.conn
                if records:
                    conn.execute("INSERT INTO applied(mid) VALUES (?)", (scope.msg_id,))
                    records = [
                        Record(r.group, r.kind, r.key, r.value, r.version, r.deleted, scope.msg_id, i, len(records))
                        for i, r in enumerate(records)
                    ]
                conn.execute("COMMIT")
                if records:
                    self._prune(conn)
            finally:
                file.lock.release()
        self._send(records)

    def abort(self) -> None:
        """The function raised: under EFFECTIVELY_ONCE nothing happened; otherwise its changes stand (as
        Pulsar's state does) and go to the changelog."""
        scope = self._take_scope()
        if scope is None:
            return
        if scope.msg_id is not None:
            file = cast(GroupFile, scope.file)  # begin gives a scope with a msg_id the group's file
            try:
                file.conn.execute("ROLLBACK")
            finally:
                file.lock.release()
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
            cast(ChangelogWriter, self._changelog).flush()  # dirty: this thread sent records through it

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
        if records and (writer := self.changelog) is not None:
            writer.send(records)
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
        prune_applied(conn)
