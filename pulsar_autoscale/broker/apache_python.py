"""The interpreter Apache Pulsar's process runtime runs Python functions with: what it must be able to import,
and the `python3` shim the standalone finds first on its PATH."""

from __future__ import annotations

import subprocess

# What Pulsar's python instance (instances/python-instance) imports beyond the standard library and its own dir:
# pulsar-client[functions] brings them all.
PYTHON_INSTANCE_MODULES = ("pulsar", "google.protobuf", "grpc", "prometheus_client", "ratelimit", "bookkeeper")


def python_instance_missing(python: str) -> list[str]:
    """The modules of PYTHON_INSTANCE_MODULES that `python` cannot import (found by spec, nothing imported)."""
    code = (
        "import importlib.util as u, sys\n"
        "def ok(m):\n"
        "    try:\n        return u.find_spec(m) is not None\n"
        "    except ModuleNotFoundError:\n        return False\n"
        "print(' '.join(m for m in sys.argv[1:] if not ok(m)))"
    )
    try:
        done = subprocess.run([python, "-c", code, *PYTHON_INSTANCE_MODULES], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"(cannot run {python}: {exc})"]
    return done.stdout.split() if done.returncode == 0 else [f"(cannot run {python}: {done.stderr.strip()[-200:]})"]


def python_shim(python: str) -> str:
    """`python3` for the process runtime: execs `python` with a parent-death signal set first, so the function
    instances Pulsar spawns die with the JVM (without it, a SIGKILLed standalone leaves them running, reparented
    to init); one that finds its parent already gone exits."""
    boot = (
        "import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
        "os.getppid() == 1 and sys.exit(1); os.execv(sys.argv[1], sys.argv[1:])"
    )
    return f'#!/bin/sh\nexec "{python}" -c "{boot}" "{python}" "$@"\n'
