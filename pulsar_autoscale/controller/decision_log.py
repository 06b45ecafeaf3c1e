"""The decision log: one JSON line per decision, with the inputs that drove it, so any decision can be
explained and replayed. Appends are flushed line by line; a crash loses at most the line being written."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any


def _plain(value: Any) -> Any:
    if is_dataclass(value):
        return asdict(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


class DecisionLog:
    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict) -> None:
        if not self.path:
            return
        line = json.dumps(record, default=_plain, sort_keys=True)
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")

    def read(self) -> list[dict]:
        if not self.path or not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
