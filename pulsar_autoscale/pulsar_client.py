"""Every Pulsar client the project opens, with the cluster's authentication and TLS settings.

One place so that a secured cluster needs its settings given once (worker, the controller's
leader election, Spark source and sink, burst drains, CLI). The names are pulsar-admin's and
pulsar-client's: `--auth-plugin`/`--auth-params`, `--tls-trust-cert-path`, ...
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import pulsar
import requests

from pulsar_autoscale.errors import ConfigError

TOKEN_PLUGINS = ("token", "org.apache.pulsar.client.impl.auth.AuthenticationToken")
TLS_PLUGINS = ("tls", "org.apache.pulsar.client.impl.auth.AuthenticationTls")


@dataclass(frozen=True)
class ClientSettings:
    service_url: str
    auth_plugin: str | None = None          # token or tls (Pulsar's class names work too)
    auth_params: str | None = None          # token: "token:XXX", "file:/path" or the bare token; tls: "tlsCertFile:..,tlsKeyFile:.."
    tls_trust_certs_file_path: str | None = None
    tls_allow_insecure_connection: bool = False
    tls_validate_hostname: bool = False

    SECRET_FIELDS = ("auth_params",)

    @classmethod
    def of(cls, settings: "ClientSettings | str") -> "ClientSettings":
        return settings if isinstance(settings, ClientSettings) else cls(settings)

    def __repr__(self) -> str:  # auth_params is a credential: never in logs or errors
        return (f"ClientSettings(service_url={self.service_url!r}, auth_plugin={self.auth_plugin!r}, "
                f"auth_params={'***' if self.auth_params else None})")

    def authentication(self) -> pulsar.Authentication | None:
        if not self.auth_plugin:
            return None
        if self.auth_plugin in TOKEN_PLUGINS:
            return pulsar.AuthenticationToken(_token(self.auth_params))
        return pulsar.AuthenticationTLS(*self._tls_files())

    def _tls_files(self) -> tuple[str, str]:
        if self.auth_plugin not in TLS_PLUGINS:
            raise ConfigError(f"auth plugin {self.auth_plugin!r} is not supported: use token or tls "
                              f"({TOKEN_PLUGINS[1]} or {TLS_PLUGINS[1]})")
        parts = dict(p.split(":", 1) for p in (self.auth_params or "").split(",") if ":" in p)
        if "tlsCertFile" not in parts or "tlsKeyFile" not in parts:
            raise ConfigError("auth plugin tls needs auth params tlsCertFile:PATH,tlsKeyFile:PATH")
        return parts["tlsCertFile"], parts["tlsKeyFile"]

    def http_session(self) -> requests.Session:
        """The same credentials and trust for an HTTP admin API (pulsar-admin's --auth-plugin over REST)."""
        session = _TrustSession()
        session.verify = False if self.tls_allow_insecure_connection else (self.tls_trust_certs_file_path or True)
        if self.auth_plugin in TOKEN_PLUGINS:
            session.headers["Authorization"] = f"Bearer {_token(self.auth_params)}"
        elif self.auth_plugin:
            session.cert = self._tls_files()
        return session

    def bearer_token(self) -> str | None:
        """The token of token authentication (for the admin REST API's Authorization header), else None."""
        return _token(self.auth_params) if self.auth_plugin in TOKEN_PLUGINS else None

    def client_kwargs(self) -> dict:
        kwargs: dict = {"tls_allow_insecure_connection": self.tls_allow_insecure_connection,
                        "tls_validate_hostname": self.tls_validate_hostname}
        auth = self.authentication()
        if auth is not None:
            kwargs["authentication"] = auth
        if self.tls_trust_certs_file_path:
            kwargs["tls_trust_certs_file_path"] = self.tls_trust_certs_file_path
        return kwargs


class _TrustSession(requests.Session):
    """A session whose own `verify` (the trusted CA) wins over REQUESTS_CA_BUNDLE, which requests otherwise
    prefers (requests issue 3829)."""

    def request(self, method, url, *args, **kwargs):
        kwargs.setdefault("verify", self.verify)
        return super().request(method, url, *args, **kwargs)


def _token(params: str | None) -> str:
    """Pulsar's token auth params: "token:XXX", "file:///path" / "file:/path", or the bare token."""
    if not params:
        raise ConfigError("auth plugin token needs auth params: token:XXX, file:/path/to/token or the token itself")
    if params.startswith("token:"):
        return params[len("token:"):]
    if params.startswith("file:"):
        path = params[len("file:"):].removeprefix("//")
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {path}: {exc.strerror}") from exc
    return params


def open_client(settings: ClientSettings | str, log_level: pulsar.LoggerLevel = pulsar.LoggerLevel.Error,
                client_class: type[pulsar.Client] = pulsar.Client, **kwargs) -> pulsar.Client:
    """A pulsar.Client (or client_class) with the settings' auth and TLS; kwargs are pulsar.Client's
    (operation_timeout_seconds, ...)."""
    settings = ClientSettings.of(settings)
    return client_class(settings.service_url, logger=pulsar.ConsoleLogger(log_level),
                        **{**settings.client_kwargs(), **kwargs})


def add_client_arguments(p: argparse.ArgumentParser, service_url_required: bool = True) -> None:
    """pulsar-admin's client flags, for every command that opens a Pulsar client."""
    p.add_argument("--service-url", required=service_url_required, help="broker URL, e.g. pulsar://127.0.0.1:6650")
    add_auth_arguments(p)


def add_auth_arguments(p: argparse.ArgumentParser) -> None:
    """Credentials and trust, for a Pulsar client or an admin REST client."""
    p.add_argument("--auth-plugin", default=os.environ.get("PULSAR_AUTH_PLUGIN"),
                   help="token or tls (or Pulsar's class name); env PULSAR_AUTH_PLUGIN")
    p.add_argument("--auth-params", default=os.environ.get("PULSAR_AUTH_PARAMS"),
                   help="token:XXX, file:/path/to/token, or tlsCertFile:..,tlsKeyFile:..; env PULSAR_AUTH_PARAMS "
                        "(prefer the env or a file: a flag shows in ps)")
    p.add_argument("--tls-trust-cert-path", default=None, help="CA bundle that signed the server's certificate (broker, or worker for the REST API)")
    p.add_argument("--tls-allow-insecure-connection", action="store_true", help="accept any server certificate (tests only)")


def settings_from_args(args: argparse.Namespace, url: str | None = None) -> ClientSettings:
    """The settings the flags give; `url` in place of --service-url for an admin REST client."""
    return ClientSettings(url or args.service_url, getattr(args, "auth_plugin", None), getattr(args, "auth_params", None),
                          getattr(args, "tls_trust_cert_path", None),
                          getattr(args, "tls_allow_insecure_connection", False))
