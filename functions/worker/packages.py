"""Pulsar's `functions upload` / `download`: files kept by the worker under a path, for later download.

Paths are relative names inside the worker's package directory: `..`, absolute paths and empty
segments are refused, so a path can never reach outside it.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.functions.model.files import write_atomically


class PackageNotFound(PulsarAutoscaleError):
    """No file at that path (REST: 404)."""

    http_status = 404


class PackageStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _file(self, path: str) -> Path:
        if not isinstance(path, str) or not path.strip():
            raise ConfigError("path is missing: name where the file is kept, e.g. my-tenant/exclaim.py")
        parts = PurePosixPath(path.strip().lstrip("/")).parts
        if (
            not parts
            or any(p in ("", ".", "..") or len(p.encode()) > 255 or not p.isprintable() for p in parts)
            or len(parts) > 16
        ):
            raise ConfigError(
                f"path {path!r} is not a relative path of plain names (no '..', no control characters, at most 16 levels)"
            )
        return self.root.joinpath(*parts)

    def put(self, path: str, data: bytes) -> None:
        try:
            write_atomically(self._file(path), data)
        except (FileExistsError, IsADirectoryError, NotADirectoryError) as exc:
            # a file where a directory of the path should be, or a directory where the file should be: the
            # caller's path clashes with an earlier upload (the message names the path, never the server's)
            raise ConfigError(f"path {path!r} clashes with an uploaded file or directory of the same name") from exc

    def get(self, path: str) -> bytes:
        f = self._file(path)
        if not f.is_file():
            raise PackageNotFound(f"no file uploaded at path {path!r}")
        return f.read_bytes()
