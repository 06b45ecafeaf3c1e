"""Pulsar's FunctionConfig, with Pulsar's field names, validation and derived values.

Every field of Pulsar's published FunctionConfig schema is either honoured with Pulsar's
semantics or refused with a 400 that names it (docs/function-config.md); a field that is
not in the schema is refused too, so nothing is accepted and then silently ignored.
Types are strict: `retainOrdering: "false"` is an error, not a truthy string.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.keygroups import DEFAULT_NUM_KEY_GROUPS, MAX_NUM_KEY_GROUPS
from pulsar_autoscale.topics import INTERNAL_PREFIX, is_internal, normalize_topic

GUARANTEES = ("ATLEAST_ONCE", "ATMOST_ONCE", "EFFECTIVELY_ONCE", "MANUAL")
RUNTIMES = ("PYTHON", "JAVA", "GO")
SUBSCRIPTION_POSITIONS = ("Latest", "Earliest")
COMPRESSION_TYPES = ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY")
BATCH_BUILDERS = ("DEFAULT", "KEY_BASED")
DEFAULT_MAX_PARALLELISM = 64
# Small on purpose: messages prefetched by old instances are not given to a new one,
# so the prefetch queue bounds how soon a scale-out takes effect (docs/runtime.md, "Receiver queue").
DEFAULT_RECEIVER_QUEUE_SIZE = 100
# 128 groups / 16 = 8 a shard: a subscale's open reads about 1/16 of the tail (BENCHMARKS.md, changelog shards)
DEFAULT_KEYED_CHANGELOG_SHARDS = 16
# Pulsar's defaults for a resources object given in part (FunctionConfigUtils).
DEFAULT_RESOURCES = {"cpu": 1.0, "ram": 1073741824, "disk": 10737418240}
# The Pulsar C++/Python client refuses an ack timeout below 10 s ("Ack timeout should be greater than 10s").
MIN_TIMEOUT_MS = 10_000
# Pulsar's Java default for asynchronous functions; Python functions are synchronous, so only it is accepted.
PULSAR_MAX_PENDING_ASYNC_REQUESTS = 1000
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Fields Pulsar refuses to change on update ("... cannot be altered").
IMMUTABLE_FIELDS = ("inputs", "topicsPattern", "processingGuarantees", "retainOrdering", "retainKeyOrdering", "runtime",
                    "subName", "tenant", "namespace", "name", "numKeyGroups", "keyedState", "stateId",
                    "changelogShards")
_STATE_ID_RE = re.compile(r"^[0-9a-f]{1,32}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-=:]*$")

# Fields of the published schema this worker refuses, with why (docs/function-config.md).
REFUSED = {
    "jar": "only Python functions run here (set py)",
    "go": "only Python functions run here (set py)",
    "inputTypeClassName": "it is a Java type; Python functions use serde classes (customSerdeInputs)",
    "outputTypeClassName": "it is a Java type; Python functions use serde classes (outputSerdeClassName)",
    "outputSchemaType": "functions here exchange bytes through serde classes, not Pulsar schemas "
                        "(use outputSerdeClassName)",
    "customSchemaInputs": "functions here exchange bytes through serde classes, not Pulsar schemas "
                          "(use customSerdeInputs)",
    "customSchemaOutputs": "functions here exchange bytes through serde classes, not Pulsar schemas "
                           "(use outputSerdeClassName)",
    "windowConfig": "Pulsar itself refuses windowed Python functions (\"There is currently no support windowing in "
                    "python\"); keep a window in state (context.put_state) or use a Spark stateful stage",
    "runtimeFlags": "instances are threads or processes of this worker, started without interpreter flags",
    "functionType": "it is set by Pulsar's own function types (sources, sinks), not by a function config",
}
# Refused unless given Pulsar's default (which is what a Python function gets here anyway).
REFUSED_UNLESS = {
    "maxPendingAsyncRequests": (PULSAR_MAX_PENDING_ASYNC_REQUESTS,
                                "Python functions are synchronous; only Java async functions have pending requests"),
    "exposePulsarAdminClientEnabled": (False, "the Python Context has no Pulsar admin client"),
}


@dataclass(frozen=True)
class Resources:
    """Pulsar's resources: what one instance asks for (cores, bytes of RAM, bytes of disk)."""

    cpu: float = DEFAULT_RESOURCES["cpu"]
    ram: int = DEFAULT_RESOURCES["ram"]
    disk: int = DEFAULT_RESOURCES["disk"]


@dataclass(frozen=True)
class ProducerConfig:
    """Pulsar's producerConfig, for the function's output producer."""

    maxPendingMessages: int | None = None
    maxPendingMessagesAcrossPartitions: int | None = None
    compressionType: str | None = None
    batchBuilder: str | None = None


@dataclass(frozen=True)
class FunctionConfig:
    tenant: str = "public"
    namespace: str = "default"
    name: str = ""
    className: str = ""
    py: str | None = None
    inputs: tuple[str, ...] = ()
    topicsPattern: str | None = None
    output: str | None = None
    parallelism: int = 1
    processingGuarantees: str = "ATLEAST_ONCE"
    retainOrdering: bool = False
    retainKeyOrdering: bool = False
    subName: str | None = None
    subscriptionPosition: str = "Latest"
    skipToLatest: bool = False
    cleanupSubscription: bool = True
    userConfig: dict[str, Any] = field(default_factory=dict)
    secrets: dict[str, Any] = field(default_factory=dict)
    logTopic: str | None = None
    runtime: str = "PYTHON"
    autoAck: bool = True
    maxMessageRetries: int | None = None
    deadLetterTopic: str | None = None
    timeoutMs: int | None = None
    receiverQueueSize: int = DEFAULT_RECEIVER_QUEUE_SIZE
    customSerdeInputs: dict[str, str] = field(default_factory=dict)   # topic -> serde class
    outputSerdeClassName: str | None = None
    forwardSourceMessageProperty: bool = True
    batchBuilder: str | None = None
    producerConfig: ProducerConfig | None = None
    resources: Resources | None = None
    customRuntimeOptions: str | None = None
    # Our runtime: "thread" or "process" instances (Pulsar's kubernetes/process/thread runtimes are cluster-wide).
    instanceRuntime: str | None = None
    # Ours: key groups of the function's state (docs/state.md); fixed for the function's life, since a key's
    # group, and so where its state lives, must not change.
    numKeyGroups: int = DEFAULT_NUM_KEY_GROUPS
    # Ours: state is key-grouped and records are routed to the instance that owns their key's group, which
    # moves live on a parallelism change (functions/keyed/routing.py, functions/keyed/migration.py, docs/state.md).
    keyedState: bool = False
    # Ours, assigned by the worker at create (never by a user): names the function's state topics (changelog,
    # key-group assignment, routes), so a function deleted and created again under the same name starts with
    # empty state, as Pulsar's delete drops the function's state table. "" (configs saved before it): the old names.
    stateId: str = ""
    # Ours, fixed at create: topics the state changelog is split into by key-group range (functions/state/changelog.py),
    # so a key group that moves replays its range's records only. Default at create: DEFAULT_KEYED_CHANGELOG_SHARDS
    # for a keyedState function (its groups move), else 1. 0 (configs saved before it): one topic, the old name.
    changelogShards: int = 0

    @property
    def fqfn(self) -> str:
        return f"{self.tenant}/{self.namespace}/{self.name}"

    @property
    def subscription_name(self) -> str:
        return self.subName or self.fqfn

    @property
    def subscription_type(self) -> str:
        """As Pulsar derives it: FAILOVER keeps order, KEY_SHARED keeps per-key order, else SHARED."""
        if self.retainOrdering or self.processingGuarantees == "EFFECTIVELY_ONCE":
            return "FAILOVER"
        if self.retainKeyOrdering:
            return "KEY_SHARED"
        return "SHARED"

    @property
    def auto_ack(self) -> bool:
        """The instance acks (after the output is persisted); MANUAL or autoAck false: the function acks."""
        return self.autoAck and self.processingGuarantees != "MANUAL"

    def dead_letter_topics(self) -> list[str]:
        """Where a message goes after maxMessageRetries redeliveries: deadLetterTopic, else as the Pulsar
        client derives it per input topic, `{topic}-{subscription}-DLQ`."""
        if self.maxMessageRetries is None:
            return []
        if self.deadLetterTopic:
            return [self.deadLetterTopic]
        return [f"{t}-{self.subscription_name}-DLQ" for t in self.inputs]

    def serde_for(self, topic: str) -> str | None:
        return self.customSerdeInputs.get(topic)

    # ---- parsing ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> "FunctionConfig":
        return validate(_from_mapping(data), max_parallelism)

    @classmethod
    def accepted(cls, data: Mapping[str, Any], max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> "FunctionConfig":
        """A config this worker or cluster accepted before (saved, or a metadata record): an update may have
        scaled it to zero (merged), which a create may not."""
        return validate(_from_mapping(data), max_parallelism, min_parallelism=0)

    @classmethod
    def from_text(cls, text: str, source: str = "functionConfig") -> "FunctionConfig":
        return cls.from_dict(parse_text(text, source))

    @classmethod
    def from_file(cls, path: str | Path) -> "FunctionConfig":
        return cls.from_dict(read_config_file(path))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["inputs"] = list(self.inputs)
        d["inputSpecs"] = {t: {"receiverQueueSize": self.receiverQueueSize,
                               **({"serdeClassName": self.customSerdeInputs[t]} if t in self.customSerdeInputs else {})}
                           for t in self.inputs}
        d.pop("receiverQueueSize")
        if not self.keyedState:
            d.pop("keyedState")
        if not self.stateId:
            d.pop("stateId")
        if not self.changelogShards:
            d.pop("changelogShards")
        if self.producerConfig is not None:
            d["producerConfig"] = {k: v for k, v in d["producerConfig"].items() if v is not None}
        return {k: v for k, v in d.items() if v is not None}

    def merged(self, update: Mapping[str, Any], max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> "FunctionConfig":
        """Pulsar's update semantics: a partial config is merged; changing an immutable field or nothing is an error."""
        if not isinstance(update, Mapping):
            raise ConfigError(f"functionConfig must be a JSON object, got {_type_name(update)}")
        base = self.to_dict()
        if update.get("receiverQueueSize") is not None and "inputSpecs" not in update:
            # The shorthand in an update replaces the per-input value the current config shows.
            base["inputSpecs"] = {t: {k: v for k, v in spec.items() if k != "receiverQueueSize"}
                                  for t, spec in base["inputSpecs"].items()}
        new = _from_mapping({**base, **_drop_empty(update)})
        for name in IMMUTABLE_FIELDS:
            if name in update and update[name] not in (None, "", [], {}) and getattr(new, name) != getattr(self, name):
                raise ConfigError(f"{_pulsar_label(name)} cannot be altered")
        new = validate(new, max_parallelism, min_parallelism=0)   # 0: scaled to zero, the subscription stays
        if new == self:
            raise ConfigError("Update contains no change")
        return new


def read_config_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read function config file {p}: {exc.strerror}") from exc
    return parse_text(text, str(p))


def _refuse_aliases(text: str, source: str) -> None:
    """YAML aliases let a few hundred bytes expand into megabytes (nested aliases multiply at each level):
    a function config has no use for them, so they are refused before anything is built."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(f"{source}: YAML aliases (*{event.anchor}) are not accepted in a config; write the value out")


def parse_text(text: str, source: str) -> dict[str, Any]:
    """JSON or YAML text to a mapping, with a message that names the source on failure."""
    try:
        data = json.loads(text)
    except ValueError:
        try:
            _refuse_aliases(text, source)
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source} is neither valid JSON nor YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must be a JSON/YAML object, got {_type_name(data)}")
    return data


def _pulsar_label(name: str) -> str:
    labels = {"inputs": "Input Topics", "processingGuarantees": "Processing Guarantees",
              "retainOrdering": "Retain Ordering", "retainKeyOrdering": "Retain Key Ordering",
              "runtime": "Runtime", "subName": "Subscription Name", "tenant": "Tenant",
              "namespace": "Namespace", "name": "Function Names", "topicsPattern": "Topics Pattern"}
    return labels.get(name, name)


def _drop_empty(update: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in update.items() if v is not None}


# ---- strict types: each error names the field, the type it needs and what it got ----------------

def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _wrong(name: str, want: str, value: Any) -> ConfigError:
    return ConfigError(f"{name} must be {want}, got {_type_name(value)} {value!r:.80}")


def _str(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _wrong(name, "a string", value)
    return value


def _bool(name: str, value: Any) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _wrong(name, "a boolean (true or false)", value)
    return value


def _int(name: str, value: Any, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(name, "an integer", value)
    if not low <= value <= high:
        raise ConfigError(f"{name} must be an integer from {low} to {high}, got {value}")
    return value


def _number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong(name, "a number", value)
    return float(value)


def _object(name: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _wrong(name, "an object", value)
    return dict(value)


def _str_map(name: str, value: Any) -> dict[str, str]:
    out = _object(name, value)
    for k, v in out.items():
        _str(f"{name}.{k}", v)
    return out


def _enum(name: str, value: Any, allowed: tuple[str, ...], case_insensitive: bool = True) -> str | None:
    value = _str(name, value)
    if value is None:
        return None
    for a in allowed:
        if value == a or (case_insensitive and value.upper() == a.upper()):
            return a
    raise ConfigError(f"{name} {value!r} is unknown: use one of {', '.join(allowed)}")


SCHEMA_FIELDS = {
    "autoAck", "batchBuilder", "className", "cleanupSubscription", "customRuntimeOptions", "customSchemaInputs",
    "customSchemaOutputs", "customSerdeInputs", "deadLetterTopic", "exposePulsarAdminClientEnabled",
    "forwardSourceMessageProperty", "fqfn", "functionType", "go", "inputSpecs", "inputTypeClassName", "inputs", "jar",
    "logTopic", "maxMessageRetries", "maxPendingAsyncRequests", "name", "namespace", "output", "outputSchemaType",
    "outputSerdeClassName", "outputTypeClassName", "parallelism", "processingGuarantees", "producerConfig", "py",
    "resources", "retainKeyOrdering", "retainOrdering", "runtime", "runtimeFlags", "secrets", "skipToLatest", "subName",
    "subscriptionPosition", "tenant", "timeoutMs", "topicsPattern", "userConfig", "windowConfig",
}
# Ours: the runtime of the instances, the state's key groups, key-group routing, a shorthand for every
# inputSpecs.<topic>.receiverQueueSize, and the id in the state topics' names.
OUR_FIELDS = {"instanceRuntime", "numKeyGroups", "keyedState", "receiverQueueSize", "stateId", "changelogShards"}
_CONSUMER_FIELDS = {"receiverQueueSize", "serdeClassName", "regexPattern", "schemaType", "schemaProperties",
                    "consumerProperties", "cryptoConfig", "poolMessages"}
_PRODUCER_FIELDS = {"maxPendingMessages", "maxPendingMessagesAcrossPartitions", "compressionType", "batchBuilder",
                    "useThreadLocalProducers", "cryptoConfig"}


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == {} or value == []


def _refuse_unsupported(data: Mapping[str, Any]) -> None:
    for key in data:
        if not isinstance(key, str) or (key not in SCHEMA_FIELDS and key not in OUR_FIELDS):
            raise ConfigError(f"{key!r} is not a FunctionConfig field (Pulsar's published schema); check the spelling")
    for key, why in REFUSED.items():
        if not _empty(data.get(key)):
            raise ConfigError(f"{key} is not supported by this worker: {why}")
    for key, (allowed, why) in REFUSED_UNLESS.items():
        if data.get(key) is not None and data[key] != allowed:
            raise ConfigError(f"{key} is not supported by this worker (only {json.dumps(allowed)}): {why}")
    runtime = data.get("runtime")
    if isinstance(runtime, str) and runtime.upper() in ("JAVA", "GO"):
        raise ConfigError(f"runtime {runtime.upper()} is not supported by this worker: only PYTHON functions run here")


def _input_specs(data: Mapping[str, Any]) -> tuple[list[str], dict[str, str], int | None, list[str]]:
    """inputSpecs -> (topics, serde per topic, receiverQueueSize, regex patterns)."""
    specs = _object("inputSpecs", data.get("inputSpecs"))
    topics: list[str] = []
    serdes: dict[str, str] = {}
    patterns: list[str] = []
    queues: set[int] = set()
    for topic, spec in specs.items():
        where = f"inputSpecs.{topic}"
        spec = _object(where, spec)
        unknown = set(spec) - _CONSUMER_FIELDS
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]} is not a ConsumerConfig field")
        for key in ("schemaType", "schemaProperties", "consumerProperties", "cryptoConfig"):
            if not _empty(spec.get(key)):
                raise ConfigError(f"{where}.{key} is not supported by this worker: functions here exchange bytes "
                                  "through serde classes (serdeClassName), without schemas or encryption")
        if _bool(f"{where}.poolMessages", spec.get("poolMessages")):
            raise ConfigError(f"{where}.poolMessages is not supported by this worker: it is a Java client option")
        q = _int(f"{where}.receiverQueueSize", spec.get("receiverQueueSize"), 1, INT32_MAX)
        if q is not None:
            queues.add(q)
        if _bool(f"{where}.regexPattern", spec.get("regexPattern")):
            patterns.append(topic)
            continue
        topics.append(topic)
        serde = _str(f"{where}.serdeClassName", spec.get("serdeClassName"))
        if serde:
            serdes[topic] = serde
    if len(queues) > 1:
        raise ConfigError(f"inputSpecs: receiverQueueSize differs between topics ({sorted(queues)}); "
                          "this worker opens one consumer for all inputs of a function: give one value")
    return topics, serdes, (queues.pop() if queues else None), patterns


def _from_mapping(data: Mapping[str, Any]) -> FunctionConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(f"functionConfig must be a JSON object, got {_type_name(data)}")
    _refuse_unsupported(data)
    tenant = _str("tenant", data.get("tenant")) or "public"
    namespace = _str("namespace", data.get("namespace")) or "default"
    name = _str("name", data.get("name")) or ""
    fqfn = _str("fqfn", data.get("fqfn"))
    if fqfn and fqfn != f"{tenant}/{namespace}/{name}":
        raise ConfigError(f"fqfn {fqfn!r} does not match tenant/namespace/name {tenant}/{namespace}/{name}")

    raw_inputs = data.get("inputs")
    if raw_inputs is None:
        raw_inputs = []
    if not isinstance(raw_inputs, (list, tuple)):
        raise _wrong("inputs", "an array of topic names", raw_inputs)
    for i, t in enumerate(raw_inputs):
        _str(f"inputs[{i}]", t)
    spec_topics, spec_serdes, queue, patterns = _input_specs(data)
    custom_serdes = _str_map("customSerdeInputs", data.get("customSerdeInputs"))
    pattern = _str("topicsPattern", data.get("topicsPattern"))
    if patterns:
        if len(patterns) > 1 or (pattern and pattern != patterns[0]):
            raise ConfigError("only one topics pattern per function (topicsPattern or one inputSpecs regexPattern)")
        pattern = patterns[0]
    if pattern:
        pattern = normalize_topic(pattern, tenant, namespace) if "://" not in pattern and "/" in pattern else pattern
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"topicsPattern {pattern!r} is not a valid regular expression: {exc}") from None
    seen: list[str] = []
    serdes: dict[str, str] = {}
    for t in [*raw_inputs, *spec_topics, *custom_serdes]:
        n = normalize_topic(t, tenant, namespace)
        if n not in seen:
            seen.append(n)
    for t, cls in {**spec_serdes, **custom_serdes}.items():
        serdes[normalize_topic(t, tenant, namespace)] = cls

    def topic(name_: str) -> str | None:
        value = _str(name_, data.get(name_))
        return normalize_topic(value, tenant, namespace) if value else None

    user_config = data.get("userConfig")
    if isinstance(user_config, str):  # pulsar-admin's --user-config sends a JSON string
        user_config = parse_text(user_config, "userConfig")
    resources = None
    if data.get("resources") is not None:
        raw = _object("resources", data["resources"])
        unknown = set(raw) - {"cpu", "ram", "disk"}
        if unknown:
            raise ConfigError(f"resources.{sorted(unknown)[0]} is not a Resources field (cpu, ram, disk)")
        resources = Resources(
            cpu=_number("resources.cpu", raw.get("cpu")) if raw.get("cpu") is not None else DEFAULT_RESOURCES["cpu"],
            ram=_int("resources.ram", raw.get("ram"), 1, INT64_MAX) or DEFAULT_RESOURCES["ram"],
            disk=_int("resources.disk", raw.get("disk"), 1, INT64_MAX) or DEFAULT_RESOURCES["disk"])
        if resources.cpu <= 0:
            raise ConfigError(f"resources.cpu must be a positive number, got {resources.cpu}")
    producer, batch_builder = _producer_config(data)
    max_retries = _int("maxMessageRetries", data.get("maxMessageRetries"), -1, INT32_MAX)
    queue = _int("receiverQueueSize", data.get("receiverQueueSize"), 1, INT32_MAX) if queue is None else queue
    options = data.get("customRuntimeOptions")
    if isinstance(options, Mapping):  # written as YAML/JSON object: Pulsar's field is a JSON string
        options = json.dumps(options)
    return FunctionConfig(
        tenant=tenant, namespace=namespace, name=name,
        className=_str("className", data.get("className")) or "",
        py=_str("py", data.get("py")),
        inputs=tuple(seen),
        topicsPattern=pattern or None,
        output=topic("output"),
        parallelism=_int("parallelism", data.get("parallelism"), -INT32_MAX, INT32_MAX) if "parallelism" in data
        and data["parallelism"] is not None else 1,
        processingGuarantees=_enum("processingGuarantees", data.get("processingGuarantees"), GUARANTEES)
        or "ATLEAST_ONCE",
        retainOrdering=bool(_bool("retainOrdering", data.get("retainOrdering"))),
        retainKeyOrdering=bool(_bool("retainKeyOrdering", data.get("retainKeyOrdering"))),
        subName=_str("subName", data.get("subName")) or None,
        subscriptionPosition=_enum("subscriptionPosition", data.get("subscriptionPosition"), SUBSCRIPTION_POSITIONS)
        or "Latest",
        skipToLatest=bool(_bool("skipToLatest", data.get("skipToLatest"))),
        cleanupSubscription=_default(_bool("cleanupSubscription", data.get("cleanupSubscription")), True),
        userConfig=_object("userConfig", user_config),
        secrets=_object("secrets", data.get("secrets")),
        logTopic=topic("logTopic"),
        runtime=_enum("runtime", data.get("runtime"), RUNTIMES) or "PYTHON",
        autoAck=_default(_bool("autoAck", data.get("autoAck")), True),
        maxMessageRetries=None if max_retries is None or max_retries < 0 else max_retries,
        deadLetterTopic=topic("deadLetterTopic"),
        timeoutMs=_int("timeoutMs", data.get("timeoutMs"), 1, INT64_MAX),
        receiverQueueSize=queue if queue is not None else DEFAULT_RECEIVER_QUEUE_SIZE,
        customSerdeInputs=serdes,
        outputSerdeClassName=_str("outputSerdeClassName", data.get("outputSerdeClassName")) or None,
        forwardSourceMessageProperty=_default(
            _bool("forwardSourceMessageProperty", data.get("forwardSourceMessageProperty")), True),
        batchBuilder=batch_builder,
        producerConfig=producer,
        resources=resources,
        customRuntimeOptions=_str("customRuntimeOptions", options) or None,
        instanceRuntime=_str("instanceRuntime", data.get("instanceRuntime")),
        numKeyGroups=_default(_int("numKeyGroups", data.get("numKeyGroups"), 1, MAX_NUM_KEY_GROUPS),
                              DEFAULT_NUM_KEY_GROUPS),
        keyedState=bool(_bool("keyedState", data.get("keyedState"))),
        stateId=_str("stateId", data.get("stateId")) or "",
        changelogShards=_int("changelogShards", data.get("changelogShards"), 1, MAX_NUM_KEY_GROUPS) or 0,
    )


def _default(value, default):
    return default if value is None else value


def _producer_config(data: Mapping[str, Any]) -> tuple[ProducerConfig | None, str | None]:
    batch_builder = _enum("batchBuilder", data.get("batchBuilder"), BATCH_BUILDERS)
    if data.get("producerConfig") is None:
        return None, batch_builder
    raw = _object("producerConfig", data["producerConfig"])
    unknown = set(raw) - _PRODUCER_FIELDS
    if unknown:
        raise ConfigError(f"producerConfig.{sorted(unknown)[0]} is not a ProducerConfig field")
    if not _empty(raw.get("cryptoConfig")):
        raise ConfigError("producerConfig.cryptoConfig is not supported by this worker: no end-to-end encryption")
    if _bool("producerConfig.useThreadLocalProducers", raw.get("useThreadLocalProducers")):
        raise ConfigError("producerConfig.useThreadLocalProducers is not supported by this worker: "
                          "it is a Java runtime option")
    cfg = ProducerConfig(
        maxPendingMessages=_int("producerConfig.maxPendingMessages", raw.get("maxPendingMessages"), 1, INT32_MAX),
        maxPendingMessagesAcrossPartitions=_int("producerConfig.maxPendingMessagesAcrossPartitions",
                                                raw.get("maxPendingMessagesAcrossPartitions"), 1, INT32_MAX),
        compressionType=_enum("producerConfig.compressionType", raw.get("compressionType"), COMPRESSION_TYPES),
        batchBuilder=_enum("producerConfig.batchBuilder", raw.get("batchBuilder"), BATCH_BUILDERS))
    return cfg, batch_builder or cfg.batchBuilder


def validate(cfg: FunctionConfig, max_parallelism: int = DEFAULT_MAX_PARALLELISM,
             min_parallelism: int = 1) -> FunctionConfig:
    """Pulsar-style checks, each with a message that names the field."""
    for label, value in (("tenant", cfg.tenant), ("namespace", cfg.namespace), ("name", cfg.name)):
        if not value or not isinstance(value, str):
            raise ConfigError(f"Function {label} is not provided")
        if len(value) > 128:
            raise ConfigError(f"Function {label} is {len(value)} characters long: at most 128")
        if not _NAME_RE.match(value):
            raise ConfigError(f"Function {label} {value!r} contains invalid characters")
    if cfg.runtime != "PYTHON":
        raise ConfigError(f"runtime {cfg.runtime} is not supported by this worker: only PYTHON functions run here")
    if not cfg.className:
        raise ConfigError("Function classname cannot be null (set className, e.g. 'exclaim.Exclaim')")
    if not cfg.inputs and not cfg.topicsPattern:
        raise ConfigError("No input topic(s) specified for the function (set inputs or topicsPattern)")
    if cfg.inputs and cfg.topicsPattern:
        raise ConfigError("topicsPattern and inputs cannot both be set on this worker (one consumer per function "
                          "instance): put the topics in the pattern, or list them in inputs")
    for label, topic in [("input", i) for i in cfg.inputs] + [("output", cfg.output), ("logTopic", cfg.logTopic),
                                                              ("deadLetterTopic", cfg.deadLetterTopic)]:
        if topic and is_internal(topic):
            raise ConfigError(f"{label} {topic} is one of pulsar-autoscale's own coordination topics "
                              f"({INTERNAL_PREFIX}*): a function may not read or write it")
    if cfg.output and cfg.output in cfg.inputs:
        raise ConfigError(f"Output topic {cfg.output} is also an input topic of the function")
    if cfg.parallelism < min_parallelism:
        raise ConfigError(f"Function parallelism must be a positive number, got {cfg.parallelism}")
    if cfg.parallelism > max_parallelism:
        raise ConfigError(f"Function parallelism {cfg.parallelism} is above this worker's limit of {max_parallelism}")
    if cfg.processingGuarantees == "ATMOST_ONCE" and not cfg.autoAck:
        raise ConfigError("autoAck must be true when processingGuarantees is ATMOST_ONCE (as Pulsar requires)")
    if cfg.processingGuarantees == "ATMOST_ONCE" and cfg.maxMessageRetries is not None:
        raise ConfigError("maxMessageRetries needs ATLEAST_ONCE or MANUAL processingGuarantees: "
                          "ATMOST_ONCE acks on receipt, so nothing is redelivered")
    if cfg.processingGuarantees == "EFFECTIVELY_ONCE" and not cfg.autoAck:
        raise ConfigError("autoAck must be true when processingGuarantees is EFFECTIVELY_ONCE: the instance applies "
                          "a message's state changes and its ack once (docs/state.md)")
    if cfg.retainOrdering and cfg.retainKeyOrdering:
        raise ConfigError("retainOrdering and retainKeyOrdering cannot both be set")
    if cfg.maxMessageRetries == 0:
        raise ConfigError("maxMessageRetries must be at least 1 (the Pulsar client's dead-letter policy needs "
                          "maxRedeliverCount > 0); leave it unset or -1 to retry forever")
    if cfg.deadLetterTopic and cfg.maxMessageRetries is None:
        raise ConfigError("Dead Letter Topic specified, however max retries is set to infinity "
                          "(set maxMessageRetries)")
    if cfg.deadLetterTopic and cfg.deadLetterTopic in cfg.inputs:
        raise ConfigError(f"deadLetterTopic {cfg.deadLetterTopic} is also an input topic of the function")
    if cfg.timeoutMs is not None and cfg.timeoutMs < MIN_TIMEOUT_MS:
        raise ConfigError(f"timeoutMs must be at least {MIN_TIMEOUT_MS} (the Pulsar Python client's minimum ack "
                          f"timeout), got {cfg.timeoutMs}")
    if cfg.instanceRuntime not in (None, "thread", "process"):
        raise ConfigError(f"instanceRuntime {cfg.instanceRuntime!r} is unknown: use 'thread' or 'process'")
    if cfg.stateId and not _STATE_ID_RE.match(cfg.stateId):
        raise ConfigError(f"stateId {cfg.stateId!r} is not one the worker assigns (hex digits)")
    if cfg.changelogShards > cfg.numKeyGroups:
        raise ConfigError(f"changelogShards ({cfg.changelogShards}) must be at most numKeyGroups "
                          f"({cfg.numKeyGroups}): a shard holds whole key groups")
    keyed_migration(cfg)
    return cfg


def with_new_state(cfg: FunctionConfig) -> FunctionConfig:
    """The config of a function being created: a stateId of its own and its changelog's shards (see both fields)."""
    if cfg.stateId:
        raise ConfigError("stateId is assigned by the worker when a function is created; leave it out")
    shards = cfg.changelogShards or (min(DEFAULT_KEYED_CHANGELOG_SHARDS, cfg.numKeyGroups) if cfg.keyedState else 1)
    return replace(cfg, stateId=uuid.uuid4().hex[:12], changelogShards=shards)


@dataclass(frozen=True)
class KeyedMigration:
    """How a keyedState function's key groups move on a parallelism change: subscales of `subscale_size` groups,
    migration work at most `duty` of the time, the pre-copy reading the changelog at most `pre_copy_mb_per_s`
    (None: as fast as `duty` lets it); `stop_the_world` pauses every group and moves all at once (what
    bench/state_migration.py compares with, and shorter in total when a pause is acceptable)."""

    subscale_size: int = 4
    duty: float = 0.5
    stop_the_world: bool = False
    pre_copy_mb_per_s: float | None = 8.0   # bench/state_migration.py --workers 3: unaffected keys' p99 unmoved


KEYED_MIGRATION_FIELDS = {"subscaleSize", "duty", "mode", "preCopyMBps"}


def keyed_migration(cfg: FunctionConfig) -> KeyedMigration:
    """customRuntimeOptions' `keyedMigration` object (Pulsar's free-form JSON field; docs/keyed-state.md)."""
    where = "customRuntimeOptions.keyedMigration"
    try:
        options = json.loads(cfg.customRuntimeOptions) if cfg.customRuntimeOptions else {}
    except json.JSONDecodeError:
        return KeyedMigration()   # not ours to judge: controls.py names a non-JSON string for its `autoscale` key
    raw = options.get("keyedMigration") if isinstance(options, dict) else None
    if raw is None:
        return KeyedMigration()
    if not cfg.keyedState:
        raise ConfigError(f"{where} is set but keyedState is false: only keyedState functions migrate key groups")
    raw = _object(where, raw)
    unknown = set(raw) - KEYED_MIGRATION_FIELDS
    if unknown:
        raise ConfigError(f"{where}.{sorted(unknown)[0]} is unknown: use {', '.join(sorted(KEYED_MIGRATION_FIELDS))}")
    default = KeyedMigration()
    mode = raw.get("mode", "live")
    if mode not in ("live", "stop-the-world"):
        raise ConfigError(f"{where}.mode must be 'live' or 'stop-the-world', got {mode!r}")
    duty = _number(f"{where}.duty", raw.get("duty", default.duty))
    if not 0 < duty <= 1:
        raise ConfigError(f"{where}.duty must be in (0, 1] (the share of time migration work may take), got {duty}")
    size = _int(f"{where}.subscaleSize", raw.get("subscaleSize", default.subscale_size), 1, MAX_NUM_KEY_GROUPS)
    rate = raw.get("preCopyMBps", default.pre_copy_mb_per_s)
    if rate is not None:
        rate = _number(f"{where}.preCopyMBps", rate)
        if rate <= 0:
            raise ConfigError(f"{where}.preCopyMBps must be above 0 (MB/s the pre-copy may read), or null for no "
                              f"limit; got {rate}")
    return KeyedMigration(size, duty, mode == "stop-the-world", rate)

