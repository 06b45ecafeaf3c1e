"""User data (YAML, JSON, plugin parameters) to typed dataclasses, with errors that name the field and the fix."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import fields
from typing import Any, Mapping

import yaml

from pulsar_autoscale.errors import ConfigError


def _accepts(tp, value) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:
        return isinstance(value, (list, tuple))
    base = origin or tp
    return isinstance(value, base) if isinstance(base, type) else True


def from_mapping(cls, data: Mapping[str, Any], source: str):
    """Build a dataclass from user data: unknown keys, missing keys and wrong types are named.
    The values of the class's SECRET_FIELDS are never quoted (a token written as a YAML number, say)."""
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    normalised = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(normalised) - set(known))
    if unknown:
        raise ConfigError(f"{source}: unknown option(s) {', '.join(unknown)}; valid options: {', '.join(known)}")
    missing = [
        n
        for n, f in known.items()
        if n not in normalised and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{source}: missing required option(s) {', '.join(missing)}")
    for name, value in normalised.items():
        if not _accepts(hints[name], value):
            shown = "(a secret, not shown)" if name in getattr(cls, "SECRET_FIELDS", ()) else repr(value)
            raise ConfigError(
                f"{source}: option {name} = {shown} has the wrong type (expected {getattr(hints[name], '__name__', hints[name])})"
            )
        if typing.get_origin(hints[name]) is tuple:
            normalised[name] = tuple(value)
    return cls(**normalised)


def parse_params(items: list[str]) -> dict:
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param {item!r} must be KEY=VALUE")
        try:
            params[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--param {item!r}: value is not valid YAML: {exc}") from exc
    return params
