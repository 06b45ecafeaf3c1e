"""HTTP sessions for a Pulsar cluster's admin REST API: credentials, TLS and redirects done safely.

Auth modes follow KEDA's Pulsar scaler: ``none``, ``bearer`` (a token, or a file re-read when it
changes), ``basic``, ``tls`` (client certificate and key; a CA bundle may be given in any mode) and
``oauth2`` (client credentials against a token endpoint, the token cached until shortly before it
expires).

Pulsar's status/stats endpoints answer 307 to the worker or broker that owns the function or topic.
The ``requests`` library drops the Authorization header on a cross-host redirect, which turns such a
call into a 401. ``ClusterSession`` follows redirects itself: 307/308 keep method and body, 301/302/303
behave as in ``requests``, and credentials go only to the hosts of the configured cluster
(``allowed_hosts``, host:port). A redirect anywhere else is refused with an error naming the host;
it is never followed, so neither credentials nor the client certificate reach it.

Secrets are wrapped in ``Secret``: repr/str show ``***``; nothing here logs a header or a body.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, cast
from urllib.parse import urljoin, urlsplit

import requests

from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.errors import ConfigError

log = logging.getLogger(__name__)

AUTH_MODES = ("none", "bearer", "basic", "tls", "oauth2")
DEFAULT_MAX_REDIRECTS = 5
# Renew an OAuth2 token this long before it expires (or at 90% of its life, if that is sooner).
OAUTH2_EXPIRY_SKEW_S = 30.0


class AuthError(AdminError):
    """Credentials could not be obtained (token file unreadable, token endpoint refused, ...)."""


class RedirectRefused(AdminError):
    """The cluster redirected a call to a host outside the configured cluster."""


class Secret:
    """A string that never shows itself in repr, str, f-strings or logs; ``reveal()`` gives it."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        if not isinstance(value, str) or not value:
            raise ConfigError("a secret must be a non-empty string")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __eq__(self, other) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self):
        raise TypeError("a Secret is not serialised")


def host_port(url: str) -> str:
    """'host:port' of a URL, the port made explicit (80 for http, 443 for https)."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise ConfigError(f"{url!r} is not an absolute http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname.lower()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _normalise_host(entry: str) -> str:
    entry = entry.strip().lower()
    if "://" in entry:
        return host_port(entry)
    if entry.startswith("["):  # [v6]:port
        if "]:" not in entry:
            raise ConfigError(f"allowed host {entry!r} needs a port: [address]:port")
        return entry
    if entry.count(":") != 1 or not entry.rsplit(":", 1)[1].isdigit():
        raise ConfigError(f"allowed host {entry!r} must be host:port (e.g. pulsar-broker:8080) or a URL")
    return entry


def _read_secret_file(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            value = fh.read().strip()
    except OSError as exc:
        raise AuthError(f"cannot read the {what} file {path}: {exc.strerror}") from None
    if not value:
        raise AuthError(f"the {what} file {path} is empty")
    return value


@dataclass(frozen=True)
class AuthConfig:
    """How to authenticate to the cluster. Build it with ``AuthConfig.from_mapping`` from YAML."""

    mode: str = "none"
    token: Secret | None = None  # bearer: the token itself ...
    token_file: str | None = None  # ... or a file holding it (re-read when it changes)
    username: str | None = None  # basic
    password: Secret | None = None
    cert_file: str | None = None  # tls: client certificate (PEM)
    key_file: str | None = None  # tls: its private key (PEM)
    ca_file: str | None = None  # any mode: CA bundle to verify the cluster's certificate
    tls_allow_insecure: bool = False  # skip verifying the cluster's certificate (tests only)
    oauth2_token_url: str | None = None  # oauth2: token endpoint
    oauth2_client_id: str | None = None
    oauth2_client_secret: Secret | None = None
    oauth2_client_secret_file: str | None = None
    oauth2_scope: str | None = None
    oauth2_audience: str | None = None  # Pulsar's OAuth2 plugin sends an audience
    oauth2_params: Mapping[str, str] = field(default_factory=dict)  # extra form fields (KEDA endpointParams)

    SECRET_FIELDS = ("token", "password", "oauth2_client_secret")

    def __post_init__(self):
        if self.mode not in AUTH_MODES:
            raise ConfigError(f"auth mode {self.mode!r} is unknown: use one of {', '.join(AUTH_MODES)}")
        for name in self.SECRET_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Secret(value))
        need = {
            "bearer": (self.token or self.token_file, "bearer auth needs token or token_file"),
            "basic": (self.username and self.password, "basic auth needs username and password"),
            "tls": (self.cert_file and self.key_file, "tls auth needs cert_file and key_file"),
            "oauth2": (
                self.oauth2_token_url and self.oauth2_client_id and (self.oauth2_client_secret or self.oauth2_client_secret_file),
                "oauth2 auth needs oauth2_token_url, oauth2_client_id and oauth2_client_secret (or oauth2_client_secret_file)",
            ),
        }
        ok, message = need.get(self.mode, (True, ""))
        if not ok:
            raise ConfigError(message)
        if self.mode == "bearer" and self.token and self.token_file:
            raise ConfigError("bearer auth: give token or token_file, not both")
        for name in ("cert_file", "key_file", "ca_file"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ConfigError(f"auth {name} {path} does not exist")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, source: str = "auth") -> "AuthConfig":
        from pulsar_autoscale.configparse import from_mapping

        data = dict(data or {})
        for name in cls.SECRET_FIELDS:
            if isinstance(data.get(name), str):
                data[name] = Secret(data[name])
        return from_mapping(cls, data, source)


class _TokenFile:
    """A bearer token kept in a file (a Kubernetes projected token, say): re-read when the file changes."""

    def __init__(self, path: str):
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._token: Secret | None = None
        self._lock = threading.Lock()

    def get(self) -> str:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise AuthError(f"cannot read the token file {self.path}: {exc.strerror}") from None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp or self._token is None:
                self._token = Secret(_read_secret_file(self.path, "token"))
                self._stamp = stamp
                log.debug("token file %s (re)read", self.path)
            return self._token.reveal()


class _OAuth2ClientCredentials:
    """OAuth2 client-credentials grant; the access token is cached until shortly before it expires."""

    def __init__(self, auth: AuthConfig, timeout_s: float, clock=time.monotonic):
        self.auth = auth
        self.timeout_s = timeout_s
        self.clock = clock
        self._token: Secret | None = None
        self._expires_at = 0.0
        self._lock = threading.Lock()
        self._http = requests.Session()  # the issuer is not a cluster host: its own plain session
        self._http.verify = auth.ca_file or True
        self.fetches = 0

    def _secret(self) -> str:
        if self.auth.oauth2_client_secret:
            return self.auth.oauth2_client_secret.reveal()
        # AuthConfig requires oauth2_client_secret or oauth2_client_secret_file in oauth2 mode
        return _read_secret_file(cast(str, self.auth.oauth2_client_secret_file), "oauth2 client secret")

    def get(self) -> str:
        with self._lock:
            if self._token is not None and self.clock() < self._expires_at:
                return self._token.reveal()
            self._fetch()
            return cast(Secret, self._token).reveal()  # set by _fetch, or it raised

    def _fetch(self) -> None:
        url = cast(str, self.auth.oauth2_token_url)  # required by AuthConfig in oauth2 mode
        form = {
            "grant_type": "client_credentials",
            "client_id": self.auth.oauth2_client_id,
            "client_secret": self._secret(),
            **dict(self.auth.oauth2_params),
        }
        if self.auth.oauth2_scope:
            form["scope"] = self.auth.oauth2_scope
        if self.auth.oauth2_audience:
            form["audience"] = self.auth.oauth2_audience
        started = self.clock()
        try:
            resp = self._http.post(url, data=form, timeout=self.timeout_s, headers={"Accept": "application/json"})
        except requests.RequestException as exc:
            raise AuthError(f"cannot reach the OAuth2 token endpoint {url}: {type(exc).__name__}") from None
        self.fetches += 1
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code != 200 or not isinstance(body, dict) or not body.get("access_token"):
            detail = body.get("error_description") or body.get("error") if isinstance(body, dict) else None
            raise AuthError(
                f"the OAuth2 token endpoint {url} refused client {self.auth.oauth2_client_id!r} "
                f"({resp.status_code}{': ' + str(detail) if detail else ''})"
            )
        token_type = str(body.get("token_type", "bearer")).lower()
        if token_type != "bearer":
            raise AuthError(f"the OAuth2 token endpoint {url} issued a {token_type!r} token; only bearer works")
        try:
            lifetime = float(body.get("expires_in", 3600))
        except (TypeError, ValueError):
            raise AuthError(
                f"the OAuth2 token endpoint {url} answered expires_in {body.get('expires_in')!r}, not a number of seconds"
            ) from None
        self._token = Secret(str(body["access_token"]))
        self._expires_at = started + max(0.0, min(lifetime - OAUTH2_EXPIRY_SKEW_S, 0.9 * lifetime))
        log.debug("OAuth2 token fetched from %s, valid %.0fs", url, lifetime)


class ClusterSession(requests.Session):
    """A ``requests.Session`` that authenticates to the cluster's hosts and follows redirects safely."""

    def __init__(
        self,
        auth: AuthConfig | None = None,
        allowed_hosts=(),
        timeout_s: float = 30.0,
        max_redirects: int = DEFAULT_MAX_REDIRECTS,
    ):
        super().__init__()
        self.auth_config = auth or AuthConfig()
        self.allowed_hosts = frozenset(_normalise_host(h) for h in allowed_hosts)
        if not self.allowed_hosts:
            raise ConfigError("a cluster session needs at least one allowed host (host:port of the admin URL)")
        self.max_redirects = max_redirects
        a = self.auth_config
        self.verify = False if a.tls_allow_insecure else (a.ca_file or True)
        if a.mode == "tls":
            self.cert = (cast(str, a.cert_file), cast(str, a.key_file))  # both required by AuthConfig in tls mode
        self._token_file = _TokenFile(a.token_file) if a.mode == "bearer" and a.token_file else None
        self._oauth2 = _OAuth2ClientCredentials(a, timeout_s) if a.mode == "oauth2" else None
        self.redirects_followed = 0

    def __repr__(self) -> str:
        return f"ClusterSession(mode={self.auth_config.mode!r}, allowed_hosts={sorted(self.allowed_hosts)!r})"

    def allows(self, url: str) -> bool:
        try:
            return host_port(url) in self.allowed_hosts
        except ConfigError:
            return False

    def authorization(self) -> str | None:
        """The Authorization header value for the cluster, or None (tls/none)."""
        a = self.auth_config
        if a.mode == "bearer":
            # AuthConfig requires token, token_file or (basic) username and password, per mode
            token = self._token_file.get() if self._token_file else cast(Secret, a.token).reveal()
            return f"Bearer {token}"
        if a.mode == "basic":
            raw = f"{a.username}:{cast(Secret, a.password).reveal()}".encode()
            return "Basic " + base64.b64encode(raw).decode("ascii")
        if a.mode == "oauth2":
            return f"Bearer {cast(_OAuth2ClientCredentials, self._oauth2).get()}"
        return None

    def _authorize(self, prep: requests.PreparedRequest) -> None:
        prep.headers.pop("Authorization", None)
        value = self.authorization()
        if value is not None:
            prep.headers["Authorization"] = value

    def request(self, method, url, *args, allow_redirects: bool = True, **kwargs):  # noqa: D401
        if args:
            raise TypeError("ClusterSession.request takes keyword arguments after url")
        if not self.allows(url):
            raise RedirectRefused(
                f"{url} is not a host of the configured cluster ({', '.join(sorted(self.allowed_hosts))}); no request was sent"
            )
        send_kw: dict[str, Any] = {k: kwargs.pop(k) for k in ("timeout", "stream", "verify", "cert", "proxies") if k in kwargs}
        req = requests.Request(
            method=method.upper(),
            url=url,
            **{k: v for k, v in kwargs.items() if k in ("headers", "files", "data", "params", "json", "cookies", "hooks")},
        )
        unknown = set(kwargs) - {"headers", "files", "data", "params", "json", "cookies", "hooks"}
        if unknown:
            raise TypeError(f"ClusterSession.request got unsupported arguments {sorted(unknown)}")
        prep = self.prepare_request(req)
        # The configured CA must win over REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE, which requests prefers to a
        # session's verify (https://github.com/psf/requests/issues/3829): pass it explicitly.
        settings = self.merge_environment_settings(
            prep.url,
            send_kw.pop("proxies", {}),
            send_kw.pop("stream", None),
            send_kw.pop("verify", self.verify),
            send_kw.pop("cert", self.cert),
        )
        send_kw.update(settings)
        for _hop in range(self.max_redirects + 1):
            self._authorize(prep)
            resp = self.send(prep, allow_redirects=False, **send_kw)
            if not allow_redirects or not resp.is_redirect:
                return resp
            prep = self._next_hop(prep, resp)
        raise AdminError(
            f"{method.upper()} {url}: more than {self.max_redirects} redirects; "
            f"the cluster's workers or brokers redirect in a loop"
        )

    def _next_hop(self, prep: requests.PreparedRequest, resp: requests.Response) -> requests.PreparedRequest:
        target = urljoin(cast(str, prep.url), resp.headers["location"])  # a prepared request has its url
        resp.close()
        if not self.allows(target):
            raise RedirectRefused(
                f"{prep.method} {prep.url} was redirected ({resp.status_code}) to {host_port(target)}, which is "
                f"not a host of the configured cluster ({', '.join(sorted(self.allowed_hosts))}); refused, no "
                f"credentials sent. Add it to allowed_hosts if it belongs to the cluster."
            )
        nxt = prep.copy()
        nxt.prepare_url(target, None)
        # As requests does: 302 and 303 turn anything but HEAD into GET; 301 turns POST into GET.
        code, method = resp.status_code, prep.method
        if (code in (302, 303) and method != "HEAD") or (code == 301 and method == "POST"):
            nxt.method = "GET"
            nxt.body = None
            for h in ("Content-Type", "Content-Length", "Transfer-Encoding"):
                nxt.headers.pop(h, None)
        self.redirects_followed += 1
        log.debug("following %d from %s to %s", code, prep.url, target)
        return nxt


def cluster_session(urls, auth: AuthConfig | Mapping | None = None, extra_hosts=(), timeout_s: float = 30.0) -> ClusterSession:
    """A session for the cluster whose admin/broker URLs are ``urls`` (plus ``extra_hosts``, host:port)."""
    if isinstance(auth, Mapping) or auth is None:
        auth = AuthConfig.from_mapping(auth or {})
    hosts = []
    for u in urls:
        if not u:
            continue
        if urlsplit(u).username or urlsplit(u).password:
            raise ConfigError(f"{urlsplit(u).hostname}: put credentials in the auth settings, not in the URL")
        hosts.append(host_port(u))
    return ClusterSession(auth, [*hosts, *extra_hosts], timeout_s=timeout_s)
