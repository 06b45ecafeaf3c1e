"""pulsar-admin parity endpoints of the Functions API v3: trigger, state, upload and download.

Pulsar's paths and forms: `POST .../{name}/trigger` (multipart `data` value or `dataStream` file,
optional `topic`) answers the function's output; `GET/POST .../{name}/state/{key}` read and write a
FunctionState ({"key", "stringValue" | "numberValue" | "byteValue"}; the POST form part is `state`);
`POST /admin/v3/functions/upload` (multipart `data` + `path`) and `GET /admin/v3/functions/download?path=`
keep files on the worker; `GET .../{name}/download` gives a function's code.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from flask import Flask, Response, jsonify, request

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.api.trigger import trigger
from pulsar_autoscale.functions.cluster.member import ClusterMember
from pulsar_autoscale.functions.cluster.peers import MISDIRECTED
from pulsar_autoscale.functions.model.config_parse import parse_text
from pulsar_autoscale.functions.model.errors import NotFound
from pulsar_autoscale.functions.state.owner_calls import STATE_KEY_HEADER
from pulsar_autoscale.functions.state.store import StateStore
from pulsar_autoscale.functions.worker.packages import PackageStore
from pulsar_autoscale.functions.worker.worker import Worker
from pulsar_autoscale.security.guard import CAPABILITY
from pulsar_autoscale.security.serving import form_text

FN = "/admin/v3/functions/<tenant>/<namespace>/<name>"
STATE_VALUE_FIELDS = ("stringValue", "numberValue", "byteValue")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def register(app: Flask, worker: Worker, cluster: ClusterMember | None) -> None:
    """`cluster`: this worker's cluster (configs from its metadata, a key's state from the worker that holds it),
    None: this worker is the cluster."""
    admin = cluster or worker
    packages = PackageStore(worker.data_dir / "packages")

    def holder(tenant: str, namespace: str, name: str, key: str, state: str | None = None) -> StateStore | Response:
        """The store of this worker that holds the key, or on a cluster the answer of the worker that does. A read
        or write of a key that no local group has asks the other workers first (a function may write a state key in
        another message key's group); a key that no worker has is written in its own group."""
        fqfn = f"{tenant}/{namespace}/{name}"
        local = cluster is not None and request.args.get("scope") == "local"  # asked by another worker
        try:
            store = worker.state_store(fqfn, key)
        except NotFound as exc:
            if cluster is None:
                raise
            if local:
                return Response(json.dumps({"reason": str(exc)}), MISDIRECTED, mimetype="application/json")
            store = None
        if cluster is None or local or (store is not None and store.holds(key)):
            # set: without a cluster NotFound is raised above, and a local call answered its Response there
            assert store is not None
            return store
        admin.get(fqfn)  # 404 for a function that does not exist
        resp = cluster.state_elsewhere(fqfn, key, state, write_here=store is not None)
        if store is not None and (resp is None or resp.status_code == 404):
            return store  # the key's own group is here: it says the key does not exist
        if resp is None:
            stopped = cluster.stopped(fqfn)
            raise NotFound(
                f"no live worker holds the key group of {key!r} of {fqfn} right now: "
                + (
                    f"instances {sorted(stopped)} are stopped (their groups' state is served again once they start), or "
                    if stopped
                    else ""
                )
                + "it is moving between instances or restoring after its worker died: retry in a few "
                "seconds"
            )
        return Response(resp.content, resp.status_code, content_type=resp.headers.get("Content-Type"))

    def state_key_verdict() -> bool | None:
        """The security guard's capability check: a process instance's state key opens its own function's state
        calls on this worker (not another worker's: scope=local is the workers' own call) and nothing else."""
        key = request.headers.get(STATE_KEY_HEADER)
        if key is None:
            return None
        args = request.view_args or {}
        return (
            cluster is not None
            and request.endpoint == "state_calls"
            and request.method == "POST"
            and request.args.get("scope") != "local"
            and cluster.state_router.opens(f"{args['tenant']}/{args['namespace']}/{args['name']}", key)
        )

    app.extensions[CAPABILITY] = state_key_verdict

    @app.post(FN + "/state-calls")
    def state_calls(tenant, namespace, name):
        """A cluster's internal call: the state calls of an instance, from its process (with its state key) or
        from another worker (scope=local, to this worker as the state's owner; functions/cluster/state_owner.py)."""
        if cluster is None:
            raise NotFound("state calls are served only on a worker cluster")
        status, body = cluster.state_router.http_answer(
            f"{tenant}/{namespace}/{name}", request.get_json(force=True), request.args.get("scope") == "local"
        )
        return jsonify(body), status

    @app.post(FN + "/trigger")
    def trigger_function(tenant, namespace, name):
        cfg = admin.get(f"{tenant}/{namespace}/{name}")
        value = request.form.get("data")
        if value is None and request.files.get("dataStream") is not None:
            data = request.files["dataStream"].read()
        elif value is not None:
            data = value.encode()
        else:
            raise ConfigError("Trigger Data is empty: send the multipart part `data` (a value) or `dataStream` (a file)")
        out = trigger(worker.pulsar_client, cfg, data, request.form.get("topic"))
        if out is None:
            return Response(status=204)
        return Response(out, status=200, mimetype="application/octet-stream")

    @app.get(FN + "/state/<path:key>")
    def get_state(tenant, namespace, name, key):
        store = holder(tenant, namespace, name, key)
        if isinstance(store, Response):
            return store
        if store.has_counter(key):
            return jsonify(key=key, numberValue=store.get_counter(key))
        value = store.get_state(key)
        if value is None:
            raise NotFound(f"key {key!r} doesn't exist in the state of {tenant}/{namespace}/{name}")
        try:
            return jsonify(key=key, stringValue=bytes(value).decode("utf-8"))
        except UnicodeDecodeError:
            return jsonify(key=key, byteValue=base64.b64encode(bytes(value)).decode())

    @app.post(FN + "/state/<path:key>")
    def put_state(tenant, namespace, name, key):
        raw = form_text("state")
        if raw is None:
            raise ConfigError(
                'the multipart part `state` is missing: a FunctionState JSON such as {"key": "k", "stringValue": "v"}'
            )
        store = holder(tenant, namespace, name, key, raw)
        if isinstance(store, Response):
            return store
        state = parse_text(raw, "state")
        if state.get("key") not in (None, key):
            raise ConfigError(f"key {state['key']!r} in the state does not match the key in the path ({key!r})")
        given = [f for f in STATE_VALUE_FIELDS if state.get(f) is not None]
        if len(given) != 1:
            raise ConfigError(f"the state must have exactly one of {', '.join(STATE_VALUE_FIELDS)}, got {given or 'none'}")
        value = state[given[0]]
        if given[0] == "numberValue":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"numberValue must be an integer, got {json.dumps(value)}")
            if not INT64_MIN <= value <= INT64_MAX:  # Pulsar's counters are 64-bit
                raise ConfigError(f"numberValue {value} does not fit a 64-bit counter")
            store.set_counter(key, value)
        elif given[0] == "stringValue":
            if not isinstance(value, str):
                raise ConfigError(f"stringValue must be a string, got {json.dumps(value)}")
            store.del_counter(key)
            store.put_state(key, value)
        else:
            store.del_counter(key)
            store.put_state(key, _bytes_value(value))
        return Response(status=204)

    @app.post("/admin/v3/functions/upload")
    def upload():
        f = request.files.get("data")
        if f is None:
            raise ConfigError("the multipart part `data` (the file) is missing")
        packages.put(request.form.get("path", ""), f.read())
        return Response(status=204)

    @app.get("/admin/v3/functions/download")
    def download():
        path = request.args.get("path", "")
        return Response(
            packages.get(path),
            mimetype="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{Path(path).name}"'},
        )

    @app.get(FN + "/download")
    def download_function(tenant, namespace, name):
        code = worker.code_file(f"{tenant}/{namespace}/{name}")
        if code is None:
            raise NotFound(f"Function {tenant}/{namespace}/{name} runs an installed module: it has no uploaded code")
        return Response(
            Path(code).read_bytes(),
            mimetype="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{Path(code).name}"'},
        )


def _bytes_value(value) -> bytes:
    """Pulsar's byteValue: JSON base64 text (as Jackson writes byte[]) or an array of byte values."""
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise ConfigError("byteValue must be base64 text or an array of integers 0-255") from None
    if isinstance(value, list) and all(isinstance(b, int) and not isinstance(b, bool) and -128 <= b <= 255 for b in value):
        return bytes(b & 0xFF for b in value)
    raise ConfigError("byteValue must be base64 text or an array of integers 0-255")
