"""Option parsing for the `pulsar` data source, checked on the driver before any task starts.

Names follow StreamNative's pulsar-spark connector so existing jobs port over. Spark hands
options over case-insensitively, so every name is compared lower-cased. A misspelt option is
an error, not silently ignored: a job that reads the wrong range is worse than one that fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping, overload

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.pulsar_client import ClientSettings

from .offsets import Position, StartSpec

# Options Spark itself adds to a source's or sink's map (writeStream passes checkpointLocation on).
_SPARK_OWNED = {"path", "checkpointlocation", "queryname"}

# Authentication and TLS: the pulsar-spark connector's names (`pulsar.client.` + the Java
# client's setting); its older releases took them without the prefix, and so do we.
CLIENT_PREFIX = "pulsar.client."
AUTH_PLUGIN, AUTH_PARAMS, TLS_TRUST_CERTS, TLS_ALLOW_INSECURE, TLS_HOSTNAME = (
    "authPluginClassName",
    "authParams",
    "tlsTrustCertsFilePath",
    "tlsAllowInsecureConnection",
    "tlsHostnameVerificationEnable",
)
_CLIENT = (AUTH_PLUGIN, AUTH_PARAMS, TLS_TRUST_CERTS, TLS_ALLOW_INSECURE, TLS_HOSTNAME)
_COMMON = ("service.url", "admin.url", "operationTimeoutMs", *_CLIENT, *(CLIENT_PREFIX + n for n in _CLIENT))
SOURCE_OPTIONS = _COMMON + (
    "topic",
    "topics",
    "topicsPattern",
    "startingOffsets",
    "endingOffsets",
    "maxRecordsPerTrigger",
    "failOnDataLoss",
    "minPartitions",
    "pollTimeoutMs",
    "allowEmptyTopics",
    "nativeReader",
)
NATIVE_READER = ("auto", "true", "false")
SINK_OPTIONS = _COMMON + ("topic", "producer.batchingEnabled", "producer.maxPendingMessages")

_TOPIC_RE = re.compile(r"^(persistent|non-persistent)://[^/\s]+/[^/\s]+/[^/\s]+$|^[^/:\s]+$")


class PulsarOptionError(ConfigError):
    """A `pulsar` source/sink option is missing or invalid; the message names the option."""


@dataclass(frozen=True)
class ConnectionOptions:
    """Where and how to connect; `client` carries auth and TLS (its repr hides authParams)."""

    client: ClientSettings
    admin_url: str | None
    operation_timeout_s: int

    @property
    def service_url(self) -> str:
        return self.client.service_url


@dataclass(frozen=True)
class SourceOptions:
    connection: ConnectionOptions
    topics: tuple[str, ...]
    topics_pattern: str | None
    starting: StartSpec
    ending: StartSpec
    max_records_per_trigger: int | None
    fail_on_data_loss: bool
    min_partitions: int
    poll_timeout_ms: int
    allow_empty_topics: bool
    native_reader: str = "auto"  # auto: the C read loop where it can run (native.py); true: it or an error


@dataclass(frozen=True)
class SinkOptions:
    connection: ConnectionOptions
    topic: str | None
    batching_enabled: bool
    max_pending_messages: int


def normalize_topic(name: str, option: str = "topic") -> str:
    """Short names get Pulsar's defaults (persistent://public/default/...), as the client does."""
    name = name.strip()
    if not name or not _TOPIC_RE.match(name):
        raise PulsarOptionError(
            f"option '{option}': {name!r} is not a topic name (expected 'name' or 'persistent://tenant/namespace/name')"
        )
    return name if "://" in name else f"persistent://public/default/{name}"


def _lower(options: Mapping[str, str], allowed: tuple[str, ...], kind: str) -> dict[str, str]:
    unknown = sorted(k for k in options if k.lower() not in {a.lower() for a in allowed} | _SPARK_OWNED)
    if unknown:
        raise PulsarOptionError(f"unknown {kind} option(s) {unknown}; the pulsar {kind} accepts {list(allowed)}")
    return {k.lower(): v for k, v in options.items()}


@overload
def _int(opts: dict[str, str], name: str, default: int, minimum: int) -> int: ...
@overload
def _int(opts: dict[str, str], name: str, default: int | None, minimum: int) -> int | None: ...
def _int(opts: dict[str, str], name: str, default: int | None, minimum: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise PulsarOptionError(f"option '{name}': {raw!r} is not an integer") from None
    if value < minimum:
        raise PulsarOptionError(f"option '{name}': must be >= {minimum}, got {value}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise PulsarOptionError(f"option '{name}': expected true or false, got {raw!r}")
    return raw.strip().lower() == "true"


def _client_opts(opts: dict[str, str]) -> dict[str, str]:
    """The auth/TLS options under their bare names (lower-cased), either spelling accepted once."""
    out: dict[str, str] = {}
    for name in _CLIENT:
        bare, prefixed = name.lower(), (CLIENT_PREFIX + name).lower()
        if bare in opts and prefixed in opts:
            raise PulsarOptionError(f"option '{CLIENT_PREFIX}{name}' is also given as '{name}': set one")
        if bare in opts or prefixed in opts:
            out[bare] = opts[prefixed] if prefixed in opts else opts[bare]
    return out


def _connection(opts: dict[str, str]) -> ConnectionOptions:
    url = opts.get("service.url", "").strip()
    if not url:
        raise PulsarOptionError("option 'service.url' is required, e.g. pulsar://localhost:6650")
    if not url.startswith(("pulsar://", "pulsar+ssl://")):
        raise PulsarOptionError(f"option 'service.url': {url!r} must start with pulsar:// or pulsar+ssl://")
    admin = opts.get("admin.url")
    if admin is not None and not admin.startswith(("http://", "https://")):
        raise PulsarOptionError(f"option 'admin.url': {admin!r} must start with http:// or https://")
    timeout_ms = _int(opts, "operationTimeoutMs", 30_000, 1000)
    auth = _client_opts(opts)
    client = ClientSettings(
        url,
        auth.get(AUTH_PLUGIN.lower()) or None,
        auth.get(AUTH_PARAMS.lower()) or None,
        auth.get(TLS_TRUST_CERTS.lower()) or None,
        _bool(auth, TLS_ALLOW_INSECURE, False),
        _bool(auth, TLS_HOSTNAME, False),
    )
    if client.auth_params and not client.auth_plugin:
        raise PulsarOptionError(f"option '{CLIENT_PREFIX}{AUTH_PARAMS}' is set without '{CLIENT_PREFIX}{AUTH_PLUGIN}'")
    try:
        client.authentication()  # a bad plugin or params fail here, on the driver (the message never holds the params)
    except ConfigError as exc:
        raise PulsarOptionError(f"option '{CLIENT_PREFIX}{AUTH_PLUGIN}': {exc}") from None
    return ConnectionOptions(client, admin, max(1, timeout_ms // 1000))


def client_options(client: ClientSettings) -> dict[str, str]:
    """The source/sink options that carry `client` (its URL, auth and TLS): what the worker's
    stateful stages pass to the `pulsar` source and sink."""
    out = {"service.url": client.service_url}
    for name, value in (
        (AUTH_PLUGIN, client.auth_plugin),
        (AUTH_PARAMS, client.auth_params),
        (TLS_TRUST_CERTS, client.tls_trust_certs_file_path),
    ):
        if value:
            out[CLIENT_PREFIX + name] = value
    if client.tls_allow_insecure_connection:
        out[CLIENT_PREFIX + TLS_ALLOW_INSECURE] = "true"
    if client.tls_validate_hostname:
        out[CLIENT_PREFIX + TLS_HOSTNAME] = "true"
    return out


def _topic_value(option: str, topic: str, value) -> "Position | str":
    if value in ("earliest", "latest"):
        return value
    if isinstance(value, list) and value and all(isinstance(b, int) and -128 <= b <= 255 for b in value):
        try:
            return Position.from_bytes(bytes(b & 0xFF for b in value))
        except ValueError:
            pass
    raise PulsarOptionError(
        f'option \'{option}\': topic {topic!r} maps to {value!r}; expected "earliest", "latest" '
        "or a serialized message id as a list of bytes, e.g. [8, 0, 16, 42]"
    )


def parse_offsets_option(option: str, raw: str) -> StartSpec:
    """Parse startingOffsets/endingOffsets; the error names the option and what was wrong."""
    text = raw.strip()
    if text in ("earliest", "latest"):
        return StartSpec(special=text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PulsarOptionError(f"option '{option}': {raw!r} is neither 'earliest', 'latest' nor JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not data:
        raise PulsarOptionError(f"option '{option}': JSON must be a non-empty object of topic -> message id")
    return StartSpec(per_topic={normalize_topic(t, option): _topic_value(option, t, v) for t, v in data.items()})


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    opts = _lower(options, SOURCE_OPTIONS, "source")
    conn = _connection(opts)
    given = [k for k in ("topic", "topics", "topicspattern") if opts.get(k)]
    if len(given) != 1:
        raise PulsarOptionError(
            "exactly one of the options 'topic', 'topics', 'topicsPattern' must be set" + (f" (got {given})" if given else "")
        )
    topics: tuple[str, ...] = ()
    pattern = None
    if "topicspattern" in given:
        pattern = opts["topicspattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise PulsarOptionError(f"option 'topicsPattern': {pattern!r} is not a regex: {exc}") from None
        if conn.admin_url is None:
            raise PulsarOptionError(
                "option 'topicsPattern' needs 'admin.url' (topics are listed through Pulsar's admin "
                "REST API; pulsar-lite has none: name the topics with 'topics' instead)"
            )
    else:
        key = given[0]
        names = opts[key].split(",") if key == "topics" else [opts[key]]
        topics = tuple(dict.fromkeys(normalize_topic(n, key) for n in names))
    starting = parse_offsets_option("startingOffsets", opts.get("startingoffsets", "earliest"))
    ending = parse_offsets_option("endingOffsets", opts.get("endingoffsets", "latest"))
    if starting.special == "latest" and "endingoffsets" in opts:
        raise PulsarOptionError("option 'startingOffsets': 'latest' with 'endingOffsets' reads nothing")
    if ending.special == "earliest":
        raise PulsarOptionError("option 'endingOffsets': 'earliest' is not allowed (use 'latest' or JSON)")
    for spec, name in ((starting, "startingOffsets"), (ending, "endingOffsets")):
        extra = sorted(set(spec.per_topic) - set(topics)) if topics else []
        if extra:
            raise PulsarOptionError(f"option '{name}' names topics that are not read: {extra}")
    return SourceOptions(
        connection=conn,
        topics=topics,
        topics_pattern=pattern,
        starting=starting,
        ending=ending,
        max_records_per_trigger=_int(opts, "maxRecordsPerTrigger", None, 1),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        min_partitions=_int(opts, "minPartitions", 1, 1),
        poll_timeout_ms=_int(opts, "pollTimeoutMs", 10_000, 100),
        allow_empty_topics=_bool(opts, "allowEmptyTopics", False),
        native_reader=_choice(opts, "nativeReader", NATIVE_READER),
    )


def _choice(opts: dict[str, str], name: str, allowed: tuple[str, ...]) -> str:
    """One of `allowed` (the first is the default), any case."""
    raw = opts.get(name.lower(), allowed[0])
    if raw.strip().lower() not in allowed:
        raise PulsarOptionError(f"option '{name}': expected one of {list(allowed)}, got {raw!r}")
    return raw.strip().lower()


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options, SINK_OPTIONS, "sink")
    topic = opts.get("topic")
    return SinkOptions(
        connection=_connection(opts),
        topic=normalize_topic(topic) if topic else None,
        batching_enabled=_bool(opts, "producer.batchingEnabled", True),
        max_pending_messages=_int(opts, "producer.maxPendingMessages", 1000, 1),
    )
