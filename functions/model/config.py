"""Pulsar's FunctionConfig, with Pulsar's field names, validation and derived values.

Every field of Pulsar's published FunctionConfig schema is either honoured with Pulsar's
semantics or refused with a 400 that names it (docs/function-config.md); a field that is
not in the schema is refused too, so nothing is accepted and then silently ignored
(refused_fields.py). Types are strict (coerce.py): `retainOrdering: "false"` is an error,
not a truthy string. Parsing: config_parse.py; checks across fields: config_validation.py.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.coerce import type_name
from pulsar_autoscale.functions.model.config_parse import config_fields, parse_text, read_config_file
from pulsar_autoscale.functions.model.config_parts import DEFAULT_RECEIVER_QUEUE_SIZE, ProducerConfig, Resources
from pulsar_autoscale.functions.model.config_validation import DEFAULT_MAX_PARALLELISM, validate
from pulsar_autoscale.functions.model.keygroups import DEFAULT_NUM_KEY_GROUPS

# 128 groups / 16 = 8 a shard: a subscale's open reads about 1/16 of the tail (BENCHMARKS.md, changelog shards)
DEFAULT_KEYED_CHANGELOG_SHARDS = 16
# Fields Pulsar refuses to change on update ("... cannot be altered").
IMMUTABLE_FIELDS = (
    "inputs",
    "topicsPattern",
    "processingGuarantees",
    "retainOrdering",
    "retainKeyOrdering",
    "runtime",
    "subName",
    "tenant",
    "namespace",
    "name",
    "numKeyGroups",
    "keyedState",
    "stateId",
    "changelogShards",
)


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
    customSerdeInputs: dict[str, str] = field(default_factory=dict)  # topic -> serde class
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
        d["inputSpecs"] = {
            t: {
                "receiverQueueSize": self.receiverQueueSize,
                **({"serdeClassName": self.customSerdeInputs[t]} if t in self.customSerdeInputs else {}),
            }
            for t in self.inputs
        }
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
            raise ConfigError(f"functionConfig must be a JSON object, got {type_name(update)}")
        base = self.to_dict()
        if update.get("receiverQueueSize") is not None and "inputSpecs" not in update:
            # The shorthand in an update replaces the per-input value the current config shows.
            base["inputSpecs"] = {
                t: {k: v for k, v in spec.items() if k != "receiverQueueSize"} for t, spec in base["inputSpecs"].items()
            }
        new = _from_mapping({**base, **_drop_empty(update)})
        for name in IMMUTABLE_FIELDS:
            if name in update and update[name] not in (None, "", [], {}) and getattr(new, name) != getattr(self, name):
                raise ConfigError(f"{_pulsar_label(name)} cannot be altered")
        new = validate(new, max_parallelism, min_parallelism=0)  # 0: scaled to zero, the subscription stays
        if new == self:
            raise ConfigError("Update contains no change")
        return new


def _pulsar_label(name: str) -> str:
    labels = {
        "inputs": "Input Topics",
        "processingGuarantees": "Processing Guarantees",
        "retainOrdering": "Retain Ordering",
        "retainKeyOrdering": "Retain Key Ordering",
        "runtime": "Runtime",
        "subName": "Subscription Name",
        "tenant": "Tenant",
        "namespace": "Namespace",
        "name": "Function Names",
        "topicsPattern": "Topics Pattern",
    }
    return labels.get(name, name)


def _drop_empty(update: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in update.items() if v is not None}


def _from_mapping(data: Mapping[str, Any]) -> FunctionConfig:
    return FunctionConfig(**config_fields(data))


def with_new_state(cfg: FunctionConfig) -> FunctionConfig:
    """The config of a function being created: a stateId of its own and its changelog's shards (see both fields)."""
    if cfg.stateId:
        raise ConfigError("stateId is assigned by the worker when a function is created; leave it out")
    shards = cfg.changelogShards or (min(DEFAULT_KEYED_CHANGELOG_SHARDS, cfg.numKeyGroups) if cfg.keyedState else 1)
    return replace(cfg, stateId=uuid.uuid4().hex[:12], changelogShards=shards)
