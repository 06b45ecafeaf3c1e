"""Which fields a function config may name: Pulsar's published schema and ours; schema fields this worker refuses,
each with why, so nothing is accepted and then silently ignored (docs/function-config.md)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.coerce import is_empty

# Pulsar's Java default for asynchronous functions; Python functions are synchronous, so only it is accepted.
PULSAR_MAX_PENDING_ASYNC_REQUESTS = 1000

SCHEMA_FIELDS = {
    "autoAck",
    "batchBuilder",
    "className",
    "cleanupSubscription",
    "customRuntimeOptions",
    "customSchemaInputs",
    "customSchemaOutputs",
    "customSerdeInputs",
    "deadLetterTopic",
    "exposePulsarAdminClientEnabled",
    "forwardSourceMessageProperty",
    "fqfn",
    "functionType",
    "go",
    "inputSpecs",
    "inputTypeClassName",
    "inputs",
    "jar",
    "logTopic",
    "maxMessageRetries",
    "maxPendingAsyncRequests",
    "name",
    "namespace",
    "output",
    "outputSchemaType",
    "outputSerdeClassName",
    "outputTypeClassName",
    "parallelism",
    "processingGuarantees",
    "producerConfig",
    "py",
    "resources",
    "retainKeyOrdering",
    "retainOrdering",
    "runtime",
    "runtimeFlags",
    "secrets",
    "skipToLatest",
    "subName",
    "subscriptionPosition",
    "tenant",
    "timeoutMs",
    "topicsPattern",
    "userConfig",
    "windowConfig",
}
# Ours: the runtime of the instances, the state's key groups, key-group routing, a shorthand for every
# inputSpecs.<topic>.receiverQueueSize, and the id in the state topics' names.
OUR_FIELDS = {"instanceRuntime", "numKeyGroups", "keyedState", "receiverQueueSize", "stateId", "changelogShards"}
# Fields of the published schema this worker refuses, with why (docs/function-config.md).
REFUSED = {
    "jar": "only Python functions run here (set py)",
    "go": "only Python functions run here (set py)",
    "inputTypeClassName": "it is a Java type; Python functions use serde classes (customSerdeInputs)",
    "outputTypeClassName": "it is a Java type; Python functions use serde classes (outputSerdeClassName)",
    "outputSchemaType": "functions here exchange bytes through serde classes, not Pulsar schemas (use outputSerdeClassName)",
    "customSchemaInputs": "functions here exchange bytes through serde classes, not Pulsar schemas (use customSerdeInputs)",
    "customSchemaOutputs": "functions here exchange bytes through serde classes, not Pulsar schemas (use outputSerdeClassName)",
    "windowConfig": 'Pulsar itself refuses windowed Python functions ("There is currently no support windowing in '
    'python"); keep a window in state (context.put_state) or use a Spark stateful stage',
    "runtimeFlags": "instances are threads or processes of this worker, started without interpreter flags",
    "functionType": "it is set by Pulsar's own function types (sources, sinks), not by a function config",
}
# Refused unless given Pulsar's default (which is what a Python function gets here anyway).
REFUSED_UNLESS = {
    "maxPendingAsyncRequests": (
        PULSAR_MAX_PENDING_ASYNC_REQUESTS,
        "Python functions are synchronous; only Java async functions have pending requests",
    ),
    "exposePulsarAdminClientEnabled": (False, "the Python Context has no Pulsar admin client"),
}


def refuse_unsupported(data: Mapping[str, Any]) -> None:
    for key in data:
        if not isinstance(key, str) or (key not in SCHEMA_FIELDS and key not in OUR_FIELDS):
            raise ConfigError(f"{key!r} is not a FunctionConfig field (Pulsar's published schema); check the spelling")
    for key, why in REFUSED.items():
        if not is_empty(data.get(key)):
            raise ConfigError(f"{key} is not supported by this worker: {why}")
    for key, (allowed, why) in REFUSED_UNLESS.items():
        if data.get(key) is not None and data[key] != allowed:
            raise ConfigError(f"{key} is not supported by this worker (only {json.dumps(allowed)}): {why}")
    runtime = data.get("runtime")
    if isinstance(runtime, str) and runtime.upper() in ("JAVA", "GO"):
        raise ConfigError(f"runtime {runtime.upper()} is not supported by this worker: only PYTHON functions run here")
