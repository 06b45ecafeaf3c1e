"""controller.yaml: every option of the controller, validated with errors that name the field and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

import yaml

from pulsar_autoscale.admin.client import FunctionsAdmin, admin_urls
from pulsar_autoscale.admin.http_auth import AuthConfig, cluster_session
from pulsar_autoscale.admin.stock import StockPulsarAdmin
from pulsar_autoscale.configparse import from_mapping
from pulsar_autoscale.controller.burst_plan import BurstConfig
from pulsar_autoscale.controller.fast import FastConfig
from pulsar_autoscale.controller.warm_sizing import WarmPoolConfig
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.leader import DEFAULT_LOCK_TOPIC
from pulsar_autoscale.paths import user_data_dir
from pulsar_autoscale.pulsar_client import ClientSettings
from pulsar_autoscale.security.redact import redact_url

MODES = ("worker", "stock")
# what a reload cannot change: connections, identity and the HTTP listener are made once, at start
RESTART_OPTIONS = (
    "service_url",
    "admin_url",
    "mode",
    "http_host",
    "http_port",
    "lock_topic",
    "identity",
    "auth",
    "extra_hosts",
    "broker_admin_url",
    "worker_metrics_url",
    "fast",
)


@dataclass(frozen=True)
class ControllerConfig:
    service_url: str  # broker, for leader election
    admin_url: (
        str | tuple[str, ...]
    )  # Functions admin REST API (our worker, several workers of one cluster, or a stock Pulsar worker)
    metrics_url: str | None = None  # broker Prometheus /metrics (backlog, arrivals)
    mode: str = "worker"  # worker: restart-free; stock: every update restarts all instances
    namespaces: tuple[str, ...] = ("public/default",)
    # entry-point name or path to a .py file. predictive: the lowest p99 on the paper's workload at 1.13x the
    # clairvoyant bound's instance-seconds, 1.14x with the fast path (docs/policies.md)
    policy: str = "predictive"
    policy_params: dict = field(default_factory=dict)
    # Per-function policies (REST controls, a function's customRuntimeOptions) are named, never given as files:
    # an entry-point name, or NAME for NAME.py in this directory of plugins the operator trusts.
    policy_dir: str | None = None
    period_s: float = 30.0  # MAPE period (paper: 30 s)
    window_s: float = 30.0  # metrics window W (paper: 30 s)
    dry_run: bool = False  # recommend only: log decisions, apply nothing
    plan: dict = field(default_factory=dict)  # Plan step: min/max parallelism, bounds, cooldown, ... (PlanConfig)
    burst: dict = field(default_factory=dict)  # Spark burst drains asked of our worker (burst_plan.BurstConfig)
    # fast scale-out path (controller.fast.FastConfig): on unless `enabled: false`; period_s, window_s, ...
    fast: dict = field(default_factory=dict)
    warm_pool: dict = field(default_factory=dict)  # warm pools sized by the controller (warm_sizing.WarmPoolConfig)
    # Default under the user data dir ($XDG_DATA_HOME/pulsar-autoscale/controller/), never the current directory.
    decision_log: str | None = field(default_factory=lambda: str(user_data_dir("controller", "decisions.jsonl")))
    decision_log_max_bytes: int = 5_000_000  # rotated past this size (every evaluation is logged)
    decision_log_backups: int = 3  # rotated files kept: decisions.jsonl.1 .. .3
    http_host: str = "127.0.0.1"
    http_port: int = 9091  # /metrics and /status; 0 = a free port
    lock_topic: str = DEFAULT_LOCK_TOPIC
    identity: str | None = None  # replica name in logs and the decision log
    # The other controller replicas' HTTP URLs: the only places a standby forwards a `why` to (with this
    # controller's own credentials, never its caller's). A leader URL read from the broker is not trusted alone.
    peers: tuple[str, ...] = ()
    execute_retries: int = 3
    auth: dict = field(default_factory=dict, repr=False)  # cluster auth (http_auth.AuthConfig): bearer, basic, tls, oauth2
    client: dict = field(default_factory=dict, repr=False)  # broker client auth/TLS (pulsar_client.ClientSettings)
    extra_hosts: tuple[str, ...] = ()  # host:port a redirect may lead to that gets credentials too
    broker_admin_url: str | None = None  # stock mode: a broker's admin URL for topic stats (default admin_url)
    worker_metrics_url: str | None = None  # stock mode: the functions worker's /metrics (restart cost)

    SECRET_FIELDS = ("auth", "client")
    URL_FIELDS = ("admin_url", "metrics_url", "broker_admin_url", "worker_metrics_url")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "controller config") -> "ControllerConfig":
        return from_mapping(cls, data, source)

    @classmethod
    def from_file(cls, path: str | Path) -> "ControllerConfig":
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read {p}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{p} must be a YAML mapping of option: value")
        return cls.from_mapping(data, str(p))

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"mode {self.mode!r} is unknown: use one of {', '.join(MODES)}")
        for name in ("period_s", "window_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.decision_log_max_bytes < 1000 or self.decision_log_backups < 0:
            raise ConfigError(
                f"decision_log_max_bytes must be >= 1000 and decision_log_backups >= 0, got "
                f"{self.decision_log_max_bytes} and {self.decision_log_backups}"
            )
        for ns in self.namespaces:
            if ns.count("/") != 1:
                raise ConfigError(f"namespaces: {ns!r} must be tenant/namespace")
        if not self.service_url.startswith(("pulsar://", "pulsar+ssl://")):
            raise ConfigError(f"service_url {redact_url(self.service_url)!r} must start with pulsar:// or pulsar+ssl://")
        for url in self.admin_urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"admin_url {redact_url(url)!r} must start with http:// or https://")
        for name in self.URL_FIELDS:
            for url in admin_urls(getattr(self, name)) if getattr(self, name) else ():
                if urlsplit(url).password is not None:
                    raise ConfigError(f"{name}: put credentials in the auth section, not in the URL ({redact_url(url)})")
        AuthConfig.from_mapping(self.auth)  # a bad auth section fails at start, naming the field
        self.fast_config()  # a bad fast section fails at start, naming the field
        self.client_settings()
        if self.burst_config().enabled and self.mode == "stock":
            raise ConfigError("burst.enabled needs mode: worker: stock Pulsar workers cannot run a burst drain")
        if self.warm_pool_config().enabled and self.mode == "stock":
            raise ConfigError("warm_pool.enabled needs mode: worker: stock Pulsar workers keep no warm pool")

    @property
    def admin_urls(self) -> list[str]:
        """A worker cluster: any of its workers answers; the controller fails over along the list."""
        try:
            return admin_urls(self.admin_url)
        except PulsarAutoscaleError as exc:
            raise ConfigError(str(exc)) from None

    def reloaded(self, new: "ControllerConfig") -> tuple["ControllerConfig", list[str]]:
        """What a reload applies: `new`, except the options that need a restart, which stay as they are
        (and are listed)."""
        kept = [name for name in RESTART_OPTIONS if getattr(new, name) != getattr(self, name)]
        return replace(new, **{name: getattr(self, name) for name in kept}), kept

    def client_settings(self) -> ClientSettings:
        """How the controller's Pulsar clients (leader election) reach the broker: auth_plugin, auth_params,
        tls_trust_certs_file_path, ... as in pulsar_client.ClientSettings."""
        if "service_url" in self.client:
            raise ConfigError("client: give the broker as service_url at the top level, not under client")
        return from_mapping(ClientSettings, {"service_url": self.service_url, **self.client}, "client")

    def burst_config(self):
        return from_mapping(BurstConfig, self.burst, "burst")

    def warm_pool_config(self) -> WarmPoolConfig:
        return from_mapping(WarmPoolConfig, self.warm_pool, "warm_pool")

    def fast_config(self) -> FastConfig:
        # On by default: without it no policy answers a burst within a period (docs/policies.md).
        return from_mapping(FastConfig, {"enabled": True, **self.fast}, "fast")

    def admin(self):
        """The Functions admin client for this mode: our worker, or a stock Pulsar cluster."""
        if self.mode == "stock":
            return StockPulsarAdmin(
                self.admin_urls[0],
                broker_url=self.broker_admin_url,
                metrics_url=self.worker_metrics_url,
                auth=self.auth,
                extra_hosts=self.extra_hosts,
            )
        session = cluster_session(self.admin_urls, self.auth, self.extra_hosts) if self.auth else None
        return FunctionsAdmin(self.admin_urls, session=session)
