"""Parsing a function config: JSON or YAML text, then Pulsar's mapping (with its inputSpecs, producerConfig and
resources objects) to FunctionConfig's fields, each of strict type."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.coerce import (
    as_bool,
    as_enum,
    as_int,
    as_number,
    as_object,
    as_str,
    as_str_map,
    is_empty,
    or_default,
    type_name,
    wrong,
)
from pulsar_autoscale.functions.model.config_parts import (
    BATCH_BUILDERS,
    COMPRESSION_TYPES,
    DEFAULT_RECEIVER_QUEUE_SIZE,
    DEFAULT_RESOURCES,
    GUARANTEES,
    RUNTIMES,
    SUBSCRIPTION_POSITIONS,
    ProducerConfig,
    Resources,
)
from pulsar_autoscale.functions.model.keygroups import DEFAULT_NUM_KEY_GROUPS, MAX_NUM_KEY_GROUPS
from pulsar_autoscale.functions.model.refused_fields import refuse_unsupported
from pulsar_autoscale.topics import normalize_topic

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_CONSUMER_FIELDS = {
    "receiverQueueSize",
    "serdeClassName",
    "regexPattern",
    "schemaType",
    "schemaProperties",
    "consumerProperties",
    "cryptoConfig",
    "poolMessages",
}
_PRODUCER_FIELDS = {
    "maxPendingMessages",
    "maxPendingMessagesAcrossPartitions",
    "compressionType",
    "batchBuilder",
    "useThreadLocalProducers",
    "cryptoConfig",
}


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
        raise ConfigError(f"{source} must be a JSON/YAML object, got {type_name(data)}")
    return data


def _input_specs(data: Mapping[str, Any]) -> tuple[list[str], dict[str, str], int | None, list[str]]:
    """inputSpecs -> (topics, serde per topic, receiverQueueSize, regex patterns)."""
    specs = as_object("inputSpecs", data.get("inputSpecs"))
    topics: list[str] = []
    serdes: dict[str, str] = {}
    patterns: list[str] = []
    queues: set[int] = set()
    for topic, spec in specs.items():
        where = f"inputSpecs.{topic}"
        spec = as_object(where, spec)
        unknown = set(spec) - _CONSUMER_FIELDS
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]} is not a ConsumerConfig field")
        for key in ("schemaType", "schemaProperties", "consumerProperties", "cryptoConfig"):
            if not is_empty(spec.get(key)):
                raise ConfigError(
                    f"{where}.{key} is not supported by this worker: functions here exchange bytes "
                    "through serde classes (serdeClassName), without schemas or encryption"
                )
        if as_bool(f"{where}.poolMessages", spec.get("poolMessages")):
            raise ConfigError(f"{where}.poolMessages is not supported by this worker: it is a Java client option")
        q = as_int(f"{where}.receiverQueueSize", spec.get("receiverQueueSize"), 1, INT32_MAX)
        if q is not None:
            queues.add(q)
        if as_bool(f"{where}.regexPattern", spec.get("regexPattern")):
            patterns.append(topic)
            continue
        topics.append(topic)
        serde = as_str(f"{where}.serdeClassName", spec.get("serdeClassName"))
        if serde:
            serdes[topic] = serde
    if len(queues) > 1:
        raise ConfigError(
            f"inputSpecs: receiverQueueSize differs between topics ({sorted(queues)}); "
            "this worker opens one consumer for all inputs of a function: give one value"
        )
    return topics, serdes, (queues.pop() if queues else None), patterns


def config_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """Pulsar's mapping to FunctionConfig's keyword arguments (validate checks how they go together)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"functionConfig must be a JSON object, got {type_name(data)}")
    refuse_unsupported(data)
    tenant = as_str("tenant", data.get("tenant")) or "public"
    namespace = as_str("namespace", data.get("namespace")) or "default"
    name = as_str("name", data.get("name")) or ""
    fqfn = as_str("fqfn", data.get("fqfn"))
    if fqfn and fqfn != f"{tenant}/{namespace}/{name}":
        raise ConfigError(f"fqfn {fqfn!r} does not match tenant/namespace/name {tenant}/{namespace}/{name}")

    raw_inputs = data.get("inputs")
    if raw_inputs is None:
        raw_inputs = []
    if not isinstance(raw_inputs, (list, tuple)):
        raise wrong("inputs", "an array of topic names", raw_inputs)
    for i, t in enumerate(raw_inputs):
        as_str(f"inputs[{i}]", t)
    spec_topics, spec_serdes, queue, patterns = _input_specs(data)
    custom_serdes = as_str_map("customSerdeInputs", data.get("customSerdeInputs"))
    pattern = as_str("topicsPattern", data.get("topicsPattern"))
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
        value = as_str(name_, data.get(name_))
        return normalize_topic(value, tenant, namespace) if value else None

    user_config = data.get("userConfig")
    if isinstance(user_config, str):  # pulsar-admin's --user-config sends a JSON string
        user_config = parse_text(user_config, "userConfig")
    resources = None
    if data.get("resources") is not None:
        raw = as_object("resources", data["resources"])
        unknown = set(raw) - {"cpu", "ram", "disk"}
        if unknown:
            raise ConfigError(f"resources.{sorted(unknown)[0]} is not a Resources field (cpu, ram, disk)")
        cpu = as_number("resources.cpu", raw.get("cpu"))  # None only where cpu is absent (or null)
        # DEFAULT_RESOURCES mixes a float with ints, so its values read as floats: ram's and disk's are ints
        resources = Resources(
            cpu=DEFAULT_RESOURCES["cpu"] if cpu is None else cpu,
            ram=as_int("resources.ram", raw.get("ram"), 1, INT64_MAX) or int(DEFAULT_RESOURCES["ram"]),
            disk=as_int("resources.disk", raw.get("disk"), 1, INT64_MAX) or int(DEFAULT_RESOURCES["disk"]),
        )
        if resources.cpu <= 0:
            raise ConfigError(f"resources.cpu must be a positive number, got {resources.cpu}")
    producer, batch_builder = _producer_config(data)
    max_retries = as_int("maxMessageRetries", data.get("maxMessageRetries"), -1, INT32_MAX)
    queue = as_int("receiverQueueSize", data.get("receiverQueueSize"), 1, INT32_MAX) if queue is None else queue
    options = data.get("customRuntimeOptions")
    if isinstance(options, Mapping):  # written as YAML/JSON object: Pulsar's field is a JSON string
        options = json.dumps(options)
    return dict(
        tenant=tenant,
        namespace=namespace,
        name=name,
        className=as_str("className", data.get("className")) or "",
        py=as_str("py", data.get("py")),
        inputs=tuple(seen),
        topicsPattern=pattern or None,
        output=topic("output"),
        parallelism=as_int("parallelism", data.get("parallelism"), -INT32_MAX, INT32_MAX)
        if "parallelism" in data and data["parallelism"] is not None
        else 1,
        processingGuarantees=as_enum("processingGuarantees", data.get("processingGuarantees"), GUARANTEES) or "ATLEAST_ONCE",
        retainOrdering=bool(as_bool("retainOrdering", data.get("retainOrdering"))),
        retainKeyOrdering=bool(as_bool("retainKeyOrdering", data.get("retainKeyOrdering"))),
        subName=as_str("subName", data.get("subName")) or None,
        subscriptionPosition=as_enum("subscriptionPosition", data.get("subscriptionPosition"), SUBSCRIPTION_POSITIONS)
        or "Latest",
        skipToLatest=bool(as_bool("skipToLatest", data.get("skipToLatest"))),
        cleanupSubscription=or_default(as_bool("cleanupSubscription", data.get("cleanupSubscription")), True),
        userConfig=as_object("userConfig", user_config),
        secrets=as_object("secrets", data.get("secrets")),
        logTopic=topic("logTopic"),
        runtime=as_enum("runtime", data.get("runtime"), RUNTIMES) or "PYTHON",
        autoAck=or_default(as_bool("autoAck", data.get("autoAck")), True),
        maxMessageRetries=None if max_retries is None or max_retries < 0 else max_retries,
        deadLetterTopic=topic("deadLetterTopic"),
        timeoutMs=as_int("timeoutMs", data.get("timeoutMs"), 1, INT64_MAX),
        receiverQueueSize=queue if queue is not None else DEFAULT_RECEIVER_QUEUE_SIZE,
        customSerdeInputs=serdes,
        outputSerdeClassName=as_str("outputSerdeClassName", data.get("outputSerdeClassName")) or None,
        forwardSourceMessageProperty=or_default(
            as_bool("forwardSourceMessageProperty", data.get("forwardSourceMessageProperty")), True
        ),
        batchBuilder=batch_builder,
        producerConfig=producer,
        resources=resources,
        customRuntimeOptions=as_str("customRuntimeOptions", options) or None,
        instanceRuntime=as_str("instanceRuntime", data.get("instanceRuntime")),
        numKeyGroups=or_default(as_int("numKeyGroups", data.get("numKeyGroups"), 1, MAX_NUM_KEY_GROUPS), DEFAULT_NUM_KEY_GROUPS),
        keyedState=bool(as_bool("keyedState", data.get("keyedState"))),
        stateId=as_str("stateId", data.get("stateId")) or "",
        changelogShards=as_int("changelogShards", data.get("changelogShards"), 1, MAX_NUM_KEY_GROUPS) or 0,
    )


def _producer_config(data: Mapping[str, Any]) -> tuple[ProducerConfig | None, str | None]:
    batch_builder = as_enum("batchBuilder", data.get("batchBuilder"), BATCH_BUILDERS)
    if data.get("producerConfig") is None:
        return None, batch_builder
    raw = as_object("producerConfig", data["producerConfig"])
    unknown = set(raw) - _PRODUCER_FIELDS
    if unknown:
        raise ConfigError(f"producerConfig.{sorted(unknown)[0]} is not a ProducerConfig field")
    if not is_empty(raw.get("cryptoConfig")):
        raise ConfigError("producerConfig.cryptoConfig is not supported by this worker: no end-to-end encryption")
    if as_bool("producerConfig.useThreadLocalProducers", raw.get("useThreadLocalProducers")):
        raise ConfigError("producerConfig.useThreadLocalProducers is not supported by this worker: it is a Java runtime option")
    cfg = ProducerConfig(
        maxPendingMessages=as_int("producerConfig.maxPendingMessages", raw.get("maxPendingMessages"), 1, INT32_MAX),
        maxPendingMessagesAcrossPartitions=as_int(
            "producerConfig.maxPendingMessagesAcrossPartitions", raw.get("maxPendingMessagesAcrossPartitions"), 1, INT32_MAX
        ),
        compressionType=as_enum("producerConfig.compressionType", raw.get("compressionType"), COMPRESSION_TYPES),
        batchBuilder=as_enum("producerConfig.batchBuilder", raw.get("batchBuilder"), BATCH_BUILDERS),
    )
    return cfg, batch_builder or cfg.batchBuilder
