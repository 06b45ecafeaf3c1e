"""A fake stock Pulsar cluster that checks every request against Apache Pulsar's published swagger documents.

Each ``FakeHost`` is a real HTTP server (werkzeug, loopback, a free port, optionally TLS with client
certificates) sharing one ``ClusterState``. For every request it finds the documented operation
(path template and method), then checks path parameters, query parameters (declared, typed),
the multipart parts of a multipart operation (declared names; JSON parts against their definition,
with unknown fields refused: Pulsar would ignore a misspelt field silently) and answers a body that
is validated against the documented response schema before it is sent. Anything undocumented is
recorded in ``state.violations``; a test asserts that list stays empty.

The documents are the published ones (``published.py``, with its errata). Beyond them: ``/metrics`` (Prometheus text of the worker), 401/403 by credentials, 307
redirects to another host, and deliberately malformed answers (``state.malformed``), which are the
only bodies sent without validation.
"""

from __future__ import annotations

import json
import re
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import jsonschema
from flask import Flask, Response, request
from werkzeug.serving import make_server

from tests.support.contracts.published import (
    BROKER_DOC,
    FUNCTIONS_DOC,
    TOPIC_DELETE_DOC,
    broker_doc,
    functions_doc,
    topic_delete_doc,
)


class Contract:
    """One swagger 2.0 document: route matching and request/response validation."""

    def __init__(self, doc: dict, name: str):
        self.doc, self.name = doc, name
        base = self.doc["basePath"].rstrip("/")
        self.routes = []
        for template, ops in self.doc["paths"].items():
            names = re.findall(r"{(\w+)}", template)
            regex = re.escape(base + template)
            for n in names:
                regex = regex.replace(re.escape("{" + n + "}"), f"(?P<{n}>[^/]+)")
            self.routes.append((re.compile(f"^{regex}$"), template, ops))

    def schema(self, schema: dict) -> dict:
        return {**schema, "definitions": self.doc["definitions"]}

    def match(self, path: str):
        for regex, template, ops in self.routes:
            m = regex.match(path)
            if m:
                return template, ops, m.groupdict()
        return None

    def check(self, schema: dict, value: Any, where: str, strict: bool = False) -> list[str]:
        full = self.schema(schema)
        if strict:
            full = _strict(full)
        return [
            f"{where}: {e.message} (at {'/'.join(map(str, e.absolute_path)) or 'top'})"
            for e in jsonschema.Draft4Validator(full).iter_errors(value)
        ]


def _strict(node):
    """The same schema with additionalProperties false wherever properties are listed."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in node and "additionalProperties" not in node:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


_BOOL = {"true", "false"}


def validate_request(contract: Contract, op: dict, path_params: dict, req) -> list[str]:
    """Problems of one request against one documented operation (empty: conforms)."""
    problems = []
    params = op.get("parameters", [])
    where = f"{req.method} {req.path}"
    for p in params:
        if p["in"] == "path" and not path_params.get(p["name"]):
            problems.append(f"{where}: path parameter {p['name']} missing")
    declared_q = {p["name"]: p for p in params if p["in"] == "query"}
    for name in req.args:
        if name not in declared_q:
            problems.append(f"{where}: undocumented query parameter {name!r}")
        elif declared_q[name]["type"] == "boolean" and req.args[name] not in _BOOL:
            problems.append(f"{where}: query {name}={req.args[name]!r} is not a boolean")
    form = {p["name"]: p for p in params if p["in"] == "formData"}
    consumes = op.get("consumes", contract.doc.get("consumes", []))
    if form:
        if req.mimetype not in consumes:
            problems.append(f"{where}: content type {req.mimetype!r}, documented {consumes}")
        parts = set(req.form) | set(req.files)
        for name in parts - set(form):
            problems.append(f"{where}: undocumented multipart part {name!r}")
        for name, p in form.items():
            if p.get("required") and name not in parts:
                problems.append(f"{where}: required part {name!r} missing")
            if name not in parts:
                continue
            if p["type"] == "file" and name not in req.files:
                problems.append(f"{where}: part {name!r} must be a file")
            if "x-pulsar-json" in p:
                raw = req.form.get(name)
                if raw is None and name in req.files:
                    raw = req.files[name].read().decode("utf-8", "replace")
                try:
                    value = json.loads(raw)
                except (TypeError, ValueError):
                    problems.append(f"{where}: part {name!r} is not JSON")
                    continue
                problems += contract.check({"$ref": p["x-pulsar-json"]}, value, f"{where} part {name}", strict=True)
    elif req.get_data():
        if not any(p["in"] == "body" for p in params):
            problems.append(f"{where}: a body was sent but the operation documents none")
    return problems


@dataclass
class ClusterState:
    """What the fake cluster holds and what it saw. Tests set it up and read it back."""

    functions: dict = field(default_factory=dict)  # fqfn -> FunctionConfig dict
    function_stats: dict = field(default_factory=dict)  # fqfn -> FunctionStatsImpl dict (default: zeros)
    topics: dict = field(default_factory=dict)  # full topic name -> TopicStats dict
    deleted: list = field(default_factory=list)  # (full topic name, force) of accepted deletes
    partitions: dict = field(default_factory=dict)  # full topic name -> partition count
    worker_metrics: str = ""  # Prometheus text for /metrics
    credentials: set = field(default_factory=set)  # accepted Authorization values (empty: no auth)
    forbidden: set = field(default_factory=set)  # authenticated but not authorised (403)
    redirects: dict = field(default_factory=dict)  # (host name, path) -> (status, target base URL)
    malformed: dict = field(default_factory=dict)  # path -> raw body answered 200 without validation
    requests: list = field(default_factory=list)  # (host, method, path, query, Authorization)
    violations: list = field(default_factory=list)
    updates: list = field(default_factory=list)  # (fqfn, functionConfig part) of accepted PUTs
    lock: threading.Lock = field(default_factory=threading.Lock)


def _topic_name(pp: dict) -> str:
    from urllib.parse import unquote

    return f"persistent://{pp['tenant']}/{pp['namespace']}/{unquote(pp['topic'])}"


def default_function_stats(config: dict) -> dict:
    zero = {
        "receivedTotal": 0,
        "processedSuccessfullyTotal": 0,
        "systemExceptionsTotal": 0,
        "userExceptionsTotal": 0,
    }  # Pulsar leaves avgProcessLatency out until a message was processed
    instances = [
        {"instanceId": i, "metrics": {**zero, "1min": dict(zero), "lastInvocation": 0, "userMetrics": {}}}
        for i in range(int(config.get("parallelism") or 1))
    ]
    return {**zero, "1min": dict(zero), "instances": instances, "lastInvocation": 0}


class FakeHost:
    """One worker/broker of the fake cluster: a real HTTP(S) server on a loopback port."""

    def __init__(self, state: ClusterState, name: str, bind: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None):
        self.state, self.name = state, name
        self.contracts = [
            Contract(functions_doc(), FUNCTIONS_DOC.name),
            Contract(broker_doc(), BROKER_DOC.name),
            Contract(topic_delete_doc(), TOPIC_DELETE_DOC.name),
        ]
        app = Flask(f"fake-{name}")
        app.add_url_rule("/", "root", self._handle, methods=["GET", "POST", "PUT", "DELETE"])
        app.add_url_rule("/<path:_p>", "any", self._handle, methods=["GET", "POST", "PUT", "DELETE"])
        self._server = make_server(bind, 0, app, threaded=True, ssl_context=ssl_context)
        scheme = "https" if ssl_context else "http"
        self.url = f"{scheme}://{bind}:{self._server.server_port}"
        self.host_port = f"{bind}:{self._server.server_port}"
        self._thread = threading.Thread(target=self._serve, name=f"fake-{name}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=0.05)  # shutdown() waits at most one poll

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)

    # ---- request handling --------------------------------------------------------------------
    def _json(self, contract: Contract | None, op: dict | None, status: int, body: Any) -> Response:
        if contract is not None and op is not None:
            spec = op["responses"].get(str(status))
            if spec is None:
                self._violation(f"{request.method} {request.path}: answered undocumented status {status}")
            elif "schema" in spec:
                for problem in contract.check(spec["schema"], body, f"response {status} of {request.path}"):
                    self._violation(problem)
        return Response(json.dumps(body), status=status, mimetype="application/json")

    def _violation(self, text: str) -> None:
        with self.state.lock:
            self.state.violations.append(f"[{self.name}] {text}")

    def _handle(self, _p: str = "") -> Response:
        st = self.state
        auth = request.headers.get("Authorization")
        with st.lock:
            st.requests.append((self.name, request.method, request.path, dict(request.args), auth))
        if st.credentials and request.path != "/metrics":
            if auth not in st.credentials and auth not in st.forbidden:
                return Response(json.dumps({"reason": "Authentication required"}), 401, mimetype="application/json")
            if auth in st.forbidden:
                return Response(
                    json.dumps({"reason": "Unauthorized to perform this operation"}), 403, mimetype="application/json"
                )
        if request.path == "/metrics" and request.method == "GET":
            return Response(st.worker_metrics, mimetype="text/plain; version=0.0.4")
        for contract in self.contracts:
            found = contract.match(request.path)
            if found:
                break
        else:
            self._violation(f"{request.method} {request.path}: no such path in the documents")
            return Response(json.dumps({"reason": "not found"}), 404, mimetype="application/json")
        template, ops, pp = found
        op = ops.get(request.method.lower())
        if op is None:
            self._violation(f"{request.method} {request.path}: method not documented for {template}")
            return Response(status=405)
        for problem in validate_request(contract, op, pp, request):
            self._violation(problem)
        redirect = st.redirects.get((self.name, request.path))
        if redirect:
            status, target = redirect
            if str(status) not in op["responses"] and status == 307:
                self._violation(f"{request.method} {request.path}: 307 is not documented here")
            query = ("?" + request.query_string.decode()) if request.query_string else ""
            return Response(status=status, headers={"Location": target + request.path + query})
        if request.path in st.malformed:
            return Response(st.malformed[request.path], 200, mimetype="application/json")
        handler: Callable = getattr(self, "_op_" + op["operationId"].rpartition("_")[2])
        status, body = handler(pp)
        if body is None:
            return Response(status=status)
        return self._json(contract, op, status, body)

    # ---- operations (named by operationId, without its resource prefix) ------------------------------
    def _fn(self, pp):
        return f"{pp['tenant']}/{pp['namespace']}/{pp['functionName']}"

    def _missing(self, fqfn):
        return 404, {"reason": f"Function {fqfn} doesn't exist"}

    def _op_listFunctions(self, pp):
        prefix = f"{pp['tenant']}/{pp['namespace']}/"
        return 200, sorted(f[len(prefix) :] for f in self.state.functions if f.startswith(prefix))

    def _op_getFunctionInfo(self, pp):
        fqfn = self._fn(pp)
        return (200, self.state.functions[fqfn]) if fqfn in self.state.functions else self._missing(fqfn)

    def _op_updateFunction(self, pp):
        fqfn = self._fn(pp)
        if fqfn not in self.state.functions:
            return 400, {"reason": f"Function {pp['functionName']} doesn't exist"}
        part = json.loads(request.form.get("functionConfig") or "{}")
        current = self.state.functions[fqfn]
        if all(current.get(k) == v for k, v in part.items()):
            return 400, {"reason": "Update contains no change"}
        with self.state.lock:
            current.update(part)
            self.state.updates.append((fqfn, part))
        return 200, None

    def _op_getFunctionStats(self, pp):
        fqfn = self._fn(pp)
        if fqfn not in self.state.functions:
            return self._missing(fqfn)
        return 200, self.state.function_stats.get(fqfn) or default_function_stats(self.state.functions[fqfn])

    def _op_getFunctionStatus(self, pp):
        fqfn = self._fn(pp)
        if fqfn not in self.state.functions:
            return self._missing(fqfn)
        n = int(self.state.functions[fqfn].get("parallelism") or 1)
        instances = [
            {
                "instanceId": i,
                "status": {
                    "running": True,
                    "error": "",
                    "numRestarts": 0,
                    "numReceived": 0,
                    "numSuccessfullyProcessed": 0,
                    "workerId": self.name,
                },
            }
            for i in range(n)
        ]
        return 200, {"numInstances": n, "numRunning": n, "instances": instances}

    def _op_getStats(self, pp):
        name = _topic_name(pp)
        if name not in self.state.topics:
            return 404, {"reason": "Topic not found"}
        return 200, self.state.topics[name]

    def _op_getList(self, pp):
        return self._listing(pp, self.state.topics)

    def _op_getPartitionedTopicList(self, pp):
        return self._listing(pp, self.state.partitions)

    def _listing(self, pp, names):
        prefix = f"persistent://{pp['tenant']}/{pp['namespace']}/"
        return 200, sorted(t for t in names if t.startswith(prefix))

    def _op_deleteTopic(self, pp):
        name = _topic_name(pp)
        if name not in self.state.topics:
            return 404, {"reason": "Topic not found"}
        return self._drop(name, [name])

    def _op_deletePartitionedTopic(self, pp):
        name = _topic_name(pp)
        if name not in self.state.partitions:
            return 404, {"reason": f"Partitioned topic does not exist: {name}"}
        return self._drop(name, [f"{name}-partition-{i}" for i in range(self.state.partitions[name])])

    def _drop(self, name, topics):
        """Deletes a topic (or a partitioned topic's partitions and metadata); busy ones only with force."""
        force = request.args.get("force", "false") == "true"
        busy = any(self.state.topics.get(t, {}).get(k) for t in topics for k in ("publishers", "subscriptions"))
        if busy and not force:
            return 412, {"reason": "Topic has active producers/subscriptions"}
        with self.state.lock:
            for t in topics:
                self.state.topics.pop(t, None)
            self.state.partitions.pop(name, None)
            self.state.deleted.append((name, force))
        return 204, None

    def _op_getPartitionedMetadata(self, pp):
        return 200, {"partitions": self.state.partitions.get(_topic_name(pp), 0), "properties": {}}

    def _op_getPartitionedStats(self, pp):
        name = _topic_name(pp)
        n = self.state.partitions.get(name, 0)
        if n == 0:
            return 404, {"reason": f"Partitioned Topic not found: {name} is not a partitioned topic"}
        parts = {f"{name}-partition-{i}": self.state.topics[f"{name}-partition-{i}"] for i in range(n)}
        total = {
            "msgRateIn": sum(p["msgRateIn"] for p in parts.values()),
            "msgInCounter": sum(p["msgInCounter"] for p in parts.values()),
            "metadata": {"partitions": n},
            "subscriptions": {},
        }
        if request.args.get("perPartition", "true") == "true":
            total["partitions"] = parts
        return 200, total


class FakeCluster:
    """Hosts sharing one state; ``add_host`` makes another worker or broker (or a foreign host)."""

    def __init__(self):
        self.state = ClusterState()
        self.hosts: dict[str, FakeHost] = {}

    def add_host(self, name: str, bind: str = "127.0.0.1", ssl_context=None, state: ClusterState | None = None) -> FakeHost:
        host = FakeHost(state or self.state, name, bind, ssl_context)
        self.hosts[name] = host
        return host

    def close(self) -> None:
        for h in self.hosts.values():
            h.close()


class FakeIssuer:
    """An OAuth2 token endpoint (client credentials grant, RFC 6749 section 4.4) that counts grants."""

    def __init__(self, client_id: str, client_secret: str, expires_in: int = 3600):
        self.client_id, self.client_secret, self.expires_in = client_id, client_secret, expires_in
        self.issued: list[str] = []
        self.bad_requests: list[str] = []
        app = Flask("fake-issuer")
        app.add_url_rule("/oauth/token", "token", self._token, methods=["POST"])
        self._server = make_server("127.0.0.1", 0, app, threaded=True)
        self.token_url = f"http://127.0.0.1:{self._server.server_port}/oauth/token"
        self._thread = threading.Thread(target=self._serve, name="fake-issuer", daemon=True)
        self._thread.start()

    def _token(self):
        f = request.form
        if request.mimetype != "application/x-www-form-urlencoded" or f.get("grant_type") != "client_credentials":
            self.bad_requests.append(f"{request.mimetype} grant_type={f.get('grant_type')}")
            return Response(json.dumps({"error": "unsupported_grant_type"}), 400, mimetype="application/json")
        if f.get("client_id") != self.client_id or f.get("client_secret") != self.client_secret:
            return Response(json.dumps({"error": "invalid_client"}), 401, mimetype="application/json")
        token = f"issued-{len(self.issued) + 1}"
        self.issued.append(token)
        return Response(
            json.dumps({"access_token": token, "token_type": "Bearer", "expires_in": self.expires_in}),
            mimetype="application/json",
        )

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=0.05)

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=10)
