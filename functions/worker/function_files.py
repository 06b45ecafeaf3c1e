"""The functions on disk: nothing accepted is lost when the worker restarts.

Each function has a directory under the data dir (tenant/namespace/name) with its saved config and the
code it runs. Uploaded code is staged under a directory named by its digest and becomes the function's
only when the saved config names it (an atomic rename). A deleted function's directory moves aside at once
(its name is free again) and is removed in the background.

Who may read what (docs/security.md, "Isolation of user code"): the data dir and every directory of the
functions' tree are the worker user's, 0700, and config.json (the function's secrets) is 0600. The one
place the instance user may read is a function's code directory `code/<digest>/` (0755, its file 0644):
an instance or validation child enters it as the worker's user (its working directory) and then drops to
the instance user, so it reads its own code there and cannot climb out (`code/` is 0700; on a cluster the
code is in `packages/<sha256>/`, and `packages/` is 0700).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.instance.instance_user import InstanceUser
from pulsar_autoscale.functions.instance.validation import code_digest, validate
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.worker.hosted import HostedFunction

log = logging.getLogger(__name__)
NAME_MAX = 255  # tenant, namespace and name are directories of the data dir
PRIVATE, READABLE, READABLE_FILE, PRIVATE_FILE = 0o700, 0o755, 0o644, 0o600


class FunctionFiles:
    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(data_dir, PRIVATE)  # nothing in it is the instance user's to reach by path
        for tree in ("functions", "packages"):  # packages: uploads, and a cluster's code (one dir per digest)
            (data_dir / tree).mkdir(mode=PRIVATE, exist_ok=True)
            os.chmod(data_dir / tree, PRIVATE)
        shutil.rmtree(self._trash_dir(), ignore_errors=True)  # deletes a previous run did not finish

    def fn_dir(self, cfg: FunctionConfig) -> Path:
        return self.data_dir / "functions" / cfg.tenant / cfg.namespace / cfg.name

    @staticmethod
    def check_names(cfg: FunctionConfig) -> None:
        for label, value in (("tenant", cfg.tenant), ("namespace", cfg.namespace), ("name", cfg.name)):
            if value in (".", ".."):
                raise ConfigError(f"Function {label} {value!r} is not a valid name")
            if len(value.encode()) > NAME_MAX:
                raise ConfigError(f"Function {label} is {len(value.encode())} bytes long: at most {NAME_MAX}")

    def _private_dir(self, cfg: FunctionConfig) -> Path:
        """The function's directory, made if missing; it and its tenant's and namespace's are 0700."""
        d = self.fn_dir(cfg)
        d.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
        for each in (d.parent.parent, d.parent, d):
            os.chmod(each, PRIVATE)
        return d

    def save(self, fn: HostedFunction) -> None:
        d = self._private_dir(fn.config)
        tmp = d / "config.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)  # its secrets: owner only
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, PRIVATE_FILE)
            f.write(
                json.dumps({"config": fn.config.to_dict(), "code_path": fn.code_path, "code_digest": fn.code_digest}, indent=1)
            )
        os.replace(tmp, d / "config.json")

    def saved(self) -> list[Path]:
        """Where every saved function's config is (load reads one)."""
        return sorted((self.data_dir / "functions").glob("*/*/*/config.json"))

    @staticmethod
    def load(path: Path) -> dict:
        """What save() wrote: the config, the code path and the code's digest (ValueError: not JSON)."""
        return json.loads(path.read_text())

    @staticmethod
    def checked_restore(
        cfg: FunctionConfig, saved: dict, validate_timeout_s: float, user: InstanceUser | None = None
    ) -> tuple[str | None, str]:
        """(digest, failure) of restored code: code that passed validation when it was stored (same sha256)
        runs; other code (stored before validation existed, or changed on disk) is validated first."""
        code_path = saved.get("code_path")
        try:
            digest = code_digest(code_path)
        except OSError as exc:
            return None, f"code {code_path} cannot be read: {exc.strerror}"
        if digest is not None and digest == saved.get("code_digest"):
            return digest, ""
        try:
            validate(cfg.className, code_path, timeout_s=validate_timeout_s, user=user)
        except ConfigError as exc:
            log.error("restored function %s cannot run: %s", cfg.fqfn, exc)
            return digest, f"function failed validation: {exc}"
        return digest, ""

    def stage_code(self, cfg: FunctionConfig, code: bytes | None, filename: str | None) -> str | None:
        """Write uploaded code where nothing reads it yet: a directory named by its digest. It becomes the
        function's code only when the saved config names it (an atomic rename)."""
        if code is None:
            if cfg.py:
                raise ConfigError(
                    f"py {cfg.py!r} names a file on the worker's host: py may only name uploaded "
                    "code (send the file as the multipart `data` part)"
                )
            return None
        name = Path(filename or cfg.py or f"{cfg.className.split('.')[0]}.py").name
        if not name.endswith(".py"):
            raise ConfigError(f"function package {name!r} is not a .py file (only Python files run here)")
        if len(name.encode()) > NAME_MAX:
            raise ConfigError(f"function file name is {len(name.encode())} bytes long: at most {NAME_MAX}")
        code_root = self._private_dir(cfg) / "code"
        code_root.mkdir(mode=PRIVATE, exist_ok=True)
        os.chmod(code_root, PRIVATE)  # an instance in code/<digest>/ cannot climb out
        d = code_root / hashlib.sha256(code).hexdigest()[:16]
        d.mkdir(exist_ok=True)
        os.chmod(d, READABLE)  # the instance user's working directory
        tmp = d / f".{name}.tmp"
        tmp.write_bytes(code)
        os.chmod(tmp, READABLE_FILE)
        os.replace(tmp, d / name)
        return str(d / name)

    def discard_code(self, cfg: FunctionConfig, code_path: str | None) -> None:
        """Remove code the function no longer uses (only what the worker stored under its directory)."""
        if not code_path:
            return
        path, code_root = Path(code_path), self.fn_dir(cfg) / "code"
        if path.parent.parent == code_root:
            shutil.rmtree(path.parent, ignore_errors=True)
        elif path.parent == self.fn_dir(cfg):
            path.unlink(missing_ok=True)

    def remove(self, cfg: FunctionConfig) -> Path | None:
        """Move the function's directory aside (its name is free at once); the caller removes what it returns."""
        d = self.fn_dir(cfg)
        return self._to_trash(d) if d.exists() else None

    def move_aside_except(self, keep: set[str]) -> dict[str, Path]:
        """Move aside the directory of every function not in `keep`; fqfn -> where each went."""
        gone: dict[str, Path] = {}
        for d in sorted((self.data_dir / "functions").glob("*/*/*")):
            fqfn = "/".join(d.relative_to(self.data_dir / "functions").parts)
            if d.is_dir() and fqfn not in keep:
                gone[fqfn] = self._to_trash(d)
        return gone

    def _to_trash(self, d: Path) -> Path:
        trash = self._trash_dir() / uuid.uuid4().hex
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.replace(d, trash)
        return trash

    def _trash_dir(self) -> Path:
        return self.data_dir / "deleted"
