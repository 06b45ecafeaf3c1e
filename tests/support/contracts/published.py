"""Apache Pulsar's published Swagger 2.0 documents (files beside this one, unchanged), and the errata the
contract tests apply to them in memory, each one following what a Pulsar server does (README.md)."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

HERE = Path(__file__).parent
FUNCTIONS_DOC = HERE / "swaggerfunctions.json"
BROKER_DOC = HERE / "swagger-v2-topic-stats.json"
TOPIC_DELETE_DOC = HERE / "swagger-v2-topic-delete.json"  # our excerpt of the same v2 document (README.md)

# The multipart parts the server reads (@FormDataParam in FunctionsApiV3Resource). The published document
# lists them as several `in: body` parameters all named `body`, which is not valid Swagger 2.0.
# `x-pulsar-json` names the definition a JSON part must match.
_JSON_PART = {"type": "string", "in": "formData", "required": False}
MULTIPART_PARTS = {
    "FunctionsBase_registerFunction": [
        {"name": "data", "in": "formData", "type": "file", "required": False},
        {"name": "url", "in": "formData", "type": "string", "required": False},
        {**_JSON_PART, "name": "functionConfig", "x-pulsar-json": "#/definitions/FunctionConfig"},
    ],
    "FunctionsBase_updateFunction": [
        {"name": "data", "in": "formData", "type": "file", "required": False},
        {"name": "url", "in": "formData", "type": "string", "required": False},
        {**_JSON_PART, "name": "functionConfig", "x-pulsar-json": "#/definitions/FunctionConfig"},
        {**_JSON_PART, "name": "updateOptions", "x-pulsar-json": "#/definitions/UpdateOptions"},
    ],
    "FunctionsBase_triggerFunction": [
        {"name": "data", "in": "formData", "type": "string", "required": False},
        {"name": "dataStream", "in": "formData", "type": "file", "required": False},
        {"name": "topic", "in": "formData", "type": "string", "required": False},
    ],
}
_INSTANCE_TWINS = {"FunctionsBase_restartFunction", "FunctionsBase_startFunction", "FunctionsBase_stopFunction"}


def published(path: Path) -> dict:
    """The document exactly as published."""
    return json.loads(path.read_text())


@cache
def _functions() -> str:
    doc = published(FUNCTIONS_DOC)
    for path, ops in doc["paths"].items():
        for op in ops.values():
            if "{instanceId}" in path and op["operationId"] in _INSTANCE_TWINS:
                # Published with the same operationId as the whole-function operation (restart, start, stop):
                # operation ids must be unique in Swagger 2.0.
                op["operationId"] += "Instance"
            parts = MULTIPART_PARTS.get(op["operationId"])
            if parts is not None:
                op["parameters"] = [p for p in op["parameters"] if p["in"] != "body"] + copy.deepcopy(parts)
            if op["operationId"] == "FunctionsBase_listFunctions":
                # Published `type: string`; the server answers List<String> (a JSON array of names).
                op["responses"]["200"]["schema"] = {"type": "array", "items": {"type": "string"}}
    return json.dumps(doc)


def functions_doc() -> dict:
    """The functions v3 document with the errata: multipart parts as formData, unique operation ids,
    listFunctions an array."""
    return json.loads(_functions())


def broker_doc() -> dict:
    """The v2 topic-stats excerpt needs no erratum (it validates as published)."""
    return published(BROKER_DOC)


def topic_delete_doc() -> dict:
    """Our excerpt with deleteTopic (how the worker drops a deleted function's state topics): no erratum."""
    return published(TOPIC_DELETE_DOC)
