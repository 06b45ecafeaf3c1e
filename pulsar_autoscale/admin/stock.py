"""Adapter for a stock Apache Pulsar cluster: its published admin REST API, nothing of ours.

``StockPulsarAdmin`` answers the calls the Monitor and the Executor make of ``FunctionsAdmin``
(list, get, status, stats, set_parallelism) against Pulsar's Functions API v3, plus what stock
mode needs beyond it:

- ``topic_stats``: a topic's rates, in-counter and per-subscription backlog from the broker's
  ``/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats`` (``/partitioned-stats`` summed over
  partitions for a partitioned topic), backlogs in messages (``messages_per_entry``); ``input_reading``
  sums them over a function's inputs for its subscription (the fast check's arrival rate and backlog in stock mode);
- ``counters``: ``FunctionCounters`` built from Pulsar's FunctionStats (received, processed, busy
  time = average process latency x processed, per instance), kept monotonic across the restarts a
  stock parallelism update causes; inter-arrival figures are unknown and stay zero, so
  ``window_snapshot`` yields ``ca2`` None;
- ``restart_cost_s``: what one restart of an instance costs, from the worker's
  ``pulsar_function_worker_start_instance_process_time_ms`` / ``..._stop_...`` summaries;
- ``max_useful_parallelism``: under FAILOVER (retainOrdering or EFFECTIVELY_ONCE) instances beyond
  the input partitions sit idle, so this is the partition count there (None otherwise).

Every failure is an ``AdminError`` (status kept) whose message names the problem: unreachable or
wrong admin URL, 401/403, 404, a body that is not what Pulsar's API documents, a redirect to a host
outside the cluster (see ``http_auth``).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, cast
from urllib.parse import quote

import requests
from prometheus_client.parser import text_string_to_metric_families

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from pulsar_autoscale.admin.http_auth import AuthConfig, AuthError, RedirectRefused, cluster_session
from pulsar_autoscale.snapshot import FunctionCounters, InputReading

START_METRIC = "pulsar_function_worker_start_instance_process_time_ms"
STOP_METRIC = "pulsar_function_worker_stop_instance_process_time_ms"
# Figures of Pulsar's FunctionInstanceStatsData the counters are built from.
_COUNTER_FIELDS = ("receivedTotal", "processedSuccessfullyTotal")


@dataclass(frozen=True)
class TopicStats:
    """One topic (all partitions summed) as the broker's topic stats report it."""

    topic: str
    partitions: int  # 0: not a partitioned topic
    msg_rate_in: float  # msgRateIn, messages/s
    msg_rate_out: float  # msgRateOut, messages/s
    msg_in_counter: float  # msgInCounter: messages published since the topic was loaded
    # subscription -> its backlog in messages: msgBacklog (entries) x messages_per_entry
    backlog: Mapping[str, float] = field(default_factory=dict)

    def backlog_of(self, subscription: str) -> float | None:
        return self.backlog.get(subscription)


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ValueError(f"{where} is {value!r}, expected a number >= 0")
    return float(value)


def messages_per_entry(subscription: dict) -> float:
    """A subscription's messages per entry, for its msgBacklog, which counts entries (a batch is one entry: 100
    messages sent in batches of 10 are a backlog of 10). The broker's only per-subscription figure is each
    consumer's avgMessagesPerEntry (a moving average of what it was sent, 0 before its first dispatch): their
    mean over the consumers that have one. 1 (the backlog read as entries) while none has: a function whose
    instances have not received yet, or a subscription without consumers."""
    seen = []
    for consumer in subscription.get("consumers") or ():
        value = consumer.get("avgMessagesPerEntry") if isinstance(consumer, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
            seen.append(float(value))
    return sum(seen) / len(seen) if seen else 1.0


def _split_topic(topic: str) -> tuple[str, str, str, str]:
    """persistent://tenant/ns/local -> (domain, tenant, ns, local)."""
    domain, sep, rest = topic.partition("://")
    parts = rest.split("/", 2) if sep else []
    if domain not in ("persistent", "non-persistent") or len(parts) != 3 or not all(parts):
        raise AdminError(f"topic {topic!r} must be a full name: persistent://tenant/namespace/topic")
    return domain, parts[0], parts[1], parts[2]


def _subscription_type(config: Mapping) -> str:
    """As Pulsar derives it from a FunctionConfig."""
    if config.get("retainOrdering") or config.get("processingGuarantees") == "EFFECTIVELY_ONCE":
        return "Failover"
    if config.get("retainKeyOrdering"):
        return "Key_Shared"
    return "Shared"


@dataclass
class StockPulsarAdmin(FunctionsAdmin):
    """Functions and topic stats of a stock Pulsar cluster; drop-in for ``FunctionsAdmin`` in stock mode.

    ``admin_url``: a functions worker (or a broker running one); ``broker_url``: a broker's admin
    URL for topic stats (default: ``admin_url``); ``metrics_url``: the worker's Prometheus page
    (default: ``admin_url`` + ``/metrics``). Without ``session`` a ``ClusterSession`` is made whose
    allowed hosts are these URLs' host:port plus ``extra_hosts`` (the other workers and brokers a
    307 may point to).
    """

    broker_url: str | None = None
    metrics_url: str | None = None
    auth: AuthConfig | Mapping | None = field(default=None, repr=False)  # a mapping becomes an AuthConfig
    extra_hosts: tuple[str, ...] = ()
    _instances: dict = field(default_factory=dict, repr=False)  # (fqfn, instance id) -> _InstanceTotals
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self):
        self.admin_url = self.admin_url.rstrip("/")
        self.broker_url = (self.broker_url or self.admin_url).rstrip("/")
        self.metrics_url = self.metrics_url or f"{self.admin_url}/metrics"
        if not isinstance(self.auth, AuthConfig):
            self.auth = AuthConfig.from_mapping(self.auth or {})
        if self.session is None:
            self.session = cluster_session(
                [self.admin_url, self.broker_url, self.metrics_url], self.auth, self.extra_hosts, timeout_s=self.timeout_s
            )
        super().__post_init__()

    # ---- errors --------------------------------------------------------------------------------------
    def _call(self, method: str, url: str, **kwargs) -> Any:
        try:
            return super()._call(method, url, **kwargs)
        except (RedirectRefused, AuthError):
            raise
        except AdminError as exc:
            hints: dict[int | None, str] = {
                401: "the cluster rejected the credentials (401 Unauthorized): check the auth settings "
                f"(mode {getattr(self.session, 'auth_config', AuthConfig()).mode})",
                403: "the credentials are valid but their role may not do this (403 Forbidden): grant it "
                "the functions/admin permission on the tenant",
                404: "not found (404): check the tenant/namespace/name, and that the URL is a Pulsar "
                "worker or broker with the functions worker enabled",
            }
            hint = hints.get(exc.status)
            if hint is None:
                raise
            raise AdminError(f"{hint}; {exc}", exc.status) from None

    @staticmethod
    def _malformed(what: str, url: str, problem: str) -> AdminError:
        return AdminError(f"malformed {what} from {url}: {problem}; not Pulsar's documented body, ignored")

    def _get_json(self, url: str, what: str, kind: type, params: dict | None = None) -> Any:
        body = self._call("GET", url, params=params)
        if not isinstance(body, kind):
            raise self._malformed(what, url, f"expected a JSON {kind.__name__}, got {type(body).__name__}")
        return body

    # ---- Functions API v3 --------------------------------------------------------------------------
    def list(self, tenant: str, namespace: str) -> list[str]:
        url = self._url(tenant, namespace)
        names = self._get_json(url, "function list", list)
        if not all(isinstance(n, str) and n for n in names):
            raise self._malformed("function list", url, "entries must be function names (strings)")
        return names

    def get(self, tenant: str, namespace: str, name: str) -> dict:
        url = self._url(tenant, namespace, name)
        config = self._get_json(url, "function config", dict)
        for key in ("tenant", "namespace", "name"):
            if not isinstance(config.get(key), str):
                raise self._malformed("function config", url, f"{key} missing or not a string")
        if "parallelism" in config and (isinstance(config["parallelism"], bool) or not isinstance(config["parallelism"], int)):
            raise self._malformed("function config", url, f"parallelism is {config['parallelism']!r}")
        return config

    def status(self, tenant: str, namespace: str, name: str) -> dict:
        url = self._url(tenant, namespace, name, "/status")
        body = self._get_json(url, "function status", dict)
        if not isinstance(body.get("instances", []), list):
            raise self._malformed("function status", url, "instances is not a list")
        return body

    def stats(self, tenant: str, namespace: str, name: str) -> dict:
        url = self._url(tenant, namespace, name, "/stats")
        body = self._get_json(url, "function stats", dict)
        try:
            self._instance_figures(body)
        except ValueError as exc:
            raise self._malformed("function stats", url, str(exc)) from None
        return body

    def set_parallelism(self, tenant: str, namespace: str, name: str, parallelism: int, epoch: int | None = None) -> None:
        """PUT a partial functionConfig. Pulsar's 400 "Update contains no change" means done: no-op."""
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise AdminError(f"parallelism must be an integer >= 1, got {parallelism!r}")
        try:
            super().set_parallelism(tenant, namespace, name, parallelism, epoch=epoch)
        except AdminError as exc:
            if exc.no_change:
                return
            raise

    # ---- counters -----------------------------------------------------------------------------------
    @staticmethod
    def _instance_figures(stats: Mapping) -> dict[Any, tuple[float, float, float]]:
        """instance id -> (received, processed, busy seconds), validated. Raises ValueError naming the field."""
        instances = stats.get("instances")
        rows: list[tuple[Any, Mapping, str]]
        if instances is None or instances == []:
            rows = [("*", stats, "")]
        elif isinstance(instances, list):
            rows = []
            for i, inst in enumerate(instances):
                if not isinstance(inst, dict) or not isinstance(inst.get("metrics"), dict):
                    raise ValueError(f"instances[{i}] has no metrics object")
                iid = inst.get("instanceId", i)
                if isinstance(iid, bool) or not isinstance(iid, int):
                    raise ValueError(f"instances[{i}].instanceId is {iid!r}, expected an integer")
                rows.append((iid, inst["metrics"], f"instances[{i}].metrics."))
        else:
            raise ValueError("instances is not a list")
        figures = {}
        for iid, m, where in rows:
            received, processed = (_number(m.get(f), where + f) for f in _COUNTER_FIELDS)
            latency = m.get("avgProcessLatency")
            latency_ms = 0.0 if latency is None else _number(latency, where + "avgProcessLatency")
            figures[iid] = (received, processed, latency_ms / 1000.0 * processed)
        return figures

    def counters_and_running(self, tenant: str, namespace: str, name: str, now: float) -> tuple[FunctionCounters, int]:
        """Cumulative counters of the function (instances gone or restarted included) and instances reported.

        A stock update restarts every instance, which resets its counters: a figure lower than the
        last reading is taken as a restart and the earlier total is carried over, so the sums only
        grow (messages processed between the last reading and the restart are not seen).
        """
        fqfn = f"{tenant}/{namespace}/{name}"
        stats = self.stats(tenant, namespace, name)
        figures = self._instance_figures(stats)
        with self._lock:
            for iid, raw in figures.items():
                self._instances.setdefault((fqfn, iid), _InstanceTotals()).update(raw)
            totals = [t.total() for (f, _), t in self._instances.items() if f == fqfn]
        received, processed, busy = (sum(col) for col in zip(*totals)) if totals else (0.0, 0.0, 0.0)
        counters = FunctionCounters(
            time=now,
            arrived=None,
            received=received,
            processed=processed,
            outputs=processed,  # Pulsar functions emit at most one output per message
            busy_s=busy,
        )
        reported = stats.get("instances")
        return counters, len(reported) if isinstance(reported, list) else 0

    def counters(self, tenant: str, namespace: str, name: str, now: float) -> FunctionCounters:
        return self.counters_and_running(tenant, namespace, name, now)[0]

    # ---- broker topic stats -------------------------------------------------------------------------
    def _topic_url(self, topic: str, suffix: str) -> str:
        domain, tenant, namespace, local = _split_topic(topic)
        return (
            f"{self.broker_url}/admin/v2/{domain}/{quote(tenant, safe='')}/{quote(namespace, safe='')}/"
            f"{quote(local, safe='')}/{suffix}"
        )

    def partitions(self, topic: str) -> int:
        """Number of partitions (0: not partitioned), from /partitions (PartitionedTopicMetadata)."""
        url = self._topic_url(topic, "partitions")
        body = self._get_json(url, "partitioned topic metadata", dict)
        n = body.get("partitions")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise self._malformed("partitioned topic metadata", url, f"partitions is {n!r}")
        return n

    def topic_stats(self, topic: str) -> TopicStats:
        n = self.partitions(topic)
        if n == 0:
            url = self._topic_url(topic, "stats")
            parts = [self._get_json(url, "topic stats", dict)]
        else:
            url = self._topic_url(topic, "partitioned-stats")
            body = self._get_json(url, "partitioned topic stats", dict, params={"perPartition": "true"})
            per = body.get("partitions")
            parts = list(per.values()) if isinstance(per, dict) and per else [body]
        rate_in = rate_out = counter = 0.0
        backlog: dict[str, float] = {}
        try:
            for i, p in enumerate(parts):
                where = f"partitions[{i}]." if n else ""
                if not isinstance(p, dict):
                    raise ValueError(f"{where or 'body'} is not an object")
                rate_in += _number(p.get("msgRateIn"), where + "msgRateIn")
                rate_out += _number(p.get("msgRateOut", 0.0), where + "msgRateOut")
                counter += _number(p.get("msgInCounter"), where + "msgInCounter")
                subs = p.get("subscriptions", {})
                if not isinstance(subs, dict):
                    raise ValueError(f"{where}subscriptions is not an object")
                for sub, s in subs.items():
                    if not isinstance(s, dict):
                        raise ValueError(f"{where}subscriptions.{sub} is not an object")
                    entries = _number(s.get("msgBacklog"), f"{where}subscriptions.{sub}.msgBacklog")
                    backlog[sub] = backlog.get(sub, 0.0) + entries * messages_per_entry(s)
        except ValueError as exc:
            raise self._malformed("topic stats", url, str(exc)) from None
        return TopicStats(topic, n, rate_in, rate_out, counter, backlog)

    def input_reading(self, inputs, subscription: str, now: float) -> InputReading | None:
        """A function's inputs summed: msgRateIn, msgInCounter and its subscription's msgBacklog
        (None when the subscription does not exist yet on some input); None without inputs."""
        if not inputs:
            return None
        backlog: float | None = 0.0
        rate, arrived = 0.0, 0.0
        for topic in inputs:
            ts = self.topic_stats(topic)
            b = ts.backlog_of(subscription)
            backlog = None if b is None or backlog is None else backlog + b
            rate += ts.msg_rate_in
            arrived += ts.msg_in_counter
        return InputReading(now, rate, arrived, backlog)

    def backlog_and_arrivals(self, inputs, subscription: str) -> tuple[float | None, float | None]:
        """Summed over a function's inputs: backlog of its subscription, and messages published."""
        reading = self.input_reading(inputs, subscription, 0.0)
        return (reading.backlog, reading.in_counter) if reading else (None, None)

    # ---- restart-aware planning inputs ------------------------------------------------------------------
    def restart_cost_s(self) -> float | None:
        """Mean seconds to stop and start one instance on this worker (None: the worker has not measured it)."""
        # Both are set by __post_init__.
        session, metrics_url = cast(requests.Session, self.session), cast(str, self.metrics_url)
        try:
            resp = session.request("GET", metrics_url, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise AdminError(f"cannot read the worker metrics at {metrics_url}: {type(exc).__name__}") from None
        if resp.status_code >= 400:
            raise AdminError(f"GET {metrics_url} -> {resp.status_code}: worker metrics unavailable", resp.status_code)
        sums: dict[str, float] = {}
        try:
            for family in text_string_to_metric_families(resp.text):
                for s in family.samples:
                    if s.name in (
                        f"{START_METRIC}_sum",
                        f"{START_METRIC}_count",
                        f"{STOP_METRIC}_sum",
                        f"{STOP_METRIC}_count",
                    ) and not math.isnan(s.value):
                        sums[s.name] = sums.get(s.name, 0.0) + s.value
        except ValueError as exc:
            raise self._malformed("worker metrics", metrics_url, f"not Prometheus text ({exc})") from None

        def mean_ms(metric: str) -> float | None:
            count = sums.get(f"{metric}_count", 0.0)
            return sums.get(f"{metric}_sum", 0.0) / count if count > 0 else None

        start, stop = mean_ms(START_METRIC), mean_ms(STOP_METRIC)
        if start is None:
            return None
        return (start + (stop or 0.0)) / 1000.0

    def max_useful_parallelism(self, config: Mapping) -> int | None:
        """Under FAILOVER only one instance consumes each input partition: cap at the partition count."""
        if _subscription_type(config) != "Failover":
            return None
        if config.get("topicsPattern"):
            return None  # the matching topics can change: no fixed cap
        from pulsar_autoscale.topics import normalize_topic

        tenant, namespace = config.get("tenant", "public"), config.get("namespace", "default")
        inputs = list(config.get("inputs") or []) + list(config.get("inputSpecs") or {})
        topics = dict.fromkeys(normalize_topic(t, tenant, namespace) for t in inputs)
        if not topics:
            return None
        return sum(max(self.partitions(t), 1) for t in topics)


@dataclass
class _InstanceTotals:
    """One instance's cumulative figures, carried across restarts (which reset Pulsar's counters)."""

    carried: list = field(default_factory=lambda: [0.0, 0.0, 0.0])
    last: tuple | None = None

    def update(self, raw: tuple[float, float, float]) -> None:
        if self.last is not None and (raw[0] < self.last[0] or raw[1] < self.last[1]):
            self.carried = [c + v for c, v in zip(self.carried, self.last)]
        self.last = raw

    def total(self) -> tuple[float, float, float]:
        last = self.last or (0.0, 0.0, 0.0)
        return tuple(c + v for c, v in zip(self.carried, last))
