"""The embedded state store behind Context.incr_counter/get_counter/put_state/get_state.

SQLite in WAL mode: shared by thread and process instances of a function on one worker,
durable across restarts and scaling, atomic increments without a state server.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path


class StateStore:
    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._path = str(path)
        self._local = threading.local()
        with self._conn() as c:
            c.execute("CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
            c.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value BLOB)")

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self._path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def incr_counter(self, key: str, amount: int) -> int:
        row = self._conn().execute(
            "INSERT INTO counters(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = value + excluded.value "
            "RETURNING value", (key, int(amount))).fetchone()
        return row[0]

    def get_counter(self, key: str) -> int:
        row = self._conn().execute("SELECT value FROM counters WHERE key = ?", (key,)).fetchone()
        return row[0] if row else 0

    def del_counter(self, key: str) -> None:
        self._conn().execute("DELETE FROM counters WHERE key = ?", (key,))

    def set_counter(self, key: str, value: int) -> None:
        """Pulsar's putstate with a numberValue: the key becomes a counter with that value."""
        conn = self._conn()
        conn.execute("DELETE FROM state WHERE key = ?", (key,))
        conn.execute("INSERT OR REPLACE INTO counters(key, value) VALUES(?, ?)", (key, int(value)))

    def put_state(self, key: str, value) -> None:
        if isinstance(value, str):
            value = value.encode()
        self._conn().execute("INSERT OR REPLACE INTO state(key, value) VALUES(?, ?)", (key, value))

    def get_state(self, key: str):
        row = self._conn().execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def has_counter(self, key: str) -> bool:
        return self._conn().execute("SELECT 1 FROM counters WHERE key = ?", (key,)).fetchone() is not None

    def counters(self) -> dict[str, int]:
        return dict(self._conn().execute("SELECT key, value FROM counters").fetchall())
