"""A worker plus its REST server in one object: what `pulsar-autoscale worker`, the demo and tests run."""

from __future__ import annotations

import shutil
import tempfile
import threading

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.api.rest import create_app
from pulsar_autoscale.functions.cluster.join import join
from pulsar_autoscale.functions.cluster.member import ClusterSettings
from pulsar_autoscale.functions.instance.instance_user import InstanceUsers
from pulsar_autoscale.functions.model.config_validation import DEFAULT_MAX_PARALLELISM
from pulsar_autoscale.functions.worker.worker import Worker
from pulsar_autoscale.netutil import cannot_bind, free_port
from pulsar_autoscale.pulsar_client import ClientSettings
from pulsar_autoscale.security.serving import ServerSecurity
from pulsar_autoscale.spark_bridge.session import SparkSettings


def _unservable(host: str, port: int, exc: OSError) -> str:
    return (
        f"cannot serve the worker's REST API on {host}:{port}: {exc.strerror or exc} (another worker or "
        f"program listens there?): give another --port"
    )


class WorkerServer:
    def __init__(
        self,
        service_url: str | ClientSettings,
        port: int = 0,
        host: str = "127.0.0.1",
        data_dir: str | None = None,
        metrics_url: str | None = None,
        runtime: str = "thread",
        broker_kind: str = "auto",
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        worker_id: str | None = None,
        cluster: ClusterSettings | None = None,
        warm_pool: int = 0,
        spark: SparkSettings | None = None,
        security: ServerSecurity | None = None,
        web_service_url: str | None = None,
        instance_users: InstanceUsers | None = None,
        tenant_thread_runtime: bool = False,
    ):
        self.security = security or ServerSecurity()
        self.security.check_bind(host)  # refuse before anything starts
        self.port = port or free_port(host)
        taken = cannot_bind(host, self.port)
        if taken is not None:  # before the worker connects or joins: nothing to undo
            raise ConfigError(_unservable(host, self.port, taken))
        self.host = host
        self._temp_dir: str | None = None if data_dir else tempfile.mkdtemp(prefix="pa-worker-")
        worker_dir = data_dir or self._temp_dir
        assert worker_dir is not None  # no data_dir given: the temporary one was just made
        self.worker = Worker(
            service_url,
            worker_dir,
            worker_id=worker_id or f"worker-{host}-{self.port}",
            default_runtime=runtime,
            max_parallelism=max_parallelism,
            broker_kind=broker_kind,
            hostname=host,
            port=self.port,
            warm_pool=warm_pool,
            metrics_url=metrics_url,
            spark=spark,
            web_service_url=web_service_url,
            instance_users=instance_users,
            tenant_thread_runtime=tenant_thread_runtime,
        )
        # A cluster member joins (topics, consumer-id slot) before the REST API answers.
        self.cluster = join(self.worker, self.url, cluster, service_url) if cluster else None
        try:
            self._server = self.security.make_server(host, self.port, create_app(self.worker, self.cluster))
        except OSError as exc:  # taken since the check: what started goes
            if self.cluster is not None:
                self.cluster.leave()
            self.worker.close()
            raise ConfigError(_unservable(host, self.port, exc)) from None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{self.security.scheme}://{self.host}:{self.port}"

    def start(self) -> "WorkerServer":
        self._thread = threading.Thread(target=self._server.serve_forever, name="worker-rest", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Cluster member: hands its instances over first (make-before-break), then stops."""
        if self.cluster is not None:
            self.cluster.leave()
        self._server.shutdown()
        self.worker.close()
        if self._temp_dir:
            shutil.rmtree(self._temp_dir, ignore_errors=True)

    def __enter__(self) -> "WorkerServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
