"""Files that readers must see whole: written beside their path, then renamed over it."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomically(path: Path, data: bytes) -> Path:
    """A reader sees the whole file or none, and writers racing on one path each rename their own copy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a failed write leaves nothing behind
        raise
    return path
