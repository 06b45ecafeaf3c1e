"""Scaling policies. Built-ins register through the entry-point group `pulsar_autoscale.policies`,
exactly like a third-party plugin; a user's policy can also be loaded from a .py file path.

Entry points are loaded one at a time, on demand: a plugin that is broken or not there yet
makes only its own name fail, never the others.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import sys
import traceback
from importlib.abc import Loader
from importlib.machinery import ModuleSpec
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Mapping, cast

from pulsar_autoscale.errors import ConfigError

from .base import Policy, Proposal

GROUP = "pulsar_autoscale.policies"
__all__ = ["GROUP", "Policy", "Proposal", "available_policies", "check_policy_class", "load_policy"]


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
        raise ConfigError(f"policy {spec!r} resolves to {cls!r}, not a subclass of pulsar_autoscale.policies.Policy")
    check_policy_class(cls)
    try:
        return cls.from_params(params)
    except ConfigError:
        raise
    except Exception as exc:  # the plugin's own __init__ or Config raised: point at its line
        raise ConfigError(
            f"{_where(cls)}: building {cls.__name__} from parameters {dict(params or {})!r} raised "
            f"{type(exc).__name__}: {exc}{_raised_at(exc)}"
        ) from exc


DECIDE_PARAMETERS = ("graph", "snapshot", "current", "state")


def check_policy_class(cls: type) -> None:
    """What the controller will call, checked at load so a mistake is reported at its line in the
    plugin's file (not later, inside the autoscaler): `name`, `decide`'s signature, `Config`."""
    where = _where(cls)
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(
            f'{where}: class {cls.__name__} needs a class attribute name = "..." (a non-empty '
            f"string naming the policy in logs and decisions), got {name!r}"
        )
    if inspect.isabstract(cls):
        raise ConfigError(f"{where}: class {cls.__name__} does not define decide(self, graph, snapshot, current, state)")
    decide = inspect.getattr_static(cls, "decide")
    if isinstance(decide, (staticmethod, classmethod)) or not callable(decide):
        raise ConfigError(
            f"{_where(getattr(decide, '__func__', decide))}: {cls.__name__}.decide must be a plain method "
            f"decide(self, graph, snapshot, current, state)"
        )
    try:
        inspect.signature(decide).bind(None, *DECIDE_PARAMETERS)
    except TypeError:
        raise ConfigError(
            f"{_where(decide)}: {cls.__name__}.decide{inspect.signature(decide)} cannot be called "
            f"as decide(self, graph, snapshot, current, state)"
        ) from None
    config = getattr(cls, "Config", None)
    if not (isinstance(config, type) and dataclasses.is_dataclass(config)):
        raise ConfigError(
            f"{where}: {cls.__name__}.Config must be a @dataclass of the policy's parameters "
            f"(or left out), got {getattr(config, '__name__', repr(config))}"
        )


def _where(obj: object) -> str:
    """file:line of a class or function, for messages that point into the user's file."""
    source = cast(Any, obj)  # inspect raises TypeError for objects without source, handled below
    try:
        return f"{inspect.getsourcefile(source)}:{inspect.getsourcelines(source)[1]}"
    except (OSError, TypeError):
        return getattr(obj, "__module__", None) or repr(obj)


def _raised_at(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    return f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""


def _class_from_entry_point(name: str) -> object:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        raise ConfigError(f"unknown policy {name!r}: available {', '.join(available_policies())}, or a path to a .py file")
    try:
        return found[0].load()
    except Exception as exc:
        raise ConfigError(f"policy {name!r} ({found[0].value}) failed to load: {type(exc).__name__}: {exc}") from exc


def _class_from_file(path: Path) -> object:
    if not path.is_file():
        raise ConfigError(f"policy file {path} does not exist")
    # one module per file, even for two files with the same name in different folders
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"_pulsar_autoscale_user_policy_{digest}"
    # no spec (a suffix no loader handles) fails in module_from_spec, as it always has
    spec = cast(ModuleSpec, importlib.util.spec_from_file_location(module_name, path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    try:
        cast(Loader, spec.loader).exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        at = f" at {exc.filename}:{exc.lineno}" if isinstance(exc, SyntaxError) else _raised_at(exc)
        raise ConfigError(f"policy file {path} raised on import: {type(exc).__name__}: {exc}{at}") from exc
    if hasattr(module, "POLICY"):
        return module.POLICY
    defined = [
        obj for _, obj in inspect.getmembers(module, inspect.isclass) if issubclass(obj, Policy) and obj.__module__ == module_name
    ]
    found = [obj for obj in defined if not inspect.isabstract(obj)] or defined[:1] * (len(defined) == 1)
    if len(found) != 1:
        names = ", ".join(c.__name__ for c in found) or "none"
        raise ConfigError(
            f"policy file {path} must define exactly one Policy subclass, or set POLICY = TheClass; found {len(found)} ({names})"
        )
    return found[0]
