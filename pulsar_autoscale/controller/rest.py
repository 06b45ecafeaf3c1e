"""The controller's HTTP API: /metrics, /status, and the per-function autoscaler controls that
`pulsar-autoscale autoscaler` calls. Bad input is a 4xx with {"reason": ...}, never a 500."""

from __future__ import annotations

from flask import Flask, Response, jsonify, request
from prometheus_client import generate_latest

from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.controller.api import ControllerApi
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.headers import PARTIAL_HEADER

FN = "/autoscaler/functions/<tenant>/<namespace>/<name>"


def build_app(controller: ControllerApi) -> Flask:
    app = Flask("pulsar_autoscale.controller")

    @app.errorhandler(ConfigError)
    def bad_request(exc):
        return jsonify(reason=str(exc)), 400

    @app.errorhandler(404)
    def not_found(exc):
        return jsonify(reason=f"{request.path}: no such endpoint on the controller (see docs/controller.md)"), 404

    @app.errorhandler(405)
    def not_allowed(exc):
        return jsonify(reason=f"{request.method} is not allowed on {request.path}"), 405

    def known(tenant: str, namespace: str, name: str) -> str:
        """The function's full name, once the Functions API knows it (else 404 with a reason)."""
        fn = f"{tenant}/{namespace}/{name}"
        if fn in controller.effective:
            return fn
        try:
            controller.admin.get(tenant, namespace, name)
        except AdminError as exc:
            if exc.status == 404:
                raise FunctionNotFound(f"function {fn} not found at {controller.config.admin_url}") from exc
            raise
        return fn

    @app.errorhandler(AdminError)
    def admin_down(exc):
        return jsonify(reason=f"the Functions API did not answer: {exc}"), 502

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(controller.metrics.registry), mimetype="text/plain; version=0.0.4")

    @app.get("/status")
    def status():
        return jsonify(controller.status())

    @app.get("/autoscaler/functions")
    def all_controls():
        return jsonify({fn: controller.controls_of(fn) for fn in sorted(controller.effective)})

    @app.get(FN)
    def get_controls(tenant, namespace, name):
        return jsonify(controller.controls_of(known(tenant, namespace, name)))

    @app.put(FN)
    def set_controls(tenant, namespace, name):
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise ConfigError('the body must be a JSON object of controls, e.g. {"min": 0, "max": 4}')
        return jsonify(controller.set_controls(known(tenant, namespace, name), body))

    @app.delete(FN)
    def clear_controls(tenant, namespace, name):
        return jsonify(controller.clear_controls(known(tenant, namespace, name)))

    @app.post(FN + "/pause")
    def pause(tenant, namespace, name):
        return jsonify(controller.set_controls(known(tenant, namespace, name), {"paused": True}))

    @app.post(FN + "/resume")
    def resume(tenant, namespace, name):
        return jsonify(controller.set_controls(known(tenant, namespace, name), {"paused": False}))

    @app.get(FN + "/why")
    def why(tenant, namespace, name):
        raw = request.args.get("limit", "10")
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigError(f"limit must be a positive integer, got {raw!r}")
        records, note = controller.why_with_leader(known(tenant, namespace, name), int(raw))
        resp = jsonify(records)
        if note:
            resp.headers[PARTIAL_HEADER] = note
        return resp

    @app.post("/autoscaler/reload")
    def reload():
        return jsonify(controller.reload())

    @app.errorhandler(FunctionNotFound)
    def function_not_found(exc):
        return jsonify(reason=str(exc)), 404

    return app


class FunctionNotFound(Exception):
    pass
