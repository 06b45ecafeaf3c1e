"""FunctionConfig's checks that span fields, as Pulsar makes them, each with a message that names the field."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.migration_settings import keyed_migration
from pulsar_autoscale.topics import INTERNAL_PREFIX, is_internal, normalize_topic

if TYPE_CHECKING:
    from pulsar_autoscale.functions.model.config import FunctionConfig

DEFAULT_MAX_PARALLELISM = 64
# The Pulsar C++/Python client refuses an ack timeout below 10 s ("Ack timeout should be greater than 10s").
MIN_TIMEOUT_MS = 10_000
_STATE_ID_RE = re.compile(r"^[0-9a-f]{1,32}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-=:]*$")


def validate(cfg: FunctionConfig, max_parallelism: int = DEFAULT_MAX_PARALLELISM, min_parallelism: int = 1) -> FunctionConfig:
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
        raise ConfigError(
            "topicsPattern and inputs cannot both be set on this worker (one consumer per function "
            "instance): put the topics in the pattern, or list them in inputs"
        )
    for label, topic in [("input", i) for i in cfg.inputs] + [
        ("output", cfg.output),
        ("logTopic", cfg.logTopic),
        ("deadLetterTopic", cfg.deadLetterTopic),
    ]:
        if topic and is_internal(topic):
            raise ConfigError(
                f"{label} {topic} is one of pulsar-autoscale's own coordination topics "
                f"({INTERNAL_PREFIX}*): a function may not read or write it"
            )
    if cfg.output and cfg.output in cfg.inputs:
        raise ConfigError(f"Output topic {cfg.output} is also an input topic of the function")
    if cfg.parallelism < min_parallelism:
        raise ConfigError(f"Function parallelism must be a positive number, got {cfg.parallelism}")
    if cfg.parallelism > max_parallelism:
        raise ConfigError(f"Function parallelism {cfg.parallelism} is above this worker's limit of {max_parallelism}")
    if cfg.processingGuarantees == "ATMOST_ONCE" and not cfg.autoAck:
        raise ConfigError("autoAck must be true when processingGuarantees is ATMOST_ONCE (as Pulsar requires)")
    if cfg.processingGuarantees == "ATMOST_ONCE" and cfg.maxMessageRetries is not None:
        raise ConfigError(
            "maxMessageRetries needs ATLEAST_ONCE or MANUAL processingGuarantees: "
            "ATMOST_ONCE acks on receipt, so nothing is redelivered"
        )
    if cfg.processingGuarantees == "EFFECTIVELY_ONCE" and not cfg.autoAck:
        raise ConfigError(
            "autoAck must be true when processingGuarantees is EFFECTIVELY_ONCE: the instance applies "
            "a message's state changes and its ack once (docs/state.md)"
        )
    if cfg.retainOrdering and cfg.retainKeyOrdering:
        raise ConfigError("retainOrdering and retainKeyOrdering cannot both be set")
    if cfg.maxMessageRetries == 0:
        raise ConfigError(
            "maxMessageRetries must be at least 1 (the Pulsar client's dead-letter policy needs "
            "maxRedeliverCount > 0); leave it unset or -1 to retry forever"
        )
    if cfg.deadLetterTopic and cfg.maxMessageRetries is None:
        raise ConfigError("Dead Letter Topic specified, however max retries is set to infinity (set maxMessageRetries)")
    if cfg.deadLetterTopic and cfg.deadLetterTopic in cfg.inputs:
        raise ConfigError(f"deadLetterTopic {cfg.deadLetterTopic} is also an input topic of the function")
    if cfg.timeoutMs is not None and cfg.timeoutMs < MIN_TIMEOUT_MS:
        raise ConfigError(
            f"timeoutMs must be at least {MIN_TIMEOUT_MS} (the Pulsar Python client's minimum ack timeout), got {cfg.timeoutMs}"
        )
    if cfg.instanceRuntime not in (None, "thread", "process"):
        raise ConfigError(f"instanceRuntime {cfg.instanceRuntime!r} is unknown: use 'thread' or 'process'")
    if cfg.stateId and not _STATE_ID_RE.match(cfg.stateId):
        raise ConfigError(f"stateId {cfg.stateId!r} is not one the worker assigns (hex digits)")
    if cfg.changelogShards > cfg.numKeyGroups:
        raise ConfigError(
            f"changelogShards ({cfg.changelogShards}) must be at most numKeyGroups "
            f"({cfg.numKeyGroups}): a shard holds whole key groups"
        )
    keyed_migration(cfg)
    return cfg


def topics_outside(tenant: str, data: dict) -> list[str]:
    """The topics a raw function config names (inputs, inputSpecs, output, logTopic, deadLetterTopic,
    topicsPattern) that are not in `tenant`. Short names resolve as Pulsar resolves them, to public/default;
    a name that is no topic at all is left to validate(), which says what is wrong with it."""
    named = [*(data.get("inputs") or []), *(data.get("inputSpecs") or {})]
    named += [data.get(key) for key in ("output", "logTopic", "deadLetterTopic", "topicsPattern")]
    outside = []
    for topic in named:
        if not isinstance(topic, str) or not topic.strip():
            continue
        try:
            full = normalize_topic(topic)
        except ConfigError:
            continue
        if full.split("://", 1)[1].split("/", 1)[0] != tenant:
            outside.append(topic)
    return outside
