"""Validating a function's code before the worker accepts it: the import runs in a child process.

User code runs at import. Importing it in the worker would let it kill the worker (`os._exit`), hang
the request that creates it (`time.sleep`) or leave a module half-imported in the worker's interpreter.
A child process with a timeout takes all of that: the worker learns only whether `load_callable` found
a usable entry point, or why not (an exception, an exit code, a timeout).

The child starts with a clean environment (no credential variables) and drops to the instance user
(functions/instance/instance_user.py) before it imports the code: what the code can read there (the
worker's command line, its key files, its environment) is what the instance user can read, and what it
prints in an error reaches the caller's 400.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from pulsar_autoscale.functions.instance.instance_user import InstanceUser, enter
from pulsar_autoscale.functions.instance.loader import INSTALLED_MODULES, FunctionLoadError, load_callable, load_serde

VALIDATE_TIMEOUT_S = 30.0
_RESULT = "\x00pulsar-autoscale-validation "


def code_digest(path: str | None) -> str | None:
    """sha256 of the code file: the worker records it for code that passed validation."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None


def serde_names(cfg) -> list[str]:
    """The serde classes a FunctionConfig names (customSerdeInputs, outputSerdeClassName)."""
    return [n for n in [*cfg.customSerdeInputs.values(), cfg.outputSerdeClassName] if n]


def validate(
    class_name: str,
    py_file: str | None,
    installed_modules: Sequence[str] = INSTALLED_MODULES,
    timeout_s: float = VALIDATE_TIMEOUT_S,
    serdes: Sequence[str] = (),
    user: InstanceUser | None = None,
) -> None:
    """Import the code and resolve className (and the serde classes) in a child process, as `user` (default:
    InstanceUser.resolve(), nobody for a root worker); FunctionLoadError saying why it cannot run."""
    user = user or InstanceUser.resolve()
    py = str(Path(py_file).resolve()) if py_file else None
    cmd = [
        sys.executable,
        "-m",
        __name__,
        json.dumps(
            {
                "className": class_name,
                "py": py,
                "modules": list(installed_modules),
                "serdes": list(serdes),
                "user": [user.name, user.uid, user.gid, user.home],
            }
        ),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env=user.environment(),
        cwd="/",
        start_new_session=True,
    )  # its own group: a timeout kills what it started too
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise FunctionLoadError(f"className {class_name!r}: importing the code did not finish within {timeout_s:.0f} s") from None
    finally:
        _kill_group(proc)  # anything the code left running in its group
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        if line.startswith(_RESULT):
            reason = json.loads(line[len(_RESULT) :]).get("error")
            if reason:
                raise FunctionLoadError(reason)
            return
    tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    raise FunctionLoadError(
        f"className {class_name!r}: the code ended the process with exit code "
        f"{proc.returncode} while being imported{(': ' + tail[0][:300]) if tail[0] else ''}"
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _main(arg: str) -> None:
    req = json.loads(arg)
    py = enter(InstanceUser(*req["user"]), req["py"])  # before the code is imported
    try:
        load_callable(req["className"], py, req["modules"])
        for serde in req.get("serdes", ()):
            load_serde(serde, py, req["modules"])
        result = {}
    except FunctionLoadError as exc:
        result = {"error": str(exc)}
    sys.stdout.flush()
    os.write(1, ("\n" + _RESULT + json.dumps(result) + "\n").encode())
    os._exit(0)  # no interpreter teardown: threads the code started must not keep the child alive


if __name__ == "__main__":
    _main(sys.argv[1])
