"""Pulsar's FunctionConfig, with Pulsar's field names, validation and derived values.

Only the fields a Python function uses are typed; anything else Pulsar accepts is
kept in `extra` and round-trips, so a config written for `pulsar-admin` works here.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

import yaml

from pulsar_autoscale.errors import ConfigError

GUARANTEES = ("ATLEAST_ONCE", "ATMOST_ONCE", "EFFECTIVELY_ONCE", "MANUAL")
SUPPORTED_GUARANTEES = ("ATLEAST_ONCE", "ATMOST_ONCE")
RUNTIMES = ("PYTHON", "JAVA", "GO")
DEFAULT_MAX_PARALLELISM = 64
# Small on purpose: messages prefetched by old instances are not given to a new one,
# so the prefetch queue bounds how soon a scale-out takes effect (DESIGN.md "Prefetch").
DEFAULT_RECEIVER_QUEUE_SIZE = 100
# Fields Pulsar refuses to change on update ("... cannot be altered").
IMMUTABLE_FIELDS = ("inputs", "processingGuarantees", "retainOrdering", "retainKeyOrdering", "runtime", "subName",
                    "tenant", "namespace", "name")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-=:]*$")
_TOPIC_RE = re.compile(r"^(persistent|non-persistent)://[^/\s]+/[^/\s]+/[^/\s]+$")


def normalize_topic(topic: str, tenant: str = "public", namespace: str = "default") -> str:
    """Pulsar's short topic names: `t` -> persistent://public/default/t, `tn/ns/t` -> persistent://tn/ns/t."""
    if not isinstance(topic, str) or not topic.strip():
        raise ConfigError(f"invalid topic name {topic!r}: must be a non-empty string")
    topic = topic.strip()
    if "://" not in topic:
        parts = topic.split("/")
        if len(parts) == 1:
            topic = f"persistent://{tenant}/{namespace}/{topic}"
        elif len(parts) == 3:
            topic = f"persistent://{topic}"
        else:
            raise ConfigError(f"invalid topic name {topic!r}: use 'name', 'tenant/namespace/name' or a full persistent:// URL")
    if not _TOPIC_RE.match(topic):
        raise ConfigError(f"invalid topic name {topic!r}: expected persistent://tenant/namespace/topic")
    return topic


@dataclass(frozen=True)
class FunctionConfig:
    tenant: str = "public"
    namespace: str = "default"
    name: str = ""
    className: str = ""
    py: str | None = None
    inputs: tuple[str, ...] = ()
    output: str | None = None
    parallelism: int = 1
    processingGuarantees: str = "ATLEAST_ONCE"
    retainOrdering: bool = False
    retainKeyOrdering: bool = False
    subName: str | None = None
    userConfig: dict[str, Any] = field(default_factory=dict)
    logTopic: str | None = None
    runtime: str = "PYTHON"
    autoAck: bool = True
    receiverQueueSize: int = DEFAULT_RECEIVER_QUEUE_SIZE
    # Our runtime: "thread" or "process" instances (Pulsar's kubernetes/process/thread runtimes are cluster-wide).
    instanceRuntime: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

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

    # ---- parsing ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> "FunctionConfig":
        return validate(_from_mapping(data), max_parallelism)

    @classmethod
    def from_text(cls, text: str, source: str = "functionConfig") -> "FunctionConfig":
        return cls.from_dict(parse_text(text, source))

    @classmethod
    def from_file(cls, path: str | Path) -> "FunctionConfig":
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read function config file {p}: {exc.strerror}") from exc
        return cls.from_text(text, str(p))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        d["inputs"] = list(self.inputs)
        d["inputSpecs"] = {t: {"receiverQueueSize": self.receiverQueueSize} for t in self.inputs}
        d.pop("receiverQueueSize")
        d = {k: v for k, v in d.items() if v is not None}
        return {**extra, **d}

    def merged(self, update: Mapping[str, Any], max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> "FunctionConfig":
        """Pulsar's update semantics: a partial config is merged; changing an immutable field or nothing is an error."""
        new = _from_mapping({**self.to_dict(), **_drop_empty(update)})
        for name in IMMUTABLE_FIELDS:
            if name in update and update[name] not in (None, "", [], {}) and getattr(new, name) != getattr(self, name):
                raise ConfigError(f"{_pulsar_label(name)} cannot be altered")
        new = validate(new, max_parallelism)
        if new == self:
            raise ConfigError("Update contains no change")
        return new


def parse_text(text: str, source: str) -> dict[str, Any]:
    """JSON or YAML text to a mapping, with a message that names the source on failure."""
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source} is neither valid JSON nor YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must be a JSON/YAML object, got {type(data).__name__}")
    return data


def _pulsar_label(name: str) -> str:
    labels = {"inputs": "Input Topics", "processingGuarantees": "Processing Guarantees",
              "retainOrdering": "Retain Ordering", "retainKeyOrdering": "Retain Key Ordering",
              "runtime": "Runtime", "subName": "Subscription Name", "tenant": "Tenant",
              "namespace": "Namespace", "name": "Function Names"}
    return labels.get(name, name)


def _drop_empty(update: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in update.items() if v is not None}


_KNOWN = {f.name for f in fields(FunctionConfig)} - {"extra"}


def _from_mapping(data: Mapping[str, Any]) -> FunctionConfig:
    if not isinstance(data, Mapping):
        raise ConfigError("functionConfig must be a JSON object")
    data = dict(data)
    tenant = str(data.get("tenant") or "public")
    namespace = str(data.get("namespace") or "default")
    inputs: list[str] = []
    raw_inputs = data.pop("inputs", None) or []
    if isinstance(raw_inputs, str):
        raw_inputs = [t for t in raw_inputs.split(",") if t.strip()]
    if not isinstance(raw_inputs, (list, tuple)):
        raise ConfigError("inputs must be a list of topic names")
    inputs.extend(raw_inputs)
    specs = data.pop("inputSpecs", None) or {}
    if not isinstance(specs, Mapping):
        raise ConfigError("inputSpecs must be an object of topic -> spec")
    queue = data.pop("receiverQueueSize", None)
    for topic, spec in specs.items():
        inputs.append(topic)
        if isinstance(spec, Mapping) and spec.get("receiverQueueSize") is not None:
            queue = spec["receiverQueueSize"]
    for key in ("topicsPattern",):
        if data.get(key):
            raise ConfigError(f"{key} is not supported by this worker: list the topics in inputs")
    seen: list[str] = []
    for t in inputs:
        n = normalize_topic(t, tenant, namespace)
        if n not in seen:
            seen.append(n)
    output = data.pop("output", None)
    log_topic = data.pop("logTopic", None)
    user_config = data.pop("userConfig", None) or {}
    if isinstance(user_config, str):
        user_config = parse_text(user_config, "userConfig")
    if not isinstance(user_config, Mapping):
        raise ConfigError("userConfig must be an object")
    known = {k: data.pop(k) for k in list(data) if k in _KNOWN}
    try:
        return FunctionConfig(
            **known,
            inputs=tuple(seen),
            output=normalize_topic(output, tenant, namespace) if output else None,
            logTopic=normalize_topic(log_topic, tenant, namespace) if log_topic else None,
            userConfig=dict(user_config),
            receiverQueueSize=queue if queue is not None else DEFAULT_RECEIVER_QUEUE_SIZE,
            extra=data,
        )
    except TypeError as exc:  # pragma: no cover - keys are filtered above
        raise ConfigError(f"invalid functionConfig: {exc}") from exc


def validate(cfg: FunctionConfig, max_parallelism: int = DEFAULT_MAX_PARALLELISM) -> FunctionConfig:
    """Pulsar-style checks, each with a message that names the field."""
    for label, value in (("tenant", cfg.tenant), ("namespace", cfg.namespace), ("name", cfg.name)):
        if not value or not isinstance(value, str):
            raise ConfigError(f"Function {label} is not provided")
        if not _NAME_RE.match(value):
            raise ConfigError(f"Function {label} {value!r} contains invalid characters")
    runtime = str(cfg.runtime or "PYTHON").upper()
    if runtime not in RUNTIMES:
        raise ConfigError(f"runtime {cfg.runtime!r} is unknown: use one of {', '.join(RUNTIMES)}")
    if runtime != "PYTHON":
        raise ConfigError(f"runtime {runtime} is not supported by this worker: only PYTHON functions run here")
    if not cfg.className or not isinstance(cfg.className, str):
        raise ConfigError("Function classname cannot be null (set className, e.g. 'exclaim.Exclaim')")
    if not cfg.inputs:
        raise ConfigError("No input topic(s) specified for the function (set inputs)")
    if cfg.output and cfg.output in cfg.inputs:
        raise ConfigError(f"Output topic {cfg.output} is also an input topic of the function")
    if isinstance(cfg.parallelism, bool) or not isinstance(cfg.parallelism, int):
        raise ConfigError(f"parallelism must be an integer, got {cfg.parallelism!r}")
    if cfg.parallelism < 1:
        raise ConfigError(f"Function parallelism must be a positive number, got {cfg.parallelism}")
    if cfg.parallelism > max_parallelism:
        raise ConfigError(f"Function parallelism {cfg.parallelism} is above this worker's limit of {max_parallelism}")
    guarantees = str(cfg.processingGuarantees or "ATLEAST_ONCE").upper()
    if guarantees not in GUARANTEES:
        raise ConfigError(f"processingGuarantees {cfg.processingGuarantees!r} is unknown: use one of {', '.join(GUARANTEES)}")
    if guarantees not in SUPPORTED_GUARANTEES:
        raise ConfigError(f"processingGuarantees {guarantees} is not supported by this worker: use ATLEAST_ONCE or ATMOST_ONCE")
    if cfg.retainOrdering and cfg.retainKeyOrdering:
        raise ConfigError("retainOrdering and retainKeyOrdering cannot both be set")
    if isinstance(cfg.receiverQueueSize, bool) or not isinstance(cfg.receiverQueueSize, int) or cfg.receiverQueueSize < 1:
        raise ConfigError(f"inputSpecs receiverQueueSize must be a positive integer, got {cfg.receiverQueueSize!r}")
    if cfg.instanceRuntime not in (None, "thread", "process"):
        raise ConfigError(f"instanceRuntime {cfg.instanceRuntime!r} is unknown: use 'thread' or 'process'")
    return replace(cfg, runtime=runtime, processingGuarantees=guarantees)
