"""Scaling policies. Built-ins register through the entry-point group `pulsar_autoscale.policies`,
exactly like a third-party plugin; a user's policy can also be loaded from a .py file path.

Entry points are loaded one at a time, on demand: a plugin that is broken or not there yet
makes only its own name fail, never the others.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Mapping

from pulsar_autoscale.errors import ConfigError

from .base import Policy, Proposal

GROUP = "pulsar_autoscale.policies"
__all__ = ["GROUP", "Policy", "Proposal", "available_policies", "load_policy"]


def available_policies() -> list[str]:
    """Names registered in the entry-point group (registered, not necessarily importable)."""
    return sorted({ep.name for ep in entry_points(group=GROUP)})


def load_policy(spec: str, params: Mapping[str, Any] | None = None) -> Policy:
    """`spec` is an entry-point name (threshold, queueing, ds2, ...) or a path to a .py file."""
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        cls = _class_from_file(Path(spec))
    else:
        cls = _class_from_entry_point(spec)
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise ConfigError(f"policy {spec!r} resolves to {cls!r}, not a subclass of "
                          f"pulsar_autoscale.policies.Policy")
    return cls.from_params(params)


def _class_from_entry_point(name: str) -> object:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        raise ConfigError(f"unknown policy {name!r}: available {', '.join(available_policies())}, "
                          f"or a path to a .py file")
    try:
        return found[0].load()
    except Exception as exc:
        raise ConfigError(f"policy {name!r} ({found[0].value}) failed to load: "
                          f"{type(exc).__name__}: {exc}") from exc


def _class_from_file(path: Path) -> object:
    if not path.is_file():
        raise ConfigError(f"policy file {path} does not exist")
    # one module per file, even for two files with the same name in different folders
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"_pulsar_autoscale_user_policy_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module   # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ConfigError(f"policy file {path} raised on import: {type(exc).__name__}: {exc}") from exc
    if hasattr(module, "POLICY"):
        return module.POLICY
    found = [obj for _, obj in inspect.getmembers(module, inspect.isclass)
             if issubclass(obj, Policy) and not inspect.isabstract(obj) and obj.__module__ == module_name]
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise ConfigError(f"policy file {path} must define exactly one Policy subclass, or set "
                          f"POLICY = TheClass; found {len(found)} ({names})")
    return found[0]
