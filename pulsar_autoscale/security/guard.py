"""Who may call our HTTP servers: Pulsar's token authentication and tenant authorization, as a Flask hook.

Rules, the same on the worker and the controller:
- ``/healthz`` is open (liveness probes carry no credentials; it tells only that the process serves);
- every other path needs ``Authorization: Bearer <token>`` with a valid token: 401 otherwise;
- ``/metrics``: any authenticated role (Prometheus' scrape token need not be an admin);
- a path with a ``<tenant>`` (functions, stages): a superuser or an admin role of that tenant, else 403;
- any other path (worker cluster API, the controller's ``/status``): superusers only, else 403.

The leader-epoch header fences deposed controllers; only a controller role may send it
(``trusted_epoch``), so nobody else can raise the worker's epoch and lock the autoscaler out.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

from flask import Flask, current_app, g, jsonify, request

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.headers import EPOCH_HEADER

from .tokens import InvalidToken, TokenValidator

log = logging.getLogger(__name__)
OPEN_PATHS = frozenset({"/healthz"})
AUTHENTICATED_PATHS = frozenset({"/metrics"})
_EXTENSION = "pulsar_autoscale.access"
# app.extensions[CAPABILITY]: () -> True (the request carries a capability that lets it in), False (it carries
# one that does not: 403) or None (it carries none: the bearer token decides)
CAPABILITY = "pulsar_autoscale.capability"


@dataclass(frozen=True)
class AccessPolicy:
    """Pulsar's model: superuser roles do anything; a tenant's admin roles administer its functions."""

    validator: TokenValidator
    superuser_roles: frozenset[str] = frozenset()
    tenant_admins: Mapping[str, frozenset[str]] = field(default_factory=dict)  # tenant -> admin roles
    controller_roles: frozenset[str] = frozenset()  # may send the epoch header; empty: the superusers

    def __post_init__(self):
        if not self.superuser_roles and not any(self.tenant_admins.values()):
            raise ConfigError(
                "token authentication is on but no role may administer anything: "
                "give --superuser-roles and/or --tenant-admin TENANT=ROLE"
            )

    def may_administer(self, role: str, tenant: str | None) -> bool:
        return role in self.superuser_roles or (tenant is not None and role in self.tenant_admins.get(tenant, ()))

    def is_controller(self, role: str | None) -> bool:
        return role is not None and role in (self.controller_roles or self.superuser_roles)


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _deny(code: int, reason: str):
    resp = jsonify(reason=reason)
    resp.status_code = code
    if code == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="pulsar-autoscale"'
    return resp


def install_guard(app: Flask, policy: AccessPolicy) -> None:
    """Authenticate and authorize every request of `app` before its view runs."""
    app.extensions[_EXTENSION] = policy

    @app.before_request
    def _guard():
        if request.path in OPEN_PATHS:
            return None
        capability = current_app.extensions.get(CAPABILITY)
        verdict = capability() if capability is not None else None
        if verdict is not None:
            if verdict:
                return None
            log.info("403 on %s %r: a capability that does not open it", request.method, request.path)
            return _deny(403, "the capability sent does not open this path")
        token = bearer_token(request.headers.get("Authorization"))
        if token is None:
            return _deny(401, "authentication required: send Authorization: Bearer <token>")
        try:
            role = policy.validator.role(token)
        except InvalidToken as exc:
            log.info("401 on %s %r from %s: %s", request.method, request.path, request.remote_addr, exc)  # %r: no forged lines
            return _deny(401, f"authentication failed: {exc}")
        g.role = role
        if request.path in AUTHENTICATED_PATHS:
            return None
        tenant = (request.view_args or {}).get("tenant")
        if policy.may_administer(role, tenant):
            return None
        what = f"tenant {tenant!r}" if tenant is not None else "this endpoint (superusers only)"
        log.info("403 on %s %r: role %r", request.method, request.path, role)
        return _deny(403, f"role {role!r} is not authorized for {what}")


def tenant_admin_caller() -> bool:
    """Whether tenant admins are configured and the request's role is not a superuser (its code is untrusted)."""
    policy: AccessPolicy | None = current_app.extensions.get(_EXTENSION)
    return policy is not None and any(policy.tenant_admins.values()) and g.get("role") not in policy.superuser_roles


def trusted_epoch() -> int | None:
    """The leader epoch the request carries, if its sender may fence: any caller when the server has no
    authentication (loopback only), else only a controller role. Others' headers are ignored."""
    raw = request.headers.get(EPOCH_HEADER)
    if not raw:
        return None
    policy: AccessPolicy | None = current_app.extensions.get(_EXTENSION)
    if policy is not None and not policy.is_controller(g.get("role")):
        log.warning("ignoring %s from role %r: not a controller role", EPOCH_HEADER, g.get("role"))
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{EPOCH_HEADER} must be an integer") from None
