"""Stateful stages hosted by the worker: a DAG node whose runtime is a Spark streaming query.

The worker starts each stage (spark_bridge.stateful.StatefulStage) on its SparkSession (local[*],
or the Spark cluster of --spark-master),
restarts it from its checkpoint when the query fails (state and offsets kept), persists its
config so a restarted worker brings it back, and shows it through the Functions API like a
function: listed, readable as a FunctionConfig (inputs, output, parallelism), re-scaled by
the same PUT (the query restarts from its checkpoint), with status and stats whose
"autoscale" block carries the counters and the backlog the controller's Monitor reads.

Counters come from Spark's progress reports, one per micro-batch: rows in = received =
processed, sink rows = outputs, and busy time = batch duration x parallelism (every input
partition worked for the batch), so a policy's per-instance service rate is rows per
partition-second. Stages are created and deleted under /admin/v3/stages (not Pulsar's API).
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.pulsar_client import ClientSettings
from pulsar_autoscale.snapshot import FunctionCounters

if TYPE_CHECKING:  # pragma: no cover
    from pulsar_autoscale.functions.spark.stateful import StatefulStage
    from pulsar_autoscale.spark_bridge.session import SparkSettings

log = logging.getLogger(__name__)
SUPERVISE_INTERVAL_S = 1.0
RESTART_BACKOFF_S = 5.0
STAGE_RUNTIME = "SPARK"  # the `runtime` a stage shows in its FunctionConfig view


class StageNotFound(PulsarAutoscaleError):
    """No such stage (REST: 404)."""


@dataclass
class HostedStage:
    stage: StatefulStage
    lock: threading.Lock = field(default_factory=threading.Lock)
    restarts: int = 0
    deleted: bool = False  # the supervisor must not start it again
    last_start: float = 0.0
    error: str = ""
    received: float = 0.0
    outputs: float = 0.0
    busy_s: float = 0.0
    busy_sq_s2: float = 0.0
    seen: set = field(default_factory=set)  # (runId, batchId) already counted


class StageHost:
    """`client`: the broker URL, or ClientSettings with auth and TLS for the stages' source and
    sink; `spark`: where stages run (default local[*]; a Spark cluster with --spark-master)."""

    def __init__(self, data_dir: Path, client: ClientSettings | str, worker_id: str, spark: "SparkSettings | None" = None):
        self.dir = Path(data_dir) / "stages"
        self.client = ClientSettings.of(client)
        self.spark = spark
        self.worker_id = worker_id
        self._stages: dict[str, HostedStage] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._supervisor: threading.Thread | None = None
        for path in sorted(self.dir.glob("*/*/*/config.json")):  # what a previous run accepted
            try:
                self._host(json.loads(path.read_text()))
            except (ConfigError, ValueError, ImportError) as exc:
                log.error("stateful stage %s not restored: %s", path.parent, exc)

    # ---- lifecycle --------------------------------------------------------------------------
    def create(self, data: dict) -> None:
        cfg = self._host(data)
        self._save(cfg)

    def _host(self, data: dict):
        try:
            from pulsar_autoscale.functions.spark.stateful import StatefulStage
            from pulsar_autoscale.functions.spark.stateful_config import StatefulStageConfig
        except ImportError as exc:
            raise ConfigError(f"stateful stage: this worker cannot run Spark ({exc}); install pulsar-autoscale[spark]") from None
        data = {"serviceUrl": self.client.service_url, **data}
        if not data.get("checkpointDir") and not data.get("checkpoint_dir"):
            data["checkpointDir"] = str(
                self.dir
                / data.get("tenant", "public")
                / data.get("namespace", "default")
                / str(data.get("name", ""))
                / "checkpoint"
            )
        cfg = StatefulStageConfig.from_dict(data)
        with self._lock:
            if cfg.fqfn in self._stages:
                raise ConfigError(f"Stateful stage {cfg.name} already exists")
            self._stages[cfg.fqfn] = HostedStage(StatefulStage(cfg, client=self.client, spark_settings=self.spark))
        self._ensure_supervisor()
        return cfg

    def _save(self, cfg) -> None:
        path = self.dir / cfg.tenant / cfg.namespace / cfg.name / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cfg.to_dict(), indent=1))
        tmp.replace(path)

    def delete(self, fqfn: str) -> None:
        hosted = self._get(fqfn)
        with hosted.lock:
            hosted.deleted = True
            hosted.stage.stop()
        with self._lock:
            del self._stages[fqfn]
        shutil.rmtree(self.dir.joinpath(*fqfn.split("/")), ignore_errors=True)

    def set_parallelism(self, fqfn: str, parallelism: int) -> None:
        """Restart the query from its checkpoint with `parallelism` input partitions (state kept)."""
        hosted = self._get(fqfn)
        with hosted.lock:
            if parallelism == hosted.stage.config.parallelism:
                raise ConfigError("Update contains no change")
            before = hosted.stage.query
            hosted.stage.set_parallelism(parallelism)
            self._account(hosted, before)  # the batches it finished while stopping
            self._save(hosted.stage.config)

    def close(self) -> None:
        self._closing.set()
        if self._supervisor is not None:
            self._supervisor.join(10)
        for hosted in list(self._stages.values()):
            with hosted.lock:
                hosted.stage.stop()

    # ---- supervision: start, restart after a failure, count progress ------------------------
    def _ensure_supervisor(self) -> None:
        with self._lock:
            if self._supervisor is None:
                self._supervisor = threading.Thread(target=self._supervise, name="stage-supervisor", daemon=True)
                self._supervisor.start()

    def _supervise(self) -> None:
        while not self._closing.wait(SUPERVISE_INTERVAL_S):
            with self._lock:
                stages = list(self._stages.items())
            for fqfn, hosted in stages:
                try:
                    with hosted.lock:
                        if hosted.deleted:
                            continue
                        self._account(hosted)
                        query = hosted.stage.query
                        if (query is None or not query.isActive) and time.monotonic() - hosted.last_start > RESTART_BACKOFF_S:
                            self._start(fqfn, hosted)
                except Exception:  # the supervisor must outlive any one stage's trouble
                    log.exception("stateful stage %s: supervision failed this round", fqfn)

    @staticmethod
    def _start(fqfn: str, hosted: HostedStage) -> None:
        query = hosted.stage.query
        if query is not None:
            exc = query.exception()
            hosted.error = f"query failed: {exc}" if exc is not None else "query stopped"
            hosted.restarts += 1
            log.warning("stateful stage %s: %s; restarting from its checkpoint", fqfn, hosted.error)
        hosted.last_start = time.monotonic()
        try:
            hosted.stage.start()
        except Exception as exc:  # Spark refused to start it: said in status, tried again later
            hosted.error = f"{type(exc).__name__}: {exc}"
            log.error("stateful stage %s did not start: %s", fqfn, hosted.error)

    @staticmethod
    def _account(hosted: HostedStage, query=None) -> None:
        """Add the progress reports of `query` (default: the current run) not counted yet."""
        query = query or hosted.stage.query
        if query is None:
            return
        from pulsar_autoscale.functions.spark.stateful import progress_field as field_of

        parallelism = hosted.stage.config.parallelism
        for p in query.recentProgress:
            key = (field_of(p, "runId"), field_of(p, "batchId"))
            if key in hosted.seen:
                continue
            hosted.seen.add(key)
            rows = field_of(p, "numInputRows") or 0
            busy = ((field_of(p, "durationMs") or {}).get("triggerExecution") or 0) / 1000.0 * parallelism
            hosted.received += rows
            hosted.outputs += max(field_of(field_of(p, "sink"), "numOutputRows") or 0, 0)
            hosted.busy_s += busy
            hosted.busy_sq_s2 += busy * busy / rows if rows else 0.0

    # ---- what the Functions API shows -----------------------------------------------------------
    def has(self, fqfn: str) -> bool:
        with self._lock:
            return fqfn in self._stages

    def names(self, tenant: str, namespace: str) -> list[str]:
        with self._lock:
            return sorted(
                h.stage.config.name
                for h in self._stages.values()
                if (h.stage.config.tenant, h.stage.config.namespace) == (tenant, namespace)
            )

    def config(self, fqfn: str) -> dict:
        return self._get(fqfn).stage.config.to_dict()

    def function_view(self, fqfn: str) -> dict:
        """The stage as a Pulsar FunctionConfig: what the controller's graph and Plan step read."""
        cfg = self._get(fqfn).stage.config
        return {
            "tenant": cfg.tenant,
            "namespace": cfg.namespace,
            "name": cfg.name,
            "runtime": STAGE_RUNTIME,
            "className": f"stateful:{cfg.aggregation}",
            "inputs": [cfg.input],
            "output": cfg.output,
            "parallelism": cfg.parallelism,
            "processingGuarantees": "ATLEAST_ONCE",
        }

    def status(self, fqfn: str) -> dict:
        hosted = self._get(fqfn)
        st = hosted.stage.status(with_backlog=False)
        error = st.error or ("" if st.running else hosted.error)
        instances = [
            {
                "instanceId": i,
                "status": {"running": st.running, "error": error, "numRestarts": hosted.restarts, "workerId": self.worker_id},
            }
            for i in range(st.parallelism)
        ]
        return {
            "numInstances": st.parallelism,
            "numRunning": st.parallelism if st.running else 0,
            "instances": instances,
            "stage": asdict(st),
        }

    def stats(self, fqfn: str) -> dict:
        hosted = self._get(fqfn)
        with hosted.lock:
            self._account(hosted)
            st = hosted.stage.status(with_backlog=True)
            counters = FunctionCounters(
                time=time.time(),
                arrived=None,
                received=hosted.received,
                processed=hosted.received,
                outputs=hosted.outputs,
                busy_s=hosted.busy_s,
                busy_sq_s2=hosted.busy_sq_s2,
            )
        running = st.parallelism if st.running else 0
        return {
            "receivedTotal": counters.received,
            "processedSuccessfullyTotal": counters.processed,
            "systemExceptionsTotal": hosted.restarts,
            "userExceptionsTotal": 0,
            "instances": [{"instanceId": i, "metrics": {}} for i in range(running)],
            "autoscale": {
                "counters": asdict(counters),
                "backlog": st.backlog_entries,
                "stage": {k: v for k, v in asdict(st).items() if k != "end_offsets"},
            },
        }

    def _get(self, fqfn: str) -> HostedStage:
        with self._lock:
            hosted = self._stages.get(fqfn)
        if hosted is None:
            raise StageNotFound(f"Stateful stage {fqfn} doesn't exist")
        return hosted
