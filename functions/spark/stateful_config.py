"""A stateful stage's configuration (StatefulStageConfig) and its checks.

The fields, their camelCase forms (REST bodies, config files) and the validation that names the field at
fault; the stage that runs a configuration is stateful.py's StatefulStage.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.topics import normalize_topic

AGGREGATIONS = ("count",)
STATE_STORES = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}
AVAILABLE_NOW = "availableNow"

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-=:]*$")
_DURATION_RE = re.compile(r"^\s*\d+\s+(millisecond|second|minute|hour|day)s?\s*$", re.IGNORECASE)
_PROPERTY_KEY = "property:"


@dataclass(frozen=True)
class StatefulStageConfig:
    """One stateful stage, configured next to the functions (same tenant/namespace/name)."""

    name: str
    input: str
    output: str
    checkpoint_dir: str
    tenant: str = "public"
    namespace: str = "default"
    service_url: str = "pulsar://localhost:6650"
    key: str = "key"  # "key" (message key) or "property:<name>"
    aggregation: str = "count"
    window: str | None = None  # tumbling event-time window, e.g. "1 minute"; None: per key only
    event_time: str = "eventTime"  # "eventTime" (publishTime when unset) or "publishTime"
    allowed_lateness: str = "0 seconds"  # watermark delay; a window's final count comes out after it
    parallelism: int = 1  # input partitions per micro-batch (source minPartitions)
    state_partitions: int | None = None  # fixed at the checkpoint's first start; default: parallelism
    trigger: str = "1 second"  # processing-time interval, or "availableNow"
    max_records_per_trigger: int | None = None
    state_store: str = "rocksdb"
    max_parallelism: int = 64

    @property
    def fqfn(self) -> str:
        return f"{self.tenant}/{self.namespace}/{self.name}"

    @property
    def key_property(self) -> str | None:
        return self.key[len(_PROPERTY_KEY) :] if self.key.startswith(_PROPERTY_KEY) else None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StatefulStageConfig":
        """Accepts the field names or their camelCase forms (checkpointDir, maxRecordsPerTrigger, ...)."""
        names = {f.name for f in fields(cls)}
        by_camel = {_camel(n): n for n in names}
        kwargs, unknown = {}, []
        for k, v in data.items():
            name = k if k in names else by_camel.get(k)
            if name is None:
                unknown.append(k)
            else:
                kwargs[name] = v
        if unknown:
            raise ConfigError(f"stateful stage: unknown field(s) {sorted(unknown)}; known: {sorted(by_camel)}")
        missing = sorted(_camel(n) for n in ("name", "input", "output", "checkpoint_dir") if n not in kwargs)
        if missing:
            raise ConfigError(f"stateful stage: missing required field(s) {missing}")
        return cls(**kwargs).validated()

    def to_dict(self) -> dict[str, Any]:
        return {_camel(k): v for k, v in asdict(self).items()}

    def validated(self) -> "StatefulStageConfig":
        """Checks every field, naming it; returns the config with full topic names."""
        for label in ("tenant", "namespace", "name"):
            value = getattr(self, label)
            if not isinstance(value, str) or not _NAME_RE.match(value):
                raise ConfigError(f"stateful stage: {label} {value!r} is missing or has invalid characters")
        src = normalize_topic(self.input, self.tenant, self.namespace)
        dst = normalize_topic(self.output, self.tenant, self.namespace)
        if src == dst:
            raise ConfigError(f"stateful stage {self.fqfn}: output topic {dst} is also its input")
        if not str(self.service_url).startswith(("pulsar://", "pulsar+ssl://")):
            raise ConfigError(f"stateful stage {self.fqfn}: serviceUrl {self.service_url!r} must start with pulsar://")
        if not self.checkpoint_dir:
            raise ConfigError(f"stateful stage {self.fqfn}: checkpointDir is required (state lives there)")
        if self.key != "key" and not (self.key_property or "").strip():
            raise ConfigError(f"stateful stage {self.fqfn}: key {self.key!r}: use 'key' or 'property:<name>'")
        if self.aggregation not in AGGREGATIONS:
            raise ConfigError(f"stateful stage {self.fqfn}: aggregation {self.aggregation!r}: use one of {AGGREGATIONS}")
        if self.event_time not in ("eventTime", "publishTime"):
            raise ConfigError(f"stateful stage {self.fqfn}: eventTime {self.event_time!r}: use eventTime or publishTime")
        for label in ("window", "allowed_lateness"):
            value = getattr(self, label)
            if value is not None and not _DURATION_RE.match(str(value)):
                raise ConfigError(f"stateful stage {self.fqfn}: {_camel(label)} {value!r} is not a duration like '1 minute'")
        if self.trigger != AVAILABLE_NOW and not _DURATION_RE.match(str(self.trigger)):
            raise ConfigError(
                f"stateful stage {self.fqfn}: trigger {self.trigger!r}: use a duration like '1 second' or {AVAILABLE_NOW!r}"
            )
        if self.state_store not in STATE_STORES:
            raise ConfigError(f"stateful stage {self.fqfn}: stateStore {self.state_store!r}: use one of {sorted(STATE_STORES)}")
        check_parallelism(self.parallelism, self.max_parallelism, "parallelism")
        if self.state_partitions is not None:
            check_parallelism(self.state_partitions, self.max_parallelism, "statePartitions")
        if self.max_records_per_trigger is not None:
            check_parallelism(self.max_records_per_trigger, None, "maxRecordsPerTrigger")
        return replace(self, input=src, output=dst)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def check_parallelism(value: Any, maximum: int | None, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"stateful stage: {label} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"stateful stage: {label} {value} is above maxParallelism {maximum}")
    return value
