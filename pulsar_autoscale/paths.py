"""Default data locations: under the user's XDG data directory, never the current directory.

A worker or controller started from a checkout must not write into it, nor pick up what an
earlier run left there: `$XDG_DATA_HOME/pulsar-autoscale/...` (default ~/.local/share).
"""

from __future__ import annotations

import os
from pathlib import Path

APP = "pulsar-autoscale"


def user_data_dir(*parts: str) -> Path:
    base = os.environ.get("XDG_DATA_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".local" / "share"
    return root.joinpath(APP, *parts)
