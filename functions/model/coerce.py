"""Strict types for config fields: each error names the field, the type it needs and what it got (so
`retainOrdering: "false"` is an error, not a truthy string)."""

from __future__ import annotations

from typing import Any, Mapping

from pulsar_autoscale.errors import ConfigError


def type_name(value: Any) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def wrong(name: str, want: str, value: Any) -> ConfigError:
    return ConfigError(f"{name} must be {want}, got {type_name(value)} {value!r:.80}")


def as_str(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise wrong(name, "a string", value)
    return value


def as_bool(name: str, value: Any) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise wrong(name, "a boolean (true or false)", value)
    return value


def as_int(name: str, value: Any, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong(name, "an integer", value)
    if not low <= value <= high:
        raise ConfigError(f"{name} must be an integer from {low} to {high}, got {value}")
    return value


def as_number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong(name, "a number", value)
    return float(value)


def as_object(name: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise wrong(name, "an object", value)
    return dict(value)


def as_str_map(name: str, value: Any) -> dict[str, str]:
    out = as_object(name, value)
    for k, v in out.items():
        as_str(f"{name}.{k}", v)
    return out


def as_enum(name: str, value: Any, allowed: tuple[str, ...], case_insensitive: bool = True) -> str | None:
    value = as_str(name, value)
    if value is None:
        return None
    for a in allowed:
        if value == a or (case_insensitive and value.upper() == a.upper()):
            return a
    raise ConfigError(f"{name} {value!r} is unknown: use one of {', '.join(allowed)}")


def is_empty(value: Any) -> bool:
    return value is None or value == "" or value == {} or value == []


def or_default(value, default):
    return default if value is None else value
