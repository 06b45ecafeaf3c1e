"""Apache Pulsar's binary distribution, from Maven Central to an unpacked tree in the user's cache directory.

`org.apache.pulsar:pulsar-server-distribution:<version>:tar.gz:bin` is fetched with `mvn dependency:copy`,
checked against the .sha1 Maven keeps beside it, and unpacked once, under a file lock and by the rename of a
fully unpacked temp dir, so concurrent test processes share one tree and a killed unpack leaves nothing a later
run would trust.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pulsar_autoscale.errors import BrokerError

log = logging.getLogger(__name__)
APP = "pulsar-autoscale"
# The newest 4.0.x (LTS) release on Maven Central when this was written; override with version= or the env.
DEFAULT_VERSION = "4.0.8"
VERSION_ENV = "PULSAR_AUTOSCALE_APACHE_VERSION"
GROUP, ARTIFACT = "org.apache.pulsar", "pulsar-server-distribution"
MVN_TIMEOUT_S = 1800.0


def artifact(version: str) -> str:
    return f"{GROUP}:{ARTIFACT}:{version}:tar.gz:bin"


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/pulsar-autoscale/apache-pulsar` (default ~/.cache/...): re-fetchable, never user data."""
    base = os.environ.get("XDG_CACHE_HOME") or ""
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / APP / "apache-pulsar"


def require_tools(*tools: str) -> None:
    """One line naming what is missing, before anything is downloaded or spawned."""
    why = {"java": "Java 17+ runs Apache Pulsar", "mvn": "Maven fetches the Pulsar distribution"}
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise BrokerError(
            "Apache Pulsar needs " + " and ".join(f"`{t}` on PATH ({why.get(t, 'required')})" for t in missing) + ": not found"
        )


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive flock: two test processes never fetch or unpack the same version at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _m2_sha1(version: str) -> str | None:
    """The .sha1 Maven downloaded beside the artifact in the local repository, if it kept one."""
    name = f"{ARTIFACT}-{version}-bin.tar.gz.sha1"
    f = Path.home() / ".m2" / "repository" / GROUP.replace(".", "/") / ARTIFACT / version / name
    try:
        return f.read_text().split()[0].strip().lower()
    except (OSError, IndexError):
        return None


def _sha1(path: Path) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fetch(version: str, into: Path) -> Path:
    """`mvn dependency:copy` of the distribution into `into`; the tarball's path."""
    cmd = ["mvn", "-q", "-B", "dependency:copy", f"-Dartifact={artifact(version)}", f"-DoutputDirectory={into}"]
    log.info("fetching %s through Maven", artifact(version))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=MVN_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise BrokerError(f"mvn did not fetch {artifact(version)} within {MVN_TIMEOUT_S:.0f}s") from None
    tarball = into / f"{ARTIFACT}-{version}-bin.tar.gz"
    if done.returncode != 0 or not tarball.is_file():
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        err = next((ln for ln in lines if "ERROR" in ln), lines[-1] if lines else f"exit {done.returncode}")
        raise BrokerError(
            f"mvn could not fetch {artifact(version)} (unknown version, or no access to Maven Central?): {err.strip()[:300]}"
        )
    return tarball


def ensure_distribution(version: str | None = None) -> Path:
    """PULSAR_HOME of `version`, fetched, verified and unpacked once under the cache directory.

    The tree appears by a rename of a fully unpacked temp dir, so a killed fetch or unpack never
    leaves a half tree that a later run would trust.
    """
    version = version or os.environ.get(VERSION_ENV) or DEFAULT_VERSION
    vdir = cache_root() / version
    home = vdir / "dist"
    if (home / "bin" / "pulsar").is_file():
        return home
    require_tools("java", "mvn")
    with _locked(vdir / ".lock"):
        if (home / "bin" / "pulsar").is_file():  # another process finished it while we waited
            return home
        work = Path(tempfile.mkdtemp(prefix=".unpack-", dir=vdir))
        try:
            tarball = _fetch(version, work)
            expected = _m2_sha1(version)
            if expected is not None and _sha1(tarball) != expected:
                raise BrokerError(
                    f"{tarball.name}: sha1 differs from Maven's {expected} (corrupt download?); delete it from ~/.m2 and retry"
                )
            if expected is None:
                log.warning("no .sha1 for %s in ~/.m2: only checking that it unpacks with bin/pulsar", tarball.name)
            out = work / "tree"
            out.mkdir()
            done = subprocess.run(["tar", "xzf", str(tarball), "-C", str(out)], capture_output=True, text=True)
            tops = [p for p in out.iterdir() if (p / "bin" / "pulsar").is_file()] if done.returncode == 0 else []
            if not tops:
                raise BrokerError(
                    f"{tarball.name} is not a Pulsar distribution (no bin/pulsar after unpacking): "
                    f"{done.stderr.strip()[:200] or 'tar failed'}"
                )
            tops[0].rename(home)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return home
