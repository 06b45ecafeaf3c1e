"""The worker's admin REST API: a compatible subset of Pulsar's Functions API v3 and worker API v2.

Paths, methods, the multipart form (`functionConfig` JSON part, `data` file part) and the
field names are Pulsar's, so `pulsar-admin`-style clients and our controller work unchanged.
Errors answer like Pulsar: a JSON body {"reason": ...} with 400 (bad request) or 404.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import TYPE_CHECKING

from flask import Flask, Response, jsonify, request
from prometheus_client import CollectorRegistry, generate_latest
from werkzeug.exceptions import HTTPException

from pulsar_autoscale.errors import ConfigError, Forbidden, PulsarAutoscaleError
from pulsar_autoscale.functions.api import rest_parity
from pulsar_autoscale.functions.api.metrics import WorkerCollector
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.model.config_parse import parse_text
from pulsar_autoscale.functions.model.config_validation import topics_outside
from pulsar_autoscale.functions.model.errors import BrokerUnavailable, NotFound, StaleEpoch
from pulsar_autoscale.functions.spark.stages import StageNotFound
from pulsar_autoscale.functions.worker.status import function_stats, function_status, instance_metrics
from pulsar_autoscale.functions.worker.worker import Worker
from pulsar_autoscale.security.guard import tenant_admin_caller, trusted_epoch
from pulsar_autoscale.security.redact import keep_masked_secrets, redact_secrets
from pulsar_autoscale.security.serving import form_text

if TYPE_CHECKING:
    from pulsar_autoscale.functions.cluster.member import ClusterMember

log = logging.getLogger(__name__)
FN = "/admin/v3/functions/<tenant>/<namespace>/<name>"


def _json_type(value) -> str:
    return (
        "null" if value is None else {list: "an array", str: "a string", bool: "a boolean"}.get(type(value), type(value).__name__)
    )


def create_app(worker: Worker, cluster: ClusterMember | None = None) -> Flask:
    """`cluster`: answer for the whole cluster (functions/cluster/); None: this worker is the cluster."""
    app = Flask("pulsar_autoscale.functions")
    admin = cluster or worker  # function configs: the cluster's metadata, or this worker's
    registry = CollectorRegistry()
    registry.register(WorkerCollector(worker))

    @app.errorhandler(PulsarAutoscaleError)
    def _known(exc):
        code = getattr(exc, "http_status", None) or (
            404
            if isinstance(exc, (NotFound, StageNotFound))
            else 409
            if isinstance(exc, StaleEpoch)
            else 503
            if isinstance(exc, BrokerUnavailable)
            else 400
        )
        return jsonify(reason=str(exc)), code

    @app.errorhandler(HTTPException)
    def _http(exc):
        if request.url_rule is None and exc.code in (404, 405):
            # Not "function not found": this worker does not serve that endpoint (or method) at all.
            return jsonify(
                reason=f"endpoint not supported by this worker: {request.method} {request.path} "
                "(the served Functions API is listed in docs/runtime.md)"
            ), exc.code
        return jsonify(reason=exc.description), exc.code

    @app.errorhandler(Exception)
    def _unexpected(exc):
        log.exception("internal error on %s %s", request.method, request.path)
        return jsonify(reason=f"internal error: {type(exc).__name__}: {exc}"), 500

    def form_config() -> dict:
        raw = form_text("functionConfig")
        if raw is None and request.is_json:
            data = request.get_json(silent=True)
            if not isinstance(data, dict):
                raise ConfigError(f"the JSON body must be an object (a FunctionConfig), got {_json_type(data)}")
            return data
        if raw is None:
            raise ConfigError("functionConfig part is missing from the multipart form")
        return parse_text(raw, "functionConfig")

    def form_code() -> tuple[bytes | None, str | None]:
        if request.form.get("url"):
            raise ConfigError(
                "the multipart part `url` (a package URL) is not supported by this worker: send the "
                ".py file as the `data` part (file://, http(s):// and function:// are not fetched)"
            )
        f = request.files.get("data")
        if f is None:
            return None, None
        return f.read(), f.filename

    def path_fields(tenant, namespace, name, data: dict) -> dict:
        for key, value in (("tenant", tenant), ("namespace", namespace), ("name", name)):
            if data.get(key) not in (None, "", value):
                raise ConfigError(f"{key} {data[key]!r} in functionConfig does not match the URL ({value!r})")
        return {**data, "tenant": tenant, "namespace": namespace, "name": name}

    def refuse_tenant_code_in_the_worker(runtime) -> None:
        """A tenant admin's code runs in its own process, as the instance user, not in the worker's memory
        (docs/security.md, "Threat model"), unless the operator allowed it (--allow-tenant-thread-runtime)."""
        if (runtime or worker.default_runtime) == "thread" and not worker.tenant_thread_runtime and tenant_admin_caller():
            raise ConfigError(
                "the thread runtime runs a function's code inside the worker's own memory: it is for "
                "trusted (superuser) code. Use the process runtime (instanceRuntime: process), or ask "
                "the operator for --allow-tenant-thread-runtime"
            )

    def refuse_topics_outside_the_tenant(tenant: str, data: dict) -> None:
        """A tenant admin's function reads and writes its own tenant's topics only: on Apache Pulsar the broker
        holds the function's role to that, pulsar-lite has no authorization, so the worker does."""
        outside = topics_outside(tenant, data) if tenant_admin_caller() else []
        if outside:
            raise Forbidden(
                f"topic(s) {', '.join(outside)} are outside tenant {tenant!r}: a tenant admin's "
                f"function reads and writes {tenant}/<namespace>/<topic> only (a short name means "
                f"public/default, as in Pulsar)"
            )

    @app.post(FN)
    def create(tenant, namespace, name):
        data = path_fields(tenant, namespace, name, form_config())
        code, filename = form_code()
        refuse_tenant_code_in_the_worker(data.get("instanceRuntime"))
        refuse_topics_outside_the_tenant(tenant, data)
        admin.create(FunctionConfig.from_dict(data, worker.max_parallelism), code, filename)
        return Response(status=204)

    @app.put(FN)
    def update(tenant, namespace, name):
        data = path_fields(tenant, namespace, name, form_config())
        code, filename = form_code()
        fence()
        fqfn = f"{tenant}/{namespace}/{name}"
        if worker.stages.has(fqfn):
            update_stage(fqfn, data)
        else:
            current = admin.get(fqfn)
            refuse_topics_outside_the_tenant(tenant, data)
            if code is not None or data.get("className") not in (None, current.className):  # new code to run
                refuse_tenant_code_in_the_worker(current.instanceRuntime)
            admin.update(fqfn, keep_masked_secrets(data, current.to_dict()), code, filename)
        return Response(status=204)

    def update_stage(fqfn: str, data: dict) -> None:
        other = sorted(set(data) - {"tenant", "namespace", "name", "parallelism"})
        if other or "parallelism" not in data:
            raise ConfigError(
                f"{fqfn} is a stateful stage: only parallelism can be updated here "
                f"(got {other or 'no parallelism'}); recreate it under /admin/v3/stages to change more"
            )
        if not isinstance(data["parallelism"], int) or isinstance(data["parallelism"], bool):
            raise ConfigError(f"parallelism must be an integer, got {data['parallelism']!r}")
        worker.stages.set_parallelism(fqfn, data["parallelism"])

    def fence():
        epoch = trusted_epoch()  # None unless a controller role sent one (security/guard.py)
        if epoch is not None:
            worker.fence(epoch)

    # Not in Pulsar's API: a burst drain (functions/spark/bursts.py),
    # {"messages": N, "partitions": P, "threadsPerPartition": T}. 202 and started: true when one
    # starts; 200 and started: false, with the running one, while one still runs.
    @app.post(FN + "/burst")
    def burst(tenant, namespace, name):
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or "messages" not in body:
            raise ConfigError('burst: the body must be JSON {"messages": N, "partitions": P, "threadsPerPartition": T}')
        args = {
            key: body.get(key, default) for key, default in (("messages", None), ("partitions", 4), ("threadsPerPartition", 1))
        }
        for key, value in args.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"burst: {key} must be a positive integer, got {value!r}")
        fence()
        fqfn = f"{tenant}/{namespace}/{name}"
        record, started = worker.burst(
            fqfn, *args.values(), function=cluster.function_source(fqfn) if cluster is not None else None
        )
        return jsonify(started=started, **asdict(record)), 202 if started else 200

    # Not in Pulsar's API: the warm pool of a process-runtime function (functions/runtimes/warm_pool.py), sized by
    # the controller (controller/warm_sizing.py): PUT {"standbys": N} -> 200 with the pool as GET shows it.
    @app.put(FN + "/warm-pool")
    def set_warm_pool(tenant, namespace, name):
        body = request.get_json(silent=True)
        if not isinstance(body, dict) or "standbys" not in body:
            raise ConfigError('warm-pool: the body must be JSON {"standbys": N}')
        fence()
        return jsonify(asdict(worker.set_warm_pool(f"{tenant}/{namespace}/{name}", body["standbys"])))

    @app.get(FN + "/warm-pool")
    def warm_pool(tenant, namespace, name):
        return jsonify(asdict(worker.warm_pool_view(f"{tenant}/{namespace}/{name}")))

    @app.get(FN + "/burst")
    def burst_report(tenant, namespace, name):
        fqfn = f"{tenant}/{namespace}/{name}"
        admin.get(fqfn)  # 404 for an unknown function (a cluster's: also where no instance runs, as the POST)
        return jsonify(worker.bursts.report(fqfn))

    @app.get(FN)
    def get(tenant, namespace, name):
        fqfn = f"{tenant}/{namespace}/{name}"
        if worker.stages.has(fqfn):
            return jsonify(worker.stages.function_view(fqfn))
        return jsonify(redact_secrets(admin.get(fqfn).to_dict()))

    @app.delete(FN)
    def delete(tenant, namespace, name):
        fqfn = f"{tenant}/{namespace}/{name}"
        if worker.stages.has(fqfn):
            worker.stages.delete(fqfn)
        else:
            admin.delete(fqfn)
        return Response(status=204)

    @app.get("/admin/v3/functions/<tenant>/<namespace>")
    def list_functions(tenant, namespace):
        return jsonify(sorted(admin.list(tenant, namespace) + worker.stages.names(tenant, namespace)))

    @app.get(FN + "/status")
    def status(tenant, namespace, name):
        fqfn = f"{tenant}/{namespace}/{name}"
        if worker.stages.has(fqfn):
            return jsonify(worker.stages.status(fqfn))
        if cluster is not None:
            local = request.args.get("scope") == "local"  # a peer reads the instances this worker runs
            return jsonify({str(i): s for i, s in cluster.local_status(fqfn).items()} if local else cluster.status(fqfn))
        return jsonify(status_of(fqfn))

    def status_of(fqfn: str) -> dict:
        cfg, figs, restarts = worker.instance_figures(fqfn)
        failure, abandoned = worker.health(fqfn)
        out = function_status(
            cfg, figs, restarts, worker.worker_id, worker.stall_after_s, failure, abandoned, worker.broker_problem()
        )
        keyed = worker.keyed_view(fqfn)
        if keyed is not None:
            out["autoscale"]["keyedState"] = keyed
        return out

    @app.get(FN + "/<int:instance_id>/status")
    def instance_status_view(tenant, namespace, name, instance_id):
        if cluster is not None:
            view = cluster.status(f"{tenant}/{namespace}/{name}")
            if not 0 <= instance_id < view["numInstances"]:
                raise NotFound(f"Function {name} has no instance {instance_id} (parallelism {view['numInstances']})")
            return jsonify(view["instances"][instance_id]["status"])
        fqfn = f"{tenant}/{namespace}/{name}"
        check_instance(worker.get(fqfn), instance_id)
        return jsonify(status_of(fqfn)["instances"][instance_id]["status"])

    @app.get(FN + "/stats")
    def stats(tenant, namespace, name):
        fqfn = f"{tenant}/{namespace}/{name}"
        if worker.stages.has(fqfn):
            return jsonify(worker.stages.stats(fqfn))
        if cluster is not None:
            return jsonify(cluster.local_stats(fqfn) if request.args.get("scope") == "local" else cluster.stats(fqfn))
        _, figs, _ = worker.instance_figures(fqfn)
        return jsonify(function_stats(figs, worker.counters(fqfn), worker.counters_1min_ago(fqfn), worker.exception_totals(fqfn)))

    @app.get(FN + "/<int:instance_id>/stats")
    def instance_stats(tenant, namespace, name, instance_id):
        if cluster is not None:
            view = cluster.stats(f"{tenant}/{namespace}/{name}")
            found = [s for s in view["instances"] if s["instanceId"] == instance_id]
            if not found:
                raise NotFound(f"instance {instance_id} of {tenant}/{namespace}/{name} is not running")
            return jsonify({"instanceId": instance_id, **found[0]["metrics"]})
        cfg, figs, _ = worker.instance_figures(f"{tenant}/{namespace}/{name}")
        check_instance(cfg, instance_id)
        if instance_id not in figs:
            raise NotFound(f"instance {instance_id} of {cfg.fqfn} is not running")
        return jsonify({"instanceId": instance_id, **instance_metrics(figs[instance_id])})

    def check_instance(cfg, instance_id):
        if not 0 <= instance_id < cfg.parallelism:
            raise NotFound(f"Function {cfg.name} has no instance {instance_id} (parallelism {cfg.parallelism})")

    for action in ("start", "stop", "restart"):

        def handler(tenant, namespace, name, instance_id=None, _action=action):
            fqfn = f"{tenant}/{namespace}/{name}"
            if cluster is not None:
                cluster.control(fqfn, _action, instance_id)  # the worker that runs the instance acts
            elif _action == "restart":
                worker.restart(fqfn, instance_id)
            else:
                worker.set_running(fqfn, _action == "start", instance_id)
            return Response(status=204)

        app.add_url_rule(FN + f"/{action}", f"fn_{action}", handler, methods=["POST"])
        app.add_url_rule(FN + f"/<int:instance_id>/{action}", f"instance_{action}", handler, methods=["POST"])

    # Not in Pulsar's API: Spark stateful stages (functions/spark/stages.py), a StatefulStageConfig as JSON.
    STAGE = "/admin/v3/stages/<tenant>/<namespace>/<name>"

    @app.post(STAGE)
    def create_stage(tenant, namespace, name):
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise ConfigError("stateful stage: the body must be a JSON object (a StatefulStageConfig)")
        worker.create_stage(path_fields(tenant, namespace, name, body))
        return Response(status=204)

    @app.get(STAGE)
    def get_stage(tenant, namespace, name):
        return jsonify(worker.stages.config(f"{tenant}/{namespace}/{name}"))

    @app.delete(STAGE)
    def delete_stage(tenant, namespace, name):
        worker.stages.delete(f"{tenant}/{namespace}/{name}")
        return Response(status=204)

    @app.get("/admin/v3/stages/<tenant>/<namespace>")
    def list_stages(tenant, namespace):
        return jsonify(worker.stages.names(tenant, namespace))

    def me():
        return {"workerId": worker.worker_id, "workerHostname": worker.hostname, "port": worker.port}

    @app.get("/admin/v2/worker/cluster")
    def cluster_members():
        return jsonify(cluster.members() if cluster is not None else [me()])

    @app.get("/admin/v2/worker/cluster/leader")
    def leader():
        return jsonify(cluster.leader() if cluster is not None else me())

    @app.put("/admin/v2/worker/rebalance")
    def rebalance():
        if cluster is None:
            return Response(status=204)  # one worker: nothing to move
        return jsonify(request=cluster.rebalance()), 200

    @app.get("/admin/v2/worker/assignments")
    def assignments():
        if cluster is not None:
            return jsonify(cluster.assignment_view())
        names = []
        for cfg in worker.functions():
            names.extend(f"{cfg.fqfn}:{i}" for i in range(cfg.parallelism))
        return jsonify({worker.worker_id: names})

    rest_parity.register(app, worker, cluster)

    @app.get("/metrics")
    def metrics():
        return Response(generate_latest(registry), mimetype="text/plain; version=0.0.4")

    @app.get("/healthz")
    def healthz():
        return jsonify(status="ok", functions=len(admin.functions()))

    return app
