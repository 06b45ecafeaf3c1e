"""Burst drains the controller asks of this worker: one Spark batch job at a time per function.

The worker holds what a drain needs (the function's config and code, the broker client
settings), so the controller only says how many messages and how many partitions
(POST .../burst); the drain runs in a background thread on the worker's SparkSession (local[*], or
the Spark cluster of --spark-master) created on the first burst (about 10 s), and its result is kept for GET .../burst. A drain never runs
twice at once for one function: a second ask starts nothing and gets the running drain back
(not queued, because the backlog it was sized for is being drained already).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.config import FunctionConfig

if TYPE_CHECKING:  # pragma: no cover
    from pulsar_autoscale.broker.profile import BrokerProfile
    from pulsar_autoscale.pulsar_client import ClientSettings
    from pulsar_autoscale.spark_bridge.session import SparkSettings

log = logging.getLogger(__name__)
KEPT_RESULTS = 10


@dataclass
class BurstRecord:
    """One drain as GET .../burst reports it: running until `finished_at`, then its counts or error."""

    requested: int
    partitions: int
    threads_per_partition: int
    started_at: float
    finished_at: float | None = None
    taken: int = 0
    processed: int = 0
    outputs: int = 0
    failed: int = 0
    error: str | None = None
    timings: dict = field(default_factory=dict)


class BurstRunner:
    """`client`: the broker URL, or ClientSettings with auth and TLS; `spark`: where drains run
    (default local[*]; a Spark cluster with the worker's --spark-master)."""

    def __init__(self, client: "ClientSettings | str", broker: "BrokerProfile", spark: "SparkSettings | None" = None):
        self.client = client
        self.broker = broker  # the worker's; replaced once an "auto" worker has learnt it
        self.spark = spark
        self._lock = threading.Lock()
        self._running: dict[str, BurstRecord] = {}
        self._done: dict[str, list[BurstRecord]] = {}

    def start(
        self, cfg: FunctionConfig, code_path: str | None, state_path: str, messages: int, partitions: int, threads: int
    ) -> tuple[BurstRecord, bool]:
        """(the drain, True) when one starts; (the one still running, False) otherwise."""
        for label, value in (("messages", messages), ("partitions", partitions), ("threadsPerPartition", threads)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"burst: {label} must be an integer >= 1, got {value!r}")
        try:
            from pulsar_autoscale.functions.spark.burst_drain import BurstDrain
        except ImportError as exc:  # the spark extra is not installed
            raise ConfigError(f"burst: this worker cannot run Spark ({exc}); install pulsar-autoscale[spark]") from None
        # Checks the function (SHARED subscription, loadable code) before anything is taken.
        drain = BurstDrain(None, self.client, cfg, code_path, broker_kind=self.broker, state_path=state_path)
        with self._lock:
            if cfg.fqfn in self._running:
                return self._running[cfg.fqfn], False
            record = self._running[cfg.fqfn] = BurstRecord(messages, partitions, threads, time.time())
        threading.Thread(target=self._run, args=(cfg.fqfn, drain, record), name=f"burst:{cfg.fqfn}", daemon=True).start()
        return record, True

    def _run(self, fqfn: str, drain, record: BurstRecord) -> None:
        try:
            from pulsar_autoscale.spark_bridge import worker_session

            drain.spark = worker_session(self.spark, "pulsar-autoscale-burst")
            result = drain.run(record.requested, record.partitions, record.threads_per_partition)
            record.taken, record.processed, record.outputs, record.failed = (
                result.taken,
                result.processed,
                result.outputs,
                result.failed,
            )
            record.timings = {k: round(v, 3) for k, v in result.timings.items()}
            log.info(
                "burst drain of %s: %d taken, %d processed, %d failed in %.1f s",
                fqfn,
                result.taken,
                result.processed,
                result.failed,
                result.seconds,
            )
        except Exception as exc:  # reported through GET .../burst; the drain nacked what it took
            record.error = f"{type(exc).__name__}: {exc}"
            log.error("burst drain of %s failed: %s", fqfn, record.error)
        finally:
            record.finished_at = time.time()
            with self._lock:
                del self._running[fqfn]
                kept = self._done.setdefault(fqfn, [])
                kept.append(record)
                del kept[:-KEPT_RESULTS]

    def report(self, fqfn: str) -> dict:
        with self._lock:
            running = self._running.get(fqfn)
            return {"running": asdict(running) if running else None, "finished": [asdict(r) for r in self._done.get(fqfn, [])]}
