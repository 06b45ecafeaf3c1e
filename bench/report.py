"""A benchmark's result: one JSON object printed, and written to a file when one is named."""

from __future__ import annotations

import json
from pathlib import Path


def emit(result: dict, out: str | Path | None = None, indent: int = 2) -> None:
    text = json.dumps(result, indent=indent)
    print(text)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
