"""How our HTTP servers listen: TLS, request size limits, and no unauthenticated non-loopback bind.

``ServerSecurity`` is built from the same flags for `pulsar-autoscale worker` and `controller`
(``add_server_arguments``); ``make_server`` refuses what is unsafe before anything is bound, then serves with
``httpd.HTTPServer`` (cheroot behind a gate: slow or idle clients hold no thread, see ``ServerLimits``).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from dataclasses import dataclass

from flask import Flask, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from pulsar_autoscale.errors import ConfigError

from .guard import AccessPolicy, install_guard
from .httpd import HTTPServer, ServerLimits
from .tokens import TokenValidator

DEFAULT_MAX_REQUEST_MB = 64  # a function's .py and its config; anything larger is refused with 413
MAX_FORM_FIELD_BYTES = 1 << 20  # a functionConfig (or any other non-file form field) above 1 MiB: 413


def form_text(name: str) -> str | None:
    """A text part of a multipart request (a functionConfig, a state value), whether sent as a form field or as a
    file part. A file part is not held to the form-field limit by the HTTP layer, so the same limit is kept here:
    a config cannot walk around it by being sent as a file."""
    value = request.form.get(name)
    if value is not None or request.files.get(name) is None:
        return value
    limit = current_app.config.get("MAX_FORM_MEMORY_SIZE") or MAX_FORM_FIELD_BYTES
    data = request.files[name].read(limit + 1)
    if len(data) > limit:
        raise RequestEntityTooLarge(f"the part {name!r} is over {limit} bytes")
    return data.decode("utf-8", "replace")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSecurity:
    access: AccessPolicy | None = None  # None: no authentication (loopback only, or insecure_no_auth)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_MB << 20
    insecure_no_auth: bool = False  # allow a non-loopback bind without authentication
    limits: ServerLimits = ServerLimits()  # timeouts, thread pool, connection caps

    def __post_init__(self):
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("TLS needs both --tls-cert-file and --tls-key-file")
        for name in ("tls_cert_file", "tls_key_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"{name.replace('_', '-')} {path} does not exist")
        if self.max_request_bytes <= 0:
            raise ConfigError("the maximum request size must be > 0")

    def describe(self) -> str:
        """For a start-up banner: whether callers must authenticate and whether the API is served over TLS."""
        return (
            f"authentication {'on (tokens)' if self.access is not None else 'off'}, TLS {'on' if self.tls_cert_file else 'off'}"
        )

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert_file else "http"

    def check_bind(self, host: str) -> None:
        if self.access is None and not self.insecure_no_auth and not is_loopback(host):
            raise ConfigError(
                f"refusing to serve on {host} without authentication: anyone who reaches it could "
                f"run code. Give --token-secret-key or --token-public-key (docs/security.md), bind "
                f"127.0.0.1, or pass --insecure-no-auth"
            )

    def make_server(self, host: str, port: int, app: Flask) -> HTTPServer:
        """Bound on return (port 0: a free one, in ``server_port``); ``serve_forever()`` in a thread, ``shutdown()``."""
        self.check_bind(host)
        app.config["MAX_CONTENT_LENGTH"] = self.max_request_bytes
        app.config["MAX_FORM_MEMORY_SIZE"] = min(MAX_FORM_FIELD_BYTES, self.max_request_bytes)
        if self.access is not None:
            install_guard(app, self.access)
        tls = (self.tls_cert_file, self.tls_key_file) if self.tls_cert_file and self.tls_key_file else None
        return HTTPServer(host, port, app, self.limits, tls)

    # ---- command-line flags -----------------------------------------------------------------------------
    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ServerSecurity":
        access = None
        if args.token_secret_key or args.token_public_key:
            validator = TokenValidator.from_settings(
                args.token_secret_key,
                args.token_public_key,
                args.token_public_alg,
                args.token_auth_claim,
                args.token_audience,
                args.token_audience_claim,
            )
            access = AccessPolicy(
                validator, _roles(args.superuser_roles), _tenant_admins(args.tenant_admin), _roles(args.controller_roles)
            )
        elif args.superuser_roles or args.tenant_admin or args.controller_roles:
            raise ConfigError("roles were given but no token key: add --token-secret-key or --token-public-key")
        return cls(
            access, args.tls_cert_file, args.tls_key_file, int(args.max_request_size_mb * (1 << 20)), args.insecure_no_auth
        )


def _roles(text: str | None) -> frozenset[str]:
    return frozenset(r.strip() for r in (text or "").split(",") if r.strip())


def _tenant_admins(entries: list[str] | None) -> dict[str, frozenset[str]]:
    admins: dict[str, frozenset[str]] = {}
    for entry in entries or ():
        tenant, sep, roles = entry.partition("=")
        if not sep or not tenant.strip() or not _roles(roles):
            raise ConfigError(f"--tenant-admin {entry!r} must be TENANT=ROLE[,ROLE...]")
        admins[tenant.strip()] = admins.get(tenant.strip(), frozenset()) | _roles(roles)
    return admins


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    """Authentication, authorization and TLS of an HTTP server (Pulsar's broker.conf names, as flags)."""
    g = p.add_argument_group("security (docs/security.md)")
    g.add_argument(
        "--token-secret-key",
        default=os.environ.get("PULSAR_AUTOSCALE_TOKEN_SECRET_KEY"),
        help="validate HS256 tokens with this key: file:///path, data:;base64,... or env:VAR "
        "(Pulsar's tokenSecretKey; env PULSAR_AUTOSCALE_TOKEN_SECRET_KEY)",
    )
    g.add_argument(
        "--token-public-key",
        default=os.environ.get("PULSAR_AUTOSCALE_TOKEN_PUBLIC_KEY"),
        help="validate RS256/ES256 tokens with this public key (Pulsar's tokenPublicKey; env PULSAR_AUTOSCALE_TOKEN_PUBLIC_KEY)",
    )
    g.add_argument("--token-public-alg", default=None, help="only this algorithm with the public key (e.g. RS256)")
    g.add_argument("--token-auth-claim", default="sub", help="claim holding the role (Pulsar's tokenAuthClaim)")
    g.add_argument("--token-audience", default=None, help="required audience (Pulsar's tokenAudience)")
    g.add_argument("--token-audience-claim", default="aud", help="claim holding the audience (default aud)")
    g.add_argument("--superuser-roles", default=None, help="comma-separated roles that may do anything")
    g.add_argument(
        "--tenant-admin",
        action="append",
        default=None,
        metavar="TENANT=ROLE[,ROLE]",
        help="roles that administer a tenant's functions (repeat per tenant)",
    )
    g.add_argument(
        "--controller-roles", default=None, help="roles whose leader-epoch header is honoured (default: the superuser roles)"
    )
    g.add_argument("--tls-cert-file", default=None, help="serve HTTPS with this certificate (PEM) ...")
    g.add_argument("--tls-key-file", default=None, help="... and its private key (PEM)")
    g.add_argument(
        "--max-request-size-mb",
        type=float,
        default=DEFAULT_MAX_REQUEST_MB,
        help=f"refuse larger requests with 413 (default {DEFAULT_MAX_REQUEST_MB})",
    )
    g.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow binding a non-loopback address without authentication (never on a shared network)",
    )
