"""Credentials out of what we show: URLs' user-info and function secrets."""

from __future__ import annotations

import re
from typing import Any, Mapping

MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")


def redact_url(text: str) -> str:
    """`http://user:pw@host/x` -> `http://***@host/x`, anywhere in a text (a URL, an error message)."""
    return _USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def redact_secrets(config: Mapping[str, Any]) -> dict:
    """A FunctionConfig dict with each `secrets` value masked (the names stay: a function's readers may see them)."""
    out = dict(config)
    if isinstance(out.get("secrets"), Mapping):
        out["secrets"] = {name: MASK for name in out["secrets"]}
    return out


def keep_masked_secrets(update: Mapping[str, Any], current: Mapping[str, Any]) -> dict:
    """An update whose `secrets` came from a redacted GET: a masked value keeps the stored one."""
    out = dict(update)
    new, old = out.get("secrets"), current.get("secrets")
    if isinstance(new, Mapping) and isinstance(old, Mapping):
        out["secrets"] = {k: (old[k] if v == MASK and k in old else v) for k, v in new.items()}
    return out
