"""Who user code runs as: the instance user (`--instance-user`), with a clean environment.

A process-runtime instance, a warm standby and the validation child import user code; before that, each
drops to the instance user (setgroups([]), setgid, setuid) and keeps none of the worker's credentials in
its environment. The instance user cannot read the worker's data dir (0700), its key files (0600) or
another process's memory and environment; what a child needs from the worker's files it opens before
the drop (its code's directory, its state file, its broker connection) and keeps as open files.

The interpreter's own library may be unreachable for the instance user (a pyenv under /root, 0700):
every directory on sys.path is opened before the drop and reached through /proc/self/fd afterwards (and
each loaded package's own directory where the instance user may not pass through its sys.path entry's,
as in a checkout whose root is 0700), so imports keep working without granting the instance user the path.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import pwd
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from pulsar_autoscale.errors import ConfigError

# Variables a child never gets: anything named like a credential, and the project's own settings.
CREDENTIAL_WORDS = ("TOKEN", "SECRET", "KEY", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL", "COOKIE")
PROJECT_PREFIXES = ("PULSAR_AUTOSCALE_", "PULSAR_AUTH", "PULSAR_TLS")
PR_SET_DUMPABLE = 4
# per-function uids when tenant admins are configured under a root worker: far above the ids of real users and
# of the system's dynamic users (61184-65519)
DEFAULT_UIDS = range(2_000_000_000, 2_000_100_000)
KEPT = (
    "PATH",
    "PYTHONPATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "PYTHONHASHSEED",
    "PYTHONIOENCODING",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "TMPDIR",
    "VIRTUAL_ENV",
    "LD_LIBRARY_PATH",
    "JAVA_HOME",
)


@dataclass(frozen=True)
class InstanceUser:
    name: str
    uid: int
    gid: int
    home: str

    @classmethod
    def resolve(cls, name: str | None = None) -> "InstanceUser":
        """`name` None: `nobody` for a root worker, else the worker's own user (no isolation possible)."""
        euid = os.geteuid()
        if name is None:
            name = "nobody" if euid == 0 else pwd.getpwuid(euid).pw_name
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            raise ConfigError(f"--instance-user {name!r}: no such user") from None
        if euid != 0 and entry.pw_uid != euid:
            raise ConfigError(
                f"--instance-user {name!r} needs a worker running as root (this one runs as "
                f"{pwd.getpwuid(euid).pw_name!r}, which cannot switch user)"
            )
        return cls(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)

    @property
    def isolated(self) -> bool:
        """Whether user code runs as another user than the worker's."""
        return self.uid != os.geteuid()

    def describe(self) -> str:
        """The start-up line."""
        if self.isolated:
            return f"user code runs as {self.name} (uid {self.uid}, gid {self.gid})"
        return (
            f"user code runs as the worker's own user {self.name}: it is not isolated from the worker's "
            "files (run the worker as root to give it --instance-user)"
        )

    def environment(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """What a child's environment keeps of `env` (default: this process's)."""
        return clean_environment(os.environ if env is None else env, self)


class InstanceUsers:
    """Whom each function's code runs as: one user for every function (`--instance-user`), or a uid and gid of
    its own per function (`--instance-uids FIRST-LAST`, the default under root when tenant admins are
    configured). Functions that share a user share what that user may do to its own processes: send them
    signals, and read files they create; a uid per function keeps one tenant's code from stopping another's
    instances. The uids need no account: a function gets the next free one of the range, for the worker's run."""

    def __init__(self, shared: InstanceUser, uids: range | None = None):
        if uids is not None:
            _check_uids(uids)
        self.shared, self.uids = shared, uids
        self._given: dict[str, int] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, name: str | None, uids: str | None, tenants: bool) -> "InstanceUsers":
        """The worker's flags: `--instance-user`, `--instance-uids`, and whether `--tenant-admin` is given."""
        if name is not None and uids is not None:
            raise ConfigError(
                "--instance-user and --instance-uids: give one (one user for every function, or a uid of its own per function)"
            )
        rng = (
            parse_uid_range(uids)
            if uids is not None
            else (DEFAULT_UIDS if tenants and name is None and os.geteuid() == 0 else None)
        )
        return cls(InstanceUser.resolve(name), rng)

    def of(self, fqfn: str) -> InstanceUser:
        if self.uids is None:
            return self.shared
        with self._lock:
            uid = self._given.get(fqfn)
            if uid is None:
                if len(self._given) >= len(self.uids):
                    raise ConfigError(f"--instance-uids: all {len(self.uids)} uids are given to functions; give a larger range")
                uid = self._given[fqfn] = self.uids[len(self._given)]
        return InstanceUser(f"uid {uid}", uid, uid, "/")

    def describe(self) -> str:
        """The start-up line."""
        if self.uids is None:
            return self.shared.describe()
        return (
            f"user code runs as a uid and gid of its own per function ({self.uids.start}-{self.uids.stop - 1}), "
            "apart from the worker and from other functions"
        )


def parse_uid_range(text: str) -> range:
    first, sep, last = text.partition("-")
    try:
        rng = range(int(first), int(last) + 1)
    except ValueError:
        rng = range(0)
    if not sep or not rng or rng.start < 1 or rng.stop > 2**32 - 1:
        raise ConfigError(
            f"--instance-uids {text!r} must be FIRST-LAST, uids from 1 to {2**32 - 2}, FIRST <= LAST (e.g. 2000000000-2000099999)"
        )
    return rng


def _check_uids(uids: range) -> None:
    """At start, not at the first instance: the worker must be root, and the system must let it take the range's
    uids (a user namespace may map only some)."""
    if os.geteuid() != 0:
        raise ConfigError(
            f"--instance-uids needs a worker running as root (this one runs as uid {os.geteuid()}, which cannot switch user)"
        )
    for uid in (uids.start, uids.stop - 1):
        probe = subprocess.run(
            [sys.executable, "-c", f"import os; os.setgroups([]); os.setgid({uid}); os.setuid({uid})"],
            capture_output=True,
            text=True,
            timeout=60,
            env={},
        )
        if probe.returncode != 0:
            reason = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
            raise ConfigError(
                f"--instance-uids: this worker cannot switch to uid {uid} ({reason}); a user namespace "
                "may map fewer uids: give a range it maps, or --instance-user NAME to run every "
                "function's code as one user"
            )


def clean_environment(env, user: InstanceUser) -> dict[str, str]:
    kept = {k: v for k, v in env.items() if k in KEPT and not is_credential(k)}
    kept.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
    return kept


def is_credential(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(PROJECT_PREFIXES) or any(word in upper for word in CREDENTIAL_WORDS)


def scrub_environment() -> None:
    """Drop credential variables from this process, including the copy the kernel shows as /proc/self/environ
    (the strings the process was started with, which a fork inherits)."""
    kept = {k: v for k, v in os.environ.items() if not is_credential(k)}
    os.environ.clear()
    os.environ.update(kept)  # new copies on the heap: nothing points into the start-up block any more
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])  # env_start, env_end (proc(5) fields 50, 51)
        if 0 < start < end:
            ctypes.memset(start, 0, end - start)
    except (OSError, ValueError, IndexError):
        pass


def enter(user: InstanceUser, code_path: str | None) -> str | None:
    """In a child, before user code is imported: a clean environment, sys.path kept reachable, then the
    instance user. Returns the code's path as the child reaches it afterwards, or None without code."""
    env = user.environment(dict(os.environ))
    os.environ.clear()
    os.environ.update(env)
    reached = None
    if code_path:
        # opened as the worker's user, reachable whatever its parents' modes: the code is then read through
        # the open directory (/proc/self/fd/N/<file>), which is also the working directory
        directory = os.open(Path(code_path).parent, os.O_RDONLY | os.O_DIRECTORY)
        os.fchdir(directory)
        reached = f"/proc/self/fd/{directory}/{Path(code_path).name}"
    else:
        os.chdir("/")
    if user.uid != os.geteuid():
        _reach_imports()
        os.setgroups([])
        os.setgid(user.gid)
        os.setuid(user.uid)
        if os.getuid() != user.uid or os.geteuid() != user.uid or os.getgid() != user.gid:
            raise PermissionError(f"could not switch to {user.name}")
        _not_dumpable()
    os.umask(0o077)
    return reached


def _not_dumpable() -> None:
    """Other processes of the instance user (other functions' instances) may not read this one's memory,
    environment or open files through /proc, whatever fs.suid_dumpable says (the kernel's own default for a
    process that switched user)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _others_may_pass(root: str, path: str) -> bool:
    """Whether any user may walk from `root` down to `path` (o+x on `root` and on each directory between): only
    then may `path` be reached through `root`'s open directory; else it needs one of its own (a checkout whose
    root is 0700 holds this project's packages, which the instance user may read)."""
    walk = [root]
    for part in path[len(root) + 1 :].split(os.sep)[:-1]:
        walk.append(os.path.join(walk[-1], part))
    try:
        return all(os.stat(d).st_mode & 0o001 for d in walk)
    except OSError:
        return False


def _reach_imports() -> None:
    """Each sys.path directory (and each loaded package's) opened now, reached as /proc/self/fd/N afterwards."""
    fds: dict[str, str] = {}

    def via_fd(path: str) -> str:
        if not isinstance(path, str) or not os.path.isabs(path):
            return path
        for root, alias in fds.items():
            if path == root or (path.startswith(root + os.sep) and _others_may_pass(root, path)):
                return alias + path[len(root) :]
        if not os.path.isdir(path):
            return path
        fds[path] = f"/proc/self/fd/{os.open(path, os.O_RDONLY | os.O_DIRECTORY)}"
        return fds[path]

    sys.path[:] = [via_fd(p) for p in sys.path]
    for module in list(sys.modules.values()):
        # a package may sit outside every sys.path directory (an editable install maps this project's packages
        # to the checkout, which may be 0700): its own directory is opened then
        paths = getattr(module, "__path__", None)
        if isinstance(paths, list):
            paths[:] = [via_fd(p) for p in paths]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
