"""Every Pulsar client the project opens, with the cluster's authentication and TLS settings.

One place so that a secured cluster needs its settings given once (worker, the controller's
leader election, Spark source and sink, burst drains, CLI). The names are pulsar-admin's and
pulsar-client's: `--auth-plugin`/`--auth-params`, `--tls-trust-cert-path`, ...
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import ssl
import threading
import time
from dataclasses import dataclass

import pulsar
import requests
import requests.adapters

from pulsar_autoscale.cliargs import env_default, global_options
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError

SERVICE_URL_ENV = "PULSAR_AUTOSCALE_SERVICE_URL"

TOKEN_PLUGINS = ("token", "org.apache.pulsar.client.impl.auth.AuthenticationToken")
TLS_PLUGINS = ("tls", "org.apache.pulsar.client.impl.auth.AuthenticationTls")


@dataclass(frozen=True)
class ClientSettings:
    service_url: str
    auth_plugin: str | None = None  # token or tls (Pulsar's class names work too)
    auth_params: str | None = None  # token: "token:XXX", "file:/path" or the bare token; tls: "tlsCertFile:..,tlsKeyFile:.."
    tls_trust_certs_file_path: str | None = None
    tls_allow_insecure_connection: bool = False
    tls_validate_hostname: bool = False

    SECRET_FIELDS = ("auth_params",)

    @classmethod
    def of(cls, settings: "ClientSettings | str") -> "ClientSettings":
        return settings if isinstance(settings, ClientSettings) else cls(settings)

    def __repr__(self) -> str:  # auth_params is a credential: never in logs or errors
        return (
            f"ClientSettings(service_url={self.service_url!r}, auth_plugin={self.auth_plugin!r}, "
            f"auth_params={'***' if self.auth_params else None})"
        )

    def authentication(self) -> pulsar.Authentication | None:
        if not self.auth_plugin:
            return None
        if self.auth_plugin in TOKEN_PLUGINS:
            return pulsar.AuthenticationToken(_token(self.auth_params))
        return pulsar.AuthenticationTLS(*self._tls_files())

    def _tls_files(self) -> tuple[str, str]:
        if self.auth_plugin not in TLS_PLUGINS:
            raise ConfigError(
                f"auth plugin {self.auth_plugin!r} is not supported: use token or tls ({TOKEN_PLUGINS[1]} or {TLS_PLUGINS[1]})"
            )
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

    def trust_loaded_now(self) -> requests.Session:
        """A session with no credentials and this TLS trust read into memory now: for a process instance, which
        drops to a user that may not read the CA file before it makes its first call (requests would open the
        file at each connection)."""
        session = requests.Session()
        if self.tls_allow_insecure_connection:
            session.verify = False
        elif self.tls_trust_certs_file_path:
            try:
                context = ssl.create_default_context(cafile=self.tls_trust_certs_file_path)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"cannot read the TLS trust file {self.tls_trust_certs_file_path}: {exc}") from None
            session.mount("https://", _ContextAdapter(context))
        return session

    def bearer_token(self) -> str | None:
        """The token of token authentication (for the admin REST API's Authorization header), else None."""
        return _token(self.auth_params) if self.auth_plugin in TOKEN_PLUGINS else None

    def client_kwargs(self) -> dict:
        kwargs: dict = {
            "tls_allow_insecure_connection": self.tls_allow_insecure_connection,
            "tls_validate_hostname": self.tls_validate_hostname,
        }
        auth = self.authentication()
        if auth is not None:
            kwargs["authentication"] = auth
        if self.tls_trust_certs_file_path:
            kwargs["tls_trust_certs_file_path"] = self.tls_trust_certs_file_path
        return kwargs


class _ContextAdapter(requests.adapters.HTTPAdapter):
    """HTTPS through an SSL context made beforehand (its CAs already in memory)."""

    def __init__(self, context: ssl.SSLContext):
        self._context = context
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["ssl_context"] = self._context
        return super().init_poolmanager(*args, **kwargs)

    def cert_verify(self, conn, url, verify, cert):
        """Verify against the context alone: requests would also load a CA bundle (REQUESTS_CA_BUNDLE's or
        certifi's file), which adds trust the session was not given and which the instance user may not be able
        to read."""
        if verify is not False and url.lower().startswith("https"):
            super().cert_verify(conn, url, False, cert)  # the client certificate, if any
            conn.cert_reqs = "CERT_REQUIRED"
        else:
            super().cert_verify(conn, url, verify, cert)


class _TrustSession(requests.Session):
    """A session whose own `verify` (the trusted CA) wins over REQUESTS_CA_BUNDLE, which requests otherwise
    prefers (https://github.com/psf/requests/issues/3829)."""

    def request(self, method, url, *args, **kwargs):
        kwargs.setdefault("verify", self.verify)
        return super().request(method, url, *args, **kwargs)


def _token(params: str | None) -> str:
    """Pulsar's token auth params: "token:XXX", "file:///path" / "file:/path", or the bare token."""
    if not params:
        raise ConfigError("auth plugin token needs auth params: token:XXX, file:/path/to/token or the token itself")
    if params.startswith("token:"):
        return params[len("token:") :]
    if params.startswith("file:"):
        path = params[len("file:") :].removeprefix("//")
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {path}: {exc.strerror}") from exc
    return params


CLIENT_LOGGER = "pulsar_autoscale.pulsar"
REPEAT_S = 60.0  # the same client line again within this long is counted, not logged
_LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) \[[^]]*\] (?P<where>[^ |]*) \| (?P<message>.*)$")
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING, "ERROR": logging.ERROR}


class _ClientLog:
    """The C++ client's log lines, into our logging (logger `pulsar_autoscale.pulsar`). The client writes
    them, filtered by level in C++, to a pipe that a thread of ours reads: a Python logger given to the client
    would be called, under the GIL, for each of its per-message debug lines. A line that repeats (a broker
    that refuses connections: one per retry) is logged once per REPEAT_S with how often it came."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}  # line without its digits -> (last logged, repeats since)

    def path(self) -> str:
        with self._lock:
            if self._path is None:
                read_fd, write_fd = os.pipe()
                threading.Thread(target=self._read, args=(read_fd,), name="pulsar-client-log", daemon=True).start()
                self._path = f"/dev/fd/{write_fd}"
            return self._path

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "r", errors="replace") as lines:
            for line in lines:
                self.emit(line.rstrip("\n"), time.monotonic())

    def emit(self, line: str, now: float) -> None:
        m = _LINE.match(line)
        level, message = (_LEVELS.get(m["level"], logging.WARNING), m["message"]) if m else (logging.WARNING, line)
        key = re.sub(r"\d+", "#", message)
        last, repeats = self._seen.get(key, (None, 0))
        if last is not None and now - last < REPEAT_S:
            self._seen[key] = (last, repeats + 1)
            return
        self._seen[key] = (now, 0)
        more = f" (and {repeats} more like it in {REPEAT_S:.0f} s)" if repeats else ""
        logging.getLogger(CLIENT_LOGGER).log(level, "%s%s", message, more)


_client_log = _ClientLog()


def open_client(
    settings: ClientSettings | str,
    log_level: pulsar.LoggerLevel = pulsar.LoggerLevel.Warn,
    client_class: type[pulsar.Client] = pulsar.Client,
    **kwargs,
) -> pulsar.Client:
    """A pulsar.Client (or client_class) with the settings' auth and TLS, its log lines at `log_level` and
    above through our logging; kwargs are pulsar.Client's (operation_timeout_seconds, ...)."""
    settings = ClientSettings.of(settings)
    return client_class(settings.service_url, logger=client_logger(log_level), **{**settings.client_kwargs(), **kwargs})


def client_logger(log_level: pulsar.LoggerLevel = pulsar.LoggerLevel.Warn) -> pulsar.FileLogger:
    """The `logger=` for a pulsar.Client that writes its lines into our logging (see _ClientLog)."""
    return pulsar.FileLogger(log_level, _client_log.path())


def broker_error(service_url: str, exc: Exception) -> PulsarAutoscaleError:
    """A client call that failed, as one line: which broker, what happened, what to check."""
    return PulsarAutoscaleError(
        f"the broker at {service_url} did not answer ({type(exc).__name__}: {exc}): is it running, and is "
        f"--service-url (env {SERVICE_URL_ENV}) right? with credentials, check --auth-plugin/--auth-params"
    )


def add_client_arguments(p: argparse.ArgumentParser, service_url_required: bool = True) -> None:
    """pulsar-admin's client flags, for every command that opens a Pulsar client."""
    add_service_url(p, service_url_required)
    add_auth_arguments(p)


def add_service_url(p: argparse.ArgumentParser, required: bool = False) -> None:
    """--service-url; where it may be left out, $PULSAR_AUTOSCALE_SERVICE_URL or the caller's default applies."""
    global_options(p).add_argument(
        "--service-url",
        required=required,
        default=None if required else env_default(SERVICE_URL_ENV),
        help="broker URL, e.g. pulsar://127.0.0.1:6650" + ("" if required else f"; env {SERVICE_URL_ENV}"),
    )


def add_auth_arguments(p: argparse.ArgumentParser) -> None:
    """Credentials and trust, for a Pulsar client or an admin REST client."""
    g = global_options(p)
    g.add_argument(
        "--auth-plugin",
        default=env_default("PULSAR_AUTH_PLUGIN"),
        help="token or tls (or Pulsar's class name); env PULSAR_AUTH_PLUGIN",
    )
    g.add_argument(
        "--auth-params",
        default=env_default("PULSAR_AUTH_PARAMS"),
        help="token:XXX, file:/path/to/token, or tlsCertFile:..,tlsKeyFile:..; env PULSAR_AUTH_PARAMS "
        "(prefer the env or a file: a flag shows in ps)",
    )
    g.add_argument(
        "--tls-trust-cert-path",
        default=env_default("PULSAR_TLS_TRUST_CERT_PATH"),
        help="CA bundle that signed the server's certificate (broker, or worker for the REST API); "
        "env PULSAR_TLS_TRUST_CERT_PATH",
    )
    g.add_argument("--tls-allow-insecure-connection", action="store_true", help="accept any server certificate (tests only)")


def settings_from_args(args: argparse.Namespace, url: str | None = None) -> ClientSettings:
    """The settings the flags give; `url` in place of --service-url for an admin REST client."""
    return ClientSettings(
        url or args.service_url,
        getattr(args, "auth_plugin", None),
        getattr(args, "auth_params", None),
        getattr(args, "tls_trust_cert_path", None),
        getattr(args, "tls_allow_insecure_connection", False),
    )
