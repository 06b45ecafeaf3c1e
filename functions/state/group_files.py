"""The key groups' SQLite files, shared by every store of this process that opens them: a group moving between two
instances on one worker keeps its connection (no close, no checkpoint, no reopen)."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# EFFECTIVELY_ONCE remembers this many applied message ids per key group (why it is enough: docs/state.md).
DEDUPE_WINDOW = 10_000

# WAL of a group file: checkpointed at SQLite's default 1,000 pages and cut back to 512 KB (128 files per function).
_WAL_PAGES = 1000
_WAL_BYTES = 512 * 1024
_CACHE_KIB = 512  # SQLite's page cache per group connection (the OS caches the files too)
_OPEN_TIMEOUT_S = 30.0  # how long an open waits for another connection's lock


@dataclass
class GroupFile:
    """An open group file. `lock` serialises its threads; `clean`: the file holds nothing after its recorded
    changelog position."""

    path: str
    conn: sqlite3.Connection
    lock: threading.RLock
    clean: bool
    inode: int | None


_FILES: dict[str, GroupFile] = {}
_FILES_LOCK = threading.Lock()


def is_open(path: str) -> bool:
    return path in _FILES


def is_current(f: GroupFile) -> bool:
    """Whether `f` is still the open file at its path (not closed, nor replaced by a new file there)."""
    return _FILES.get(f.path) is f


def shared(path: Path) -> GroupFile:
    """The open file at `path`, opened (and created with its tables if missing) when no store has it open."""
    key = str(path)
    with _FILES_LOCK:
        f = _FILES.get(key)
        if f is not None and inode(key) != f.inode:
            del _FILES[key]  # its file was deleted (a deleted function): a new one is not its state
            f.conn.close()
            f = None
        if f is None:
            conn = _connect(path)
            row = conn.execute("SELECT clean FROM meta").fetchone()
            f = _FILES[key] = GroupFile(key, conn, threading.RLock(), bool(row and row[0]), inode(key))
    return f


def discard(f: GroupFile) -> None:
    """Closes `f`, never another file now at its path (a deleted function's store closes after a function created
    again under its name opened its own files there)."""
    with _FILES_LOCK:
        if _FILES.get(f.path) is f:
            del _FILES[f.path]
    with f.lock:
        f.conn.close()


def _wal(conn: sqlite3.Connection) -> None:
    """WAL mode. A new file's switch to it needs the file to itself, and SQLite answers "database is locked" at
    once, without waiting, while another process opens the same file (an instance process and a warm standby of
    one function): tried again until the open's timeout."""
    deadline = time.monotonic() + _OPEN_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=_OPEN_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    _wal(conn)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"PRAGMA wal_autocheckpoint={_WAL_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit={_WAL_BYTES}")
    conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
    # One transaction: a new group file costs one commit. IMMEDIATE takes the write lock first, waiting for it with
    # the busy timeout: a deferred one that reads and then writes is refused at once when another process opening
    # the same file wrote in between. applied's rowid is the order ids were applied;
    # meta: the changelog position the file covers, and clean: nothing after it here (a release wrote it).
    conn.executescript(
        "BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS kv (kind TEXT NOT NULL, key TEXT NOT NULL, ival INTEGER, bval BLOB, "
        "ver INTEGER NOT NULL, dead INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (kind, key)) WITHOUT ROWID; "
        "CREATE TABLE IF NOT EXISTS applied (mid TEXT NOT NULL UNIQUE); "
        "CREATE TABLE IF NOT EXISTS meta (id INTEGER PRIMARY KEY CHECK (id = 0), position BLOB, "
        "clean INTEGER NOT NULL); COMMIT;"
    )
    return conn


def served(f: GroupFile) -> sqlite3.Connection:
    """The group file's connection, for a change (the caller holds its lock): the first change after a
    release marks the file as served, since from now on it may hold changes the changelog has not persisted,
    so a crash makes it untrusted (open replays the group's whole changelog)."""
    if f.clean:
        f.conn.execute("INSERT INTO meta VALUES (0, NULL, 0) ON CONFLICT DO UPDATE SET clean = 0")
        f.clean = False
    return f.conn


def prune_applied(conn: sqlite3.Connection) -> None:
    """Keep the newest DEDUPE_WINDOW applied ids of a group."""
    conn.execute(
        "DELETE FROM applied WHERE rowid <= (SELECT rowid FROM applied ORDER BY rowid DESC LIMIT 1 OFFSET ?)", (DEDUPE_WINDOW,)
    )


def inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None
