"""The decision log: one JSON line per evaluation of a function (every period, changed or not), with
the inputs that drove it, so any decision can be explained (`autoscaler why`) and replayed.

Appends are flushed line by line; a crash loses at most the line being written. The log is bounded:
when a file would pass `max_bytes` it is rotated (decisions.jsonl -> .1 -> .2 ..., the oldest of
`backups` dropped), like logging's RotatingFileHandler.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Iterator, cast

DEFAULT_MAX_BYTES = 5_000_000
DEFAULT_BACKUPS = 3


def _plain(value: Any) -> Any:
    if is_dataclass(value):
        return asdict(cast(Any, value))
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class DecisionLog:
    def __init__(self, path: str | Path | None, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS):
        self.path = Path(path) if path else None
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict) -> None:
        path = self.path
        if not path:
            return
        line = json.dumps(record, default=_plain, sort_keys=True) + "\n"
        with self._lock:
            if path.exists() and path.stat().st_size + len(line) > self.max_bytes:
                self._rotate(path)
            with path.open("a") as f:
                f.write(line)

    def _rotate(self, path: Path) -> None:
        for i in range(self.backups, 0, -1):
            older = self._file(path, i - 1)
            if older.exists():
                older.replace(self._file(path, i))  # overwrites the oldest kept
        if self.backups == 0:
            path.unlink()

    @staticmethod
    def _file(path: Path, i: int) -> Path:
        return path if i == 0 else path.with_name(f"{path.name}.{i}")

    def read(self) -> list[dict]:
        """Every record kept, oldest first."""
        return list(reversed(list(self._newest_first())))

    def recent(self, function: str, limit: int = 10) -> list[dict]:
        """The last `limit` records of one function, oldest first."""
        out = []
        needle = json.dumps(function)
        for record in self._newest_first(needle):
            if record.get("function") == function:
                out.append(record)
                if len(out) >= limit:
                    break
        return list(reversed(out))

    def _newest_first(self, needle: str | None = None) -> Iterator[dict]:
        path = self.path
        if not path:
            return
        for i in range(self.backups + 1):
            try:
                lines = self._file(path, i).read_text().splitlines()
            except FileNotFoundError:
                continue
            for line in reversed(lines):
                if line.strip() and (needle is None or needle in line):
                    yield json.loads(line)
