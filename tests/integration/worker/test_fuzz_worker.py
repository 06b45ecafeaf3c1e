"""Fuzzing our worker's Functions API v3 with requests generated from Apache Pulsar's published document
(tests/support/contracts/swaggerfunctions.json, with its errata): no answer is a 5xx, and the worker serves afterwards.

Two generated suites, bounded for CI (MAX_EXAMPLES per operation, derandomized so a run is repeatable):
- the document's operations as Pulsar's server reads them (multipart `functionConfig` parts are strings);
- the same create and update operations with a JSON `FunctionConfig` body (our worker also accepts one),
  so the generated configs are structured objects that reach the field checks.
Every case is counted; `test_worker_serves_after_the_fuzz` prints the totals.
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis import GenerationMode

from pulsar_autoscale.functions.api.server import WorkerServer
from tests.support.contracts.published import functions_doc
from tests.support.scenario import EXAMPLES

pytestmark = pytest.mark.fuzz  # not under pytest-xdist (the marker's description in pyproject.toml)
MAX_EXAMPLES = 25
SEEN: Counter = Counter()  # (suite, status class) -> cases


def _json_body_variant() -> dict:
    """register/update with `in: body` FunctionConfig and application/json: what our worker accepts too."""
    doc = functions_doc()
    path = doc["paths"]["/functions/{tenant}/{namespace}/{functionName}"]
    doc["paths"] = {"/functions/{tenant}/{namespace}/{functionName}": {m: path[m] for m in ("post", "put")}}
    for op in doc["paths"]["/functions/{tenant}/{namespace}/{functionName}"].values():
        op["consumes"] = ["application/json"]
        op["parameters"] = [p for p in op["parameters"] if p["in"] == "path"] + [
            {"name": "body", "in": "body", "required": True, "schema": {"$ref": "#/definitions/FunctionConfig"}}
        ]
        op["operationId"] += "Json"
    return copy.deepcopy(doc)


def _bounded(doc: dict):
    schema = schemathesis.openapi.from_dict(doc)
    schema.config.generation.update(
        max_examples=MAX_EXAMPLES, deterministic=True, modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE]
    )
    schema.config.phases.update(phases=PHASES)
    return schema


PHASES = ["examples", "fuzzing"]  # the "coverage" phase adds ~800 boundary cases per operation: too slow for CI
published_schema = _bounded(functions_doc())
json_schema = _bounded(_json_body_variant())
FUZZ = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def fuzz_worker(broker, tmp_path_factory):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path_factory.mktemp("fuzz")), metrics_url=broker.metrics_url) as w:
        # One real function, so generated names sometimes reach a function that exists.
        files = {
            "functionConfig": (None, '{"className": "exclaim.Exclaim", "inputs": ["fuzz-in"]}'),
            "data": ("exclaim.py", (EXAMPLES / "exclaim.py").read_bytes()),
        }
        resp = requests.post(f"{w.url}/admin/v3/functions/public/default/fuzz", files=files, timeout=30)
        assert resp.status_code == 204, resp.text
        yield w


def _call(case, worker, suite: str) -> None:
    resp = case.call(base_url=worker.url + "/admin/v3", timeout=30)
    SEEN[(suite, f"{resp.status_code // 100}xx")] += 1
    assert resp.status_code < 500, f"{case.method} {case.formatted_path}: {resp.status_code} {resp.text[:500]}"


@published_schema.parametrize()
@FUZZ
def test_published_operations_never_answer_5xx(case, fuzz_worker):
    _call(case, fuzz_worker, "published")


@json_schema.parametrize()
@FUZZ
def test_generated_function_configs_never_answer_5xx(case, fuzz_worker):
    _call(case, fuzz_worker, "json-config")


def test_worker_serves_after_the_fuzz(fuzz_worker):
    assert requests.get(fuzz_worker.url + "/healthz", timeout=5).status_code == 200
    status = requests.get(f"{fuzz_worker.url}/admin/v3/functions/public/default/fuzz/status", timeout=5)
    assert status.status_code in (200, 404), status.text  # the fuzz may have deleted it: that is allowed
    print("fuzz cases:", dict(sorted(SEEN.items())), "total", sum(SEEN.values()))
