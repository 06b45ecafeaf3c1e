"""The function worker: hosts functions and applies parallelism changes as a diff.

Scaling out starts only the missing instance ids; scaling in drains and stops only the
highest ids. Every other instance keeps running: its numRestarts and start time do not
change. Anything else in an update (code, userConfig, ...) restarts all instances, as
Pulsar does, because the running code or configuration changes.

User code never runs in the worker's control path: a create or update imports the code in a child
process first (functions/instance/validation.py) and only then puts it in place, atomically; drains (scale-in,
update, delete, stop) stop the instances at once and wait for their in-flight work in the background,
with a bound, so no request waits on user code and no function blocks another.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import pulsar

from pulsar_autoscale.broker import lite_quirks
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.functions.instance.instance import NACK_REDELIVERY_DELAY_MS, subscribe
from pulsar_autoscale.functions.instance.stats import InstanceFigures, InstanceStats
from pulsar_autoscale.functions.instance.validation import VALIDATE_TIMEOUT_S, code_digest, serde_names, validate
from pulsar_autoscale.functions.keyed.cluster import ClusterKeyed
from pulsar_autoscale.functions.keyed.migration import InstanceStateStores, KeyedScaler
from pulsar_autoscale.functions.keyed.routing import KeyedRouter, keyed_subscription_type
from pulsar_autoscale.functions.model.config import DEFAULT_MAX_PARALLELISM, FunctionConfig, keyed_migration, with_new_state
from pulsar_autoscale.functions.model.errors import BrokerUnavailable, Conflict, NotFound, StaleEpoch
from pulsar_autoscale.functions.model.keygroups import KeyGroupAssignment
from pulsar_autoscale.functions.runtimes.handles import (
    RUNTIMES,
    InstanceHandle,
    ProcessInstance,
    ThreadInstance,
    start_process_server,
)
from pulsar_autoscale.functions.runtimes.remote_state import KeyedParts
from pulsar_autoscale.functions.runtimes.warm_pool import Standby, WarmPool
from pulsar_autoscale.functions.spark.bursts import BurstRecord, BurstRunner
from pulsar_autoscale.functions.spark.stages import StageHost
from pulsar_autoscale.functions.state.changelog import changelog_of, state_topic
from pulsar_autoscale.functions.state.store import StateStore
from pulsar_autoscale.functions.state.topics import StateTopicCleaner, StateTopicsError, web_service_url_checked
from pulsar_autoscale.functions.worker.broker_watch import BrokerWatch
from pulsar_autoscale.pulsar_client import ClientSettings, open_client
from pulsar_autoscale.snapshot import FunctionCounters
from pulsar_autoscale.spark_bridge.session import SparkSettings

log = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 30.0    # a draining instance still busy after this is abandoned (runtime.InstanceHandle.abandon)
STALL_AFTER_S = 30.0      # in-flight work without progress this long: status says running false, "stalled"
NAME_MAX = 255            # tenant, namespace and name are directories of the data dir
HISTORY_S = 70.0
RESTART_BACKOFF_S = 5.0


@dataclass(frozen=True)
class WarmPoolView:
    """A function's warm pool as GET .../warm-pool shows it: standbys asked, held (warm or warming), warm."""
    size: int
    held: int
    ready: int
    runtime: str      # "thread": no pool is kept, whatever the size


@dataclass
class HostedFunction:
    config: FunctionConfig
    code_path: str | None
    state: StateStore
    instances: dict[int, InstanceHandle] = field(default_factory=dict)
    restarts: dict[int, int] = field(default_factory=dict)
    last_restart: dict[int, float] = field(default_factory=dict)
    stopped: set[int] = field(default_factory=set)             # instances stopped by the user (start/stop API)
    retired: InstanceFigures | None = None                      # sums of drained instances' figures
    history: deque = field(default_factory=deque)               # (time, FunctionCounters) for the "1min" window
    num_instances: object = None                                 # shared int for Context.get_num_instances
    shared_input: object = None                                  # pulsar-lite only: lite_quirks.SharedInput
    warm_pool: WarmPool | None = None                            # process runtime: warm standbys
    warm_pool_size: int | None = None                            # asked by the controller (None: the worker's)
    code_digest: str | None = None                               # sha256 of code_path, which passed validation
    failure: str = ""                                            # why the function cannot run (no instances run)
    draining: list = field(default_factory=list)                 # stopped instances finishing in-flight work
    abandoned: int = 0                                           # drains that did not finish within the bound
    keyed: KeyedScaler | ClusterKeyed | None = None              # keyedState: key-group routing + live migration

    def runtime(self, default: str) -> str:
        return self.config.instanceRuntime or default


def _sum_figures(a: InstanceFigures | None, b: InstanceFigures) -> InstanceFigures:
    if a is None:
        return replace(b, latest_user_exceptions=(), latest_system_exceptions=(), user_metrics={})
    return replace(
        a,
        received=a.received + b.received, processed=a.processed + b.processed,
        user_exceptions=a.user_exceptions + b.user_exceptions,
        system_exceptions=a.system_exceptions + b.system_exceptions, outputs=a.outputs + b.outputs,
        busy_s=a.busy_s + b.busy_s, busy_sq_s2=a.busy_sq_s2 + b.busy_sq_s2,
        interarrival_n=a.interarrival_n + b.interarrival_n, interarrival_s=a.interarrival_s + b.interarrival_s,
        interarrival_sq_s2=a.interarrival_sq_s2 + b.interarrival_sq_s2,
        wait_s=a.wait_s + b.wait_s, newest_publish_ms=max(a.newest_publish_ms, b.newest_publish_ms),
        in_flight=a.in_flight + b.in_flight,
        last_invocation_ms=max(a.last_invocation_ms, b.last_invocation_ms),
    )


class Worker:
    def __init__(self, service_url: str | ClientSettings, data_dir: str, worker_id: str = "worker-0",
                 default_runtime: str = "thread",
                 max_parallelism: int = DEFAULT_MAX_PARALLELISM, broker_kind: str = "apache",
                 hostname: str = "127.0.0.1", port: int = 0, warm_pool: int = 0, metrics_url: str | None = None,
                 spark: SparkSettings | None = None, web_service_url: str | None = None):
        if default_runtime not in RUNTIMES:
            raise ConfigError(f"runtime {default_runtime!r} is unknown: use one of {', '.join(RUNTIMES)}")
        # the broker and its auth/TLS settings (pulsar_client.py); service_url stays for what takes a URL only
        self.client_settings = ClientSettings.of(service_url)
        service_url = self.service_url = self.client_settings.service_url
        self.data_dir = Path(data_dir)
        self.worker_id = worker_id
        self.default_runtime = default_runtime
        self.max_parallelism = max_parallelism
        self.broker_kind = broker_kind
        self.hostname, self.port = hostname, port
        self.warm_pool = warm_pool   # warm standbys per process-runtime function (functions/runtimes/warm_pool.py)
        if warm_pool < 0:
            raise ConfigError(f"warm pool size must be >= 0, got {warm_pool}")
        self.validate_timeout_s = VALIDATE_TIMEOUT_S
        self.drain_timeout_s = DRAIN_TIMEOUT_S
        self.stall_after_s = STALL_AFTER_S
        self._metrics_url = metrics_url  # read for broker_kind "auto", and by the B12 fence on pulsar-lite
        # the broker's admin REST API (Pulsar's pulsarWebServiceUrl): where a deleted function's state topics go
        self._state_topics = None if web_service_url is None else StateTopicCleaner(
            web_service_url_checked(web_service_url), self.client_settings.http_session())
        self._stall_fence: lite_quirks.StallFence | None = None   # set by _connect once the broker's kind is known
        self._client: pulsar.Client | None = None  # this incarnation's, opened by _connect once the broker answers
        self._connected = threading.Event()
        self._broker_watch: BrokerWatch | None = None   # started with the client (functions/worker/broker_watch.py)
        self._waiting_for = "the broker"
        self._functions: dict[str, HostedFunction] = {}
        self.bursts = BurstRunner(self.client_settings, broker_kind, spark)          # spark: --spark-master (default local[*])
        self.stages = StageHost(self.data_dir, self.client_settings, worker_id, spark)
        self._max_epoch = 0
        # A cluster member sets it: a keyedState function's instances are spread over the cluster's workers,
        # fed through route topics by one front (functions/keyed/cluster.py, docs/keyed-state.md).
        self.keyed_spread = False
        self._lock = threading.RLock()
        self._creating: set[str] = set()                 # names reserved while their code is validated
        self._deleting: set[str] = set()                 # names reserved until a delete has moved the files aside
        self._retirers: list[threading.Thread] = []      # background drains
        shutil.rmtree(self._trash_dir(), ignore_errors=True)  # deletes a previous run did not finish
        self._closing = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="worker-supervisor", daemon=True)
        self._restore()
        threading.Thread(target=self._connect, name="worker-connect", daemon=True).start()
        self._supervisor.start()

    # ---- the broker: reached in the background, so the API serves (and status tells) at once -------
    def _connect(self) -> None:
        """Learn the broker's kind (retrying while its metrics do not answer, never guessing), open this
        incarnation's client (on pulsar-lite with consumer ids of its own: lite_quirks), then start
        the instances of the restored functions."""
        if self.broker_kind == "auto":
            self._waiting_for = f"the broker's metrics at {self._metrics_url} (to tell pulsar-lite from Apache Pulsar)"
            self.broker_kind = lite_quirks.detect_broker_kind(self._metrics_url, stop=self._closing)
            self.bursts.broker_kind = self.broker_kind
        self._stall_fence = lite_quirks.StallFence.for_broker(self.broker_kind, self._metrics_url)
        self._waiting_for = f"the broker at {self.service_url}"
        client = None
        while client is None and not self._closing.is_set():
            try:
                client = lite_quirks.incarnation_client(self.client_settings, self.broker_kind,
                                                        operation_timeout_seconds=30, log_level=pulsar.LoggerLevel.Warn)
            except (pulsar.PulsarException, lite_quirks.LiteJoinError) as exc:
                log.warning("cannot reach the broker at %s yet (%s); retrying", self.service_url, exc)
                self._closing.wait(1.0)
        if client is None:
            return
        self._broker_watch = BrokerWatch(client.get_topic_partitions, self._probe_topic, self._closing).start()
        with self._lock:
            self._client = client
            self._connected.set()
            for fn in self._functions.values():
                if fn.failure:
                    continue
                if fn.shared_input is None and self.broker_kind == "pulsar-lite":
                    self._fence_input(fn)
                try:
                    if fn.config.skipToLatest:
                        self._skip_to_latest(fn.config)
                    self._scale(fn, fn.config.parallelism)
                except Exception:
                    log.exception("cannot start the instances of %s", fn.config.fqfn)
        log.info("connected to the broker (%s); %d function(s) running", self.broker_kind, len(self._functions))

    def _probe_topic(self) -> str | None:
        # no lock: a request holding it for seconds must not look like a silent broker
        return next((fn.config.inputs[0] for fn in list(self._functions.values()) if fn.instances and fn.config.inputs),
                    None)

    def broker_problem(self) -> str:
        """Why no instance can be running now ("" while the broker answers its probe)."""
        return self._broker_watch.problem() if self._broker_watch is not None else ""

    def _require_broker(self, timeout_s: float = 30.0) -> None:
        if not self._connected.wait(timeout_s):
            raise BrokerUnavailable(f"the worker is still waiting for {self._waiting_for}")

    # ---- persistence: nothing accepted is lost when the worker restarts ------------------------
    def _fn_dir(self, cfg: FunctionConfig) -> Path:
        return self.data_dir / "functions" / cfg.tenant / cfg.namespace / cfg.name

    def _save(self, fn: HostedFunction) -> None:
        d = self._fn_dir(fn.config)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "config.json.tmp"
        tmp.write_text(json.dumps({"config": fn.config.to_dict(), "code_path": fn.code_path,
                                   "code_digest": fn.code_digest}, indent=1))
        os.replace(tmp, d / "config.json")

    def _restore(self) -> None:
        for path in sorted((self.data_dir / "functions").glob("*/*/*/config.json")):
            try:
                saved = json.loads(path.read_text())
                cfg = FunctionConfig.accepted(saved["config"], self.max_parallelism)
                self._host(cfg, saved.get("code_path"), *self._checked_restore(cfg, saved))
                log.info("restored function %s with parallelism %d", cfg.fqfn, cfg.parallelism)
            except (PulsarAutoscaleError, ValueError, KeyError) as exc:
                log.error("cannot restore function from %s: %s", path, exc)

    def _checked_restore(self, cfg: FunctionConfig, saved: dict) -> tuple[str | None, str]:
        """(digest, failure) of restored code: code that passed validation when it was stored (same sha256)
        runs; other code (stored before validation existed, or changed on disk) is validated first."""
        code_path = saved.get("code_path")
        try:
            digest = code_digest(code_path)
        except OSError as exc:
            return None, f"code {code_path} cannot be read: {exc.strerror}"
        if digest is not None and digest == saved.get("code_digest"):
            return digest, ""
        try:
            validate(cfg.className, code_path, timeout_s=self.validate_timeout_s)
        except ConfigError as exc:
            log.error("restored function %s cannot run: %s", cfg.fqfn, exc)
            return digest, f"function failed validation: {exc}"
        return digest, ""

    # ---- admin operations ---------------------------------------------------------------------
    def create(self, cfg: FunctionConfig, code: bytes | None = None, filename: str | None = None) -> FunctionConfig:
        cfg = with_new_state(FunctionConfig.from_dict(cfg.to_dict(), self.max_parallelism))
        for label, value in (("tenant", cfg.tenant), ("namespace", cfg.namespace), ("name", cfg.name)):
            if value in (".", ".."):
                raise ConfigError(f"Function {label} {value!r} is not a valid name")
            if len(value.encode()) > NAME_MAX:
                raise ConfigError(f"Function {label} is {len(value.encode())} bytes long: at most {NAME_MAX}")
        self._require_broker()
        if self.broker_kind == "pulsar-lite":
            lite_quirks.check_function(cfg)
        with self._lock:
            if cfg.fqfn in self._functions or cfg.fqfn in self._creating or self.stages.has(cfg.fqfn):
                raise Conflict(f"Function {cfg.name} already exists")
            if cfg.fqfn in self._deleting:
                raise Conflict(f"Function {cfg.name} is being deleted: create it again once the delete has "
                               "answered")
            self._creating.add(cfg.fqfn)
        try:
            # Nothing is left behind by a create that fails: the function's directory is new and ours.
            try:
                code_path = self._stage_code(cfg, code, filename)
                self._validate(cfg.className, code_path, cfg)
            except BaseException:
                shutil.rmtree(self._fn_dir(cfg), ignore_errors=True)
                raise
            with self._lock:
                fn = self._host(cfg, code_path, code_digest(code_path))
                self._save(fn)
            return cfg
        finally:
            with self._lock:
                self._creating.discard(cfg.fqfn)

    def _validate(self, class_name: str, code_path: str | None, cfg: FunctionConfig) -> None:
        """Import the code in a child process (functions/instance/validation.py): refuse now what could never run,
        its serde classes included."""
        validate(class_name, code_path, timeout_s=self.validate_timeout_s, serdes=serde_names(cfg))

    def _stage_code(self, cfg: FunctionConfig, code: bytes | None, filename: str | None) -> str | None:
        """Write uploaded code where nothing reads it yet: a directory named by its digest. It becomes the
        function's code only when the saved config names it (an atomic rename)."""
        if code is None:
            if cfg.py:
                raise ConfigError(f"py {cfg.py!r} names a file on the worker's host: py may only name uploaded "
                                  "code (send the file as the multipart `data` part)")
            return None
        name = Path(filename or cfg.py or f"{cfg.className.split('.')[0]}.py").name
        if not name.endswith(".py"):
            raise ConfigError(f"function package {name!r} is not a .py file (only Python files run here)")
        if len(name.encode()) > NAME_MAX:
            raise ConfigError(f"function file name is {len(name.encode())} bytes long: at most {NAME_MAX}")
        d = self._fn_dir(cfg) / "code" / hashlib.sha256(code).hexdigest()[:16]
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{name}.tmp"
        tmp.write_bytes(code)
        os.replace(tmp, d / name)
        return str(d / name)

    def _discard_code(self, cfg: FunctionConfig, code_path: str | None) -> None:
        """Remove code the function no longer uses (only what the worker stored under its directory)."""
        if not code_path:
            return
        path, code_root = Path(code_path), self._fn_dir(cfg) / "code"
        if path.parent.parent == code_root:
            shutil.rmtree(path.parent, ignore_errors=True)
        elif path.parent == self._fn_dir(cfg):
            path.unlink(missing_ok=True)

    def _host(self, cfg: FunctionConfig, code_path: str | None, digest: str | None = None,
              failure: str = "") -> HostedFunction:
        fn = self._hosted(cfg, code_path, digest, failure)
        if not failure and self._connected.is_set():  # else _connect starts them
            if cfg.skipToLatest:
                self._skip_to_latest(cfg)
            self._scale(fn, cfg.parallelism)
        return fn

    def _skip_to_latest(self, cfg: FunctionConfig) -> None:
        """Pulsar's skipToLatest: a function (re)started by a create or a worker restart skips its backlog.
        Not on a scale-out: a new instance must share the backlog, not discard it."""
        consumer = subscribe(self._client, cfg, f"{cfg.fqfn}:skip")
        try:
            consumer.seek(pulsar.MessageId.latest)
        finally:
            consumer.close()

    def _hosted(self, cfg: FunctionConfig, code_path: str | None, digest: str | None = None,
                failure: str = "") -> HostedFunction:
        runtime = cfg.instanceRuntime or self.default_runtime
        if runtime == "process":   # the fork server boots meanwhile (restore, validation, connecting)
            start_process_server()
        num = ProcessInstance._ctx.Value("i", cfg.parallelism) if runtime == "process" else _Counter(cfg.parallelism)
        state = StateStore(self._fn_dir(cfg) / "state.sqlite", cfg.numKeyGroups, keyed=cfg.keyedState)
        fn = HostedFunction(cfg, code_path, state, num_instances=num, code_digest=digest, failure=failure)
        if cfg.keyedState:
            fn.keyed = self._keyed(fn)
        self._functions[cfg.fqfn] = fn
        self._fence_input(fn)
        return fn

    def _keyed(self, fn: HostedFunction) -> KeyedScaler | ClusterKeyed:
        """The key-group router and scaler of a keyedState function; its assignment survives restarts.
        On a cluster: its part on this worker (route inputs; the front while instance 0 runs here)."""
        cfg = fn.config

        def open_consumer():   # with the config of the moment: an update (maxMessageRetries, ...) reopens it
            now = fn.config
            return lite_quirks.fence_stalls(lambda: subscribe(
                self._client, now, now.fqfn,
                lite_quirks.keyed_subscription_type(keyed_subscription_type(now), self.broker_kind)),
                now.inputs, now.subscription_name, self._stall_fence)
        if self.keyed_spread:
            return ClusterKeyed(cfg, self._fn_dir(cfg) / "keyed-state", lambda: self._client, open_consumer,
                                self.broker_kind, lambda: fn.config, lambda: self._stall_fence)
        path = self._fn_dir(fn.config) / "keygroups.json"
        new = not path.exists()
        if not new:
            saved = json.loads(path.read_text())
            assignment = KeyGroupAssignment(saved["num_key_groups"], tuple(saved["owners"]))
        else:
            assignment = KeyGroupAssignment.uniform(fn.config.numKeyGroups, max(fn.config.parallelism, 1))

        def save(a: KeyGroupAssignment) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"num_key_groups": a.num_key_groups, "owners": list(a.owners)}))
            os.replace(tmp, path)

        def start(i: int) -> None:
            with self._lock:
                if self._functions.get(fn.config.fqfn) is fn and i not in fn.instances:
                    self._start_instance(fn, i)

        def drain(ids: list[int]) -> None:
            with self._lock:
                self._drain(fn, ids)

        router = KeyedRouter(assignment, open_consumer, queue_size=lambda: fn.config.receiverQueueSize)
        stores = InstanceStateStores(self._fn_dir(cfg) / "keyed-state", cfg.numKeyGroups, lambda: router.assignment,
                                     lambda: self._client, changelog_of(cfg), new)
        save(assignment)
        return KeyedScaler(router, stores, start, drain, save, settings=lambda: keyed_migration(fn.config))

    def _subscribe(self, cfg: FunctionConfig, consumer_name: str):
        """The function's input consumer, fenced against pulsar-lite's defects (lite_quirks): Failover's (B1,
        B13), and a broker that stops dispatching to it (B12)."""
        def open_consumer():
            consumer = subscribe(self._client, cfg, consumer_name,
                                 receiver_queue_size=lite_quirks.failover_receiver_queue(cfg, self.broker_kind))
            return lite_quirks.fence_nacks(consumer, cfg, self._client, self.broker_kind,
                                           NACK_REDELIVERY_DELAY_MS / 1000)
        return lite_quirks.fence_stalls(open_consumer, cfg.inputs, cfg.subscription_name, self._stall_fence)

    def _fence_input(self, fn: HostedFunction) -> None:
        """On pulsar-lite, process instances receive through the worker's one consumer (lite_quirks, B2);
        the warm standbys are made for that input. Again once _connect has learnt the broker's kind."""
        if self.broker_kind == "pulsar-lite" and fn.shared_input is None and fn.keyed is None:
            fn.shared_input = lite_quirks.SharedInput(lambda: self._subscribe(fn.config, fn.config.fqfn))
        self._renew_pool(fn)

    def _renew_pool(self, fn: HostedFunction) -> None:
        """Standbys hold the function's code and config: a new pool whenever those change."""
        if fn.warm_pool is not None:
            fn.warm_pool.close()
            fn.warm_pool = None
        size = self.warm_pool if fn.warm_pool_size is None else fn.warm_pool_size
        if size > 0 and fn.runtime(self.default_runtime) == "process" and not fn.failure:
            cfg, state_path = fn.config, str(self._fn_dir(fn.config) / "state.sqlite")
            fn.warm_pool = WarmPool(size, lambda: Standby(
                ProcessInstance._ctx, cfg, self.client_settings, fn.code_path, state_path, fn.num_instances,
                fn.shared_input is not None or fn.keyed is not None))

    def set_warm_pool(self, fqfn: str, size: int) -> WarmPoolView:
        """The controller sizes a function's warm pool (controller/warm_sizing.py); at most max_parallelism
        standbys, as more could never all be taken. Kept until the worker restarts (then --warm-pool)."""
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= self.max_parallelism:
            raise ConfigError(f"standbys must be an integer from 0 to {self.max_parallelism} (the worker's "
                              f"max parallelism), got {size!r}")
        with self._lock:
            fn = self._get(fqfn)
            fn.warm_pool_size = size
            if fn.warm_pool is not None and size > 0:
                fn.warm_pool.resize(size)
            elif (fn.warm_pool is None) != (size == 0):
                self._renew_pool(fn)
            return self.warm_pool_view(fqfn)

    def warm_pool_view(self, fqfn: str) -> WarmPoolView:
        with self._lock:
            fn = self._get(fqfn)
            pool = fn.warm_pool
            return WarmPoolView(size=self.warm_pool if fn.warm_pool_size is None else fn.warm_pool_size,
                                held=pool.standby if pool else 0, ready=pool.ready_count() if pool else 0,
                                runtime=fn.runtime(self.default_runtime))

    # ---- cluster mode (functions/cluster/): the cluster's assignment says which ids run here ------
    @property
    def pulsar_client(self) -> pulsar.Client:
        """This incarnation's client, once the broker has answered (BrokerUnavailable after 30 s)."""
        self._require_broker()
        return self._client

    def host_instances(self, cfg: FunctionConfig, code_path: str | None, ids: set[int], front: bool = False) -> None:
        """Run exactly `ids` of the function here: start the missing ones, drain the others (highest
        first); the rest keep running. A change of anything but parallelism restarts them, as update() does.
        `front`: a keyedState function's front runs here (instance 0 is assigned here, running or stopped)."""
        self._require_broker()
        with self._lock:
            fn = self._functions.get(cfg.fqfn)
            if fn is None:
                fn = self._hosted(cfg, code_path)
            elif code_path != fn.code_path or replace(cfg, parallelism=fn.config.parallelism) != fn.config:
                self._drain(fn, sorted(fn.instances, reverse=True))
                fn.restarts = {i: n + 1 for i, n in fn.restarts.items()}
            fn.config, fn.code_path = cfg, code_path
            fn.num_instances.value = cfg.parallelism
            leaving = sorted((i for i in fn.instances if i not in ids), reverse=True)
            keyed = fn.keyed
            # a keyedState instance that leaves this worker forgets its stores: it restores when it comes back
            # (unless it is back already: started again here while it drained, it uses the same store)
            self._drain(fn, leaving, then=None if keyed is None else lambda: self._forget_stores(fn, set(leaving)))
            for i in sorted(ids):
                if i not in fn.instances:
                    self._start_instance(fn, i)
            if keyed is not None:
                if front and cfg.parallelism > 0:
                    keyed.start_front(cfg.parallelism)
                else:
                    keyed.stop_front()

    def _forget_stores(self, fn: HostedFunction, left: set[int]) -> None:
        fn.keyed.stores.snapshot(left)   # they drained; not under the worker's lock: a broker round trip
        with self._lock:   # a start of one of them waits: it must find its store open or gone, not closing
            fn.keyed.stores.forget({i for i in left if i not in fn.instances})

    def keyed_holds_groups(self, fqfn: str, instance_id: int) -> bool:
        """Cluster: whether this worker's instance of a keyedState function still holds key groups."""
        with self._lock:
            fn = self._functions.get(fqfn)
            return fn is not None and isinstance(fn.keyed, ClusterKeyed) and fn.keyed.holds_groups(instance_id)

    def keyed_surplus(self, fqfn: str) -> set[int]:
        """Cluster, the front's worker: the keyedState function's instances beyond its parallelism that still
        own key groups (keyed_cluster.ClusterKeyed.surplus_owners)."""
        with self._lock:
            fn = self._functions.get(fqfn)
            if fn is None or not isinstance(fn.keyed, ClusterKeyed):
                return set()
            return fn.keyed.surplus_owners(fn.config.parallelism)

    def hosted_ids(self) -> dict[str, set[int]]:
        with self._lock:
            return {fqfn: set(fn.instances) for fqfn, fn in self._functions.items()}

    def unhost(self, fqfn: str) -> None:
        """Cluster mode: the function was deleted."""
        with self._lock:
            fn = self._functions.pop(fqfn, None)
            if fn is None:
                return
            self._deleting.add(fqfn)
        self._remove(fn)

    def update(self, fqfn: str, changes: dict, code: bytes | None = None, filename: str | None = None) -> FunctionConfig:
        self._require_broker()
        with self._lock:
            fn = self._get(fqfn)
            new = self._merge(fn, changes, code)
            if code is None and changes.get("py") not in (None, "", fn.config.py):
                raise ConfigError(f"py {changes['py']!r} names a file on the worker's host: py may only name "
                                  "uploaded code (send the file as the multipart `data` part)")
            if code is None and new.className == fn.config.className and not fn.failure:
                return self._apply(fn, new, fn.code_path, fn.code_digest)
            code_path = fn.code_path
        # New code or a new entry point: validated in a child, outside the lock (other functions go on).
        if code is not None:
            code_path = self._stage_code(new, code, filename)
        try:
            self._validate(new.className, code_path, new)
        except BaseException:
            if code_path != fn.code_path:
                self._discard_code(new, code_path)
            raise
        with self._lock:
            if self._functions.get(fqfn) is not fn:
                self._discard_code(new, code_path)
                raise NotFound(f"Function {fqfn} was deleted while its update was validated")
            return self._apply(fn, self._merge(fn, changes, code), code_path, code_digest(code_path))

    def _merge(self, fn: HostedFunction, changes: dict, code: bytes | None) -> FunctionConfig:
        try:
            return fn.config.merged(changes, self.max_parallelism)
        except ConfigError as exc:
            if code is None or str(exc) != "Update contains no change":
                raise
            return fn.config

    def _apply(self, fn: HostedFunction, new: FunctionConfig, code_path: str | None, digest: str | None
               ) -> FunctionConfig:
        """Switch the function to validated config and code (the saved config names the code: atomic)."""
        old, old_code = fn.config, fn.code_path
        only_parallelism = code_path == old_code and not fn.failure and replace(new, parallelism=old.parallelism) == old
        fn.config, fn.code_path, fn.code_digest, fn.failure = new, code_path, digest, ""
        self._save(fn)
        if old_code != code_path:
            self._discard_code(new, old_code)
        if only_parallelism:
            self._scale(fn, new.parallelism)
        elif isinstance(fn.keyed, KeyedScaler):
            # One consumer feeds every instance: it reopens with the new config once the last old instance
            # has closed, so the new ones start then (started at once they would keep the old consumer open).
            fn.restarts = {i: n + 1 for i, n in fn.restarts.items()}
            fn.stopped = set()
            self._drain(fn, sorted(fn.instances, reverse=True), then=lambda: self._start_after_update(fn))
        else:
            self._scale(fn, 0)
            fn.restarts = {i: n + 1 for i, n in fn.restarts.items()}
            self._renew_pool(fn)
            self._scale(fn, new.parallelism)
        return new

    def _start_after_update(self, fn: HostedFunction) -> None:
        with self._lock:
            if self._functions.get(fn.config.fqfn) is fn and not fn.instances and fn.config.parallelism > 0:
                self._scale(fn, fn.config.parallelism)

    def fence(self, epoch: int) -> None:
        """Refuse a controller action whose leader epoch is older than one already seen."""
        with self._lock:
            if epoch < self._max_epoch:
                raise StaleEpoch(f"stale leader epoch {epoch} < {self._max_epoch}: this controller was deposed")
            self._max_epoch = epoch

    def create_stage(self, data: dict) -> None:
        """A Spark stateful stage next to the functions (functions/spark/stages.py)."""
        with self._lock:
            fqfn = f"{data.get('tenant', 'public')}/{data.get('namespace', 'default')}/{data.get('name')}"
            if fqfn in self._functions:
                raise Conflict(f"Function {data.get('name')} already exists")
            self.stages.create(data)

    def burst(self, fqfn: str, messages: int, partitions: int, threads: int = 1,
              function: tuple[FunctionConfig, str | None] | None = None) -> tuple[BurstRecord, bool]:
        """Hand up to `messages` of the function's backlog to a Spark burst drain (functions/spark/bursts.py);
        False with the running drain when one is still running. `function`: (config, code path) from a
        cluster's metadata, so a worker that runs none of the function's instances drains it too."""
        if function is None:
            with self._lock:
                fn = self._get(fqfn)
                function = fn.config, fn.code_path
        cfg, code_path = function
        return self.bursts.start(cfg, code_path, str(self._fn_dir(cfg) / "state.sqlite"), messages, partitions,
                                 threads)

    def delete(self, fqfn: str) -> None:
        """Gone at once; its name is free again when this returns; its instances drain and its files go in the
        background."""
        with self._lock:
            fn = self._get(fqfn)
            del self._functions[fqfn]
            self._deleting.add(fqfn)
        self._remove(fn)

    def _remove(self, fn: HostedFunction) -> None:
        """A keyedState function's live migration stops first (after its current subscale), so that nothing of
        it writes the function's files once they have moved aside, nor starts an instance; then the files move
        aside (the name is free again), the instances drain, and the files go."""
        fqfn = fn.config.fqfn
        try:
            if fn.keyed is not None and not fn.keyed.halt(self.drain_timeout_s):
                log.error("%s: the live migration under way did not stop within %.0f s of the delete", fqfn,
                          self.drain_timeout_s)
            with self._lock:
                self._retire_files(fn)
        finally:
            with self._lock:
                self._deleting.discard(fqfn)

    def _retire_files(self, fn: HostedFunction) -> None:
        d = self._fn_dir(fn.config)
        trash = self._to_trash(d) if d.exists() else None
        def then():
            if fn.keyed is not None:
                fn.keyed.stores.forget()   # their connections close before their files go
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
            if fn.config.cleanupSubscription:
                self._cleanup_subscription(fn.config)
            self._delete_state_topics(fn.config)
        if fn.warm_pool is not None:
            fn.warm_pool.close()
        self._drain(fn, sorted(fn.instances, reverse=True), then=then)

    def discard_files_except(self, known: set[str]) -> list[str]:
        """Cluster: the files of functions the cluster no longer has (deleted while this worker was down),
        other than any hosted here; `known`: every function of the cluster's metadata, read to its end."""
        gone: dict[str, Path] = {}
        with self._lock:
            for d in sorted((self.data_dir / "functions").glob("*/*/*")):
                fqfn = "/".join(d.relative_to(self.data_dir / "functions").parts)
                if d.is_dir() and fqfn not in known and fqfn not in self._functions and fqfn not in self._creating:
                    gone[fqfn] = self._to_trash(d)
        for trash in gone.values():
            shutil.rmtree(trash, ignore_errors=True)
        return sorted(gone)

    def _to_trash(self, d: Path) -> Path:
        """Moves a function's directory aside (its name is free at once); the caller removes what it returns."""
        trash = self._trash_dir() / uuid.uuid4().hex
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.replace(d, trash)
        return trash

    def _trash_dir(self) -> Path:
        return self.data_dir / "deleted"

    def _cleanup_subscription(self, cfg: FunctionConfig) -> None:
        """Pulsar's cleanupSubscription (default true): a deleted function's subscription goes with it,
        once its instances have drained, unless a function of the same name was created meanwhile."""
        with self._lock:
            if cfg.fqfn in self._functions:
                return
        # A client of its own and one plain consumer per topic: a refused unsubscribe closes the whole
        # connection on pulsar-lite (B3), and unsubscribing a multi-topic consumer on the worker's busy
        # client crashed the process (SIGSEGV in the C++ client) in 1 of 2 test runs.
        client = open_client(self.client_settings, operation_timeout_seconds=10)
        try:
            for topic in cfg.inputs:
                client.subscribe(topic, cfg.subscription_name, consumer_type=pulsar.ConsumerType.Shared,
                                 consumer_name=f"{cfg.fqfn}:cleanup").unsubscribe()
        except pulsar.PulsarException as exc:
            log.warning("could not remove the subscription %s of deleted function %s: %s",
                        cfg.subscription_name, cfg.fqfn, exc)
        finally:
            client.close()

    def _delete_state_topics(self, cfg: FunctionConfig) -> None:
        """As Pulsar drops a deleted function's state (functions/state/topics.py); a function created again under
        its name meanwhile has another stateId, so none of its topics."""
        prefix = state_topic(cfg.tenant, cfg.namespace, cfg.name, cfg.stateId, "")
        if self._state_topics is None:
            log.info("deleted function %s: its state topics %s* stay on the broker (the worker has no "
                     "--web-service-url; pulsar-admin topics delete them)", cfg.fqfn, prefix)
            return
        try:
            deleted = self._state_topics.delete(cfg)
        except StateTopicsError as exc:
            log.warning("deleted function %s: its state topics %s* stay on the broker: %s", cfg.fqfn, prefix, exc)
            return
        log.info("deleted function %s: deleted its %d state topics %s*", cfg.fqfn, len(deleted), prefix)

    def get(self, fqfn: str) -> FunctionConfig:
        with self._lock:
            return self._get(fqfn).config

    def code_file(self, fqfn: str) -> str | None:
        """The function's uploaded code (download), None when it runs an installed module."""
        with self._lock:
            return self._get(fqfn).code_path

    def state_store(self, fqfn: str, key: str) -> StateStore:
        """The store that holds `key` of the function's state (querystate/putstate): a keyedState
        function's is its owning instance's; 404 for a function not hosted here."""
        with self._lock:
            fn = self._get(fqfn)
            if isinstance(fn.keyed, ClusterKeyed):
                store = fn.keyed.local_store_for(key)
                if store is None:
                    raise NotFound(f"the key group of {key!r} of {fqfn} is held by no instance on this worker")
                return store
            return fn.state if fn.keyed is None else fn.keyed.stores.for_key(key)

    def list(self, tenant: str, namespace: str) -> list[str]:
        with self._lock:
            return sorted(f.config.name for f in self._functions.values()
                          if f.config.tenant == tenant and f.config.namespace == namespace)

    def functions(self) -> list[FunctionConfig]:
        with self._lock:
            return [f.config for f in self._functions.values()]

    def set_running(self, fqfn: str, running: bool, instance_id: int | None = None) -> None:
        """Pulsar's start/stop: a stopped instance stays stopped until started again."""
        self._require_broker()
        with self._lock:
            fn = self._get(fqfn)
            ids = range(fn.config.parallelism) if instance_id is None else [self._check_instance(fn, instance_id)]
            if running:
                self._check_runnable(fn)
            for i in ids:
                if running:
                    fn.stopped.discard(i)
                    if i not in fn.instances:
                        self._start_instance(fn, i)
                else:
                    fn.stopped.add(i)
                    self._drain(fn, [i])
            if running and self._keyed_change_pending(fn):
                self._scale(fn, fn.config.parallelism)   # a change made while owners were stopped

    def restart(self, fqfn: str, instance_id: int | None = None) -> None:
        self._require_broker()
        with self._lock:
            fn = self._get(fqfn)
            ids = list(range(fn.config.parallelism)) if instance_id is None else [self._check_instance(fn, instance_id)]
            self._check_runnable(fn)
            self._drain(fn, [i for i in ids if i in fn.instances])
            for i in ids:
                fn.stopped.discard(i)
                fn.restarts[i] = fn.restarts.get(i, 0) + 1
                self._start_instance(fn, i)

    def _check_runnable(self, fn: HostedFunction) -> None:
        if fn.failure:
            raise ConfigError(f"Function {fn.config.name} cannot start: {fn.failure} (update it with code that loads)")

    def _check_instance(self, fn: HostedFunction, instance_id: int) -> int:
        if not 0 <= instance_id < fn.config.parallelism:
            raise NotFound(f"Function {fn.config.name} has no instance {instance_id} "
                           f"(parallelism {fn.config.parallelism})")
        return instance_id

    def _get(self, fqfn: str) -> HostedFunction:
        fn = self._functions.get(fqfn)
        if fn is None:
            raise NotFound(f"Function {fqfn} doesn't exist")
        return fn

    # ---- the diff --------------------------------------------------------------------------------
    def _scale(self, fn: HostedFunction, target: int) -> None:
        fn.num_instances.value = target
        fn.stopped = {i for i in fn.stopped if i < target}   # a keyed surplus instance runs to hand its groups over
        keyed = fn.keyed is not None and target > 0
        if keyed and not fn.stopped:
            for i in range(max(target, fn.keyed.router.assignment.parallelism)):
                if i not in fn.instances:   # the owners of the current assignment run before groups move
                    self._start_instance(fn, i)
            fn.keyed.scale(target)
            return
        # keyed with a stopped owner: it cannot hand its groups over, so they move when it starts (as on a
        # cluster) and every instance keeps running meanwhile
        if not keyed:
            self._drain(fn, sorted((i for i in fn.instances if i >= target), reverse=True))
        for i in range(target):
            if i not in fn.instances and i not in fn.stopped:
                self._start_instance(fn, i)

    @staticmethod
    def _keyed_change_pending(fn: HostedFunction) -> bool:
        """A keyedState function whose groups are not yet spread over its parallelism (set while owners stopped)."""
        return fn.keyed is not None and fn.config.parallelism not in (0, fn.keyed.router.assignment.parallelism)

    def _start_instance(self, fn: HostedFunction, i: int) -> None:
        cfg = fn.config
        keyed = fn.keyed
        standby = fn.warm_pool.take() if fn.warm_pool is not None else None
        if fn.runtime(self.default_runtime) == "process" and keyed is not None:
            handle: InstanceHandle = ProcessInstance(
                cfg, i, self.client_settings, fn.code_path, None, fn.num_instances, None, standby=standby,
                keyed=KeyedParts(lambda: keyed.open_input(i), keyed.stores.store(i), lambda: self._client,
                                 cfg.numKeyGroups, cfg.processingGuarantees == "EFFECTIVELY_ONCE"))
        elif fn.runtime(self.default_runtime) == "process":
            handle = ProcessInstance(
                cfg, i, self.client_settings, fn.code_path, str(self._fn_dir(cfg) / "state.sqlite"), fn.num_instances,
                fn.shared_input, standby=standby)
        else:
            handle = ThreadInstance(cfg, i, self._client, fn.code_path,
                                    fn.state if keyed is None else keyed.stores.store(i), lambda: fn.num_instances.value,
                                    open_input=(lambda: self._subscribe(cfg, f"{cfg.fqfn}:{i}")) if keyed is None
                                    else (lambda: keyed.open_input(i)))
        fn.instances[i] = handle
        fn.restarts.setdefault(i, 0)
        log.info("started %s instance %d (%s)", cfg.fqfn, i, fn.runtime(self.default_runtime))

    def _drain(self, fn: HostedFunction, ids: list[int], then=None) -> None:
        """Stop receiving on all of them now; a background thread waits, at most drain_timeout_s, for their
        in-flight work, abandons what is still busy (runtime.InstanceHandle.abandon) and retires them."""
        handles = [fn.instances.pop(i) for i in ids if i in fn.instances]
        for h in handles:
            h.stop()
        fn.draining.extend(handles)
        t = threading.Thread(target=self._retire, args=(fn, handles, then), name=f"drain-{fn.config.fqfn}",
                             daemon=True)
        self._retirers = [r for r in self._retirers if r.is_alive()] + [t]
        t.start()

    def _retire(self, fn: HostedFunction, handles: list[InstanceHandle], then) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        for h in handles:
            drained = h.join(max(deadline - time.monotonic(), 0.0))
            if not drained:
                h.abandon()
                log.error("%s instance %d did not drain within %.0f s: abandoned (its consumer is closed, its "
                          "unacknowledged messages are redelivered)", fn.config.fqfn, h.instance_id,
                          self.drain_timeout_s)
            with self._lock:
                fn.abandoned += 0 if drained else 1
                fn.draining.remove(h)
                fn.retired = _sum_figures(fn.retired, h.figures())
            log.info("drained %s instance %d", fn.config.fqfn, h.instance_id)
        if then is not None:
            then()

    # ---- supervision: a crashed instance is restarted (counted in numRestarts) -----------------
    def _supervise(self) -> None:
        while not self._closing.wait(1.0):
            with self._lock:
                now = time.monotonic()
                for fn in self._functions.values():
                    self._record_history(fn, now)
                    for i, h in list(fn.instances.items()):
                        if h.alive() or now - fn.last_restart.get(i, 0.0) < RESTART_BACKOFF_S:
                            continue
                        fn.retired = _sum_figures(fn.retired, h.figures())
                        del fn.instances[i]
                        fn.restarts[i] = fn.restarts.get(i, 0) + 1
                        fn.last_restart[i] = now
                        log.warning("%s instance %d exited (%s); restarting", fn.config.fqfn, i, h.figures().error)
                        self._start_instance(fn, i)

    def _record_history(self, fn: HostedFunction, now: float) -> None:
        fn.history.append((now, self._counters(fn)))
        while fn.history and now - fn.history[0][0] > HISTORY_S:
            fn.history.popleft()

    # ---- figures ------------------------------------------------------------------------------------
    def instance_figures(self, fqfn: str) -> tuple[FunctionConfig, dict[int, InstanceFigures], dict[int, int]]:
        with self._lock:
            fn = self._get(fqfn)
            figs = {i: h.figures() for i, h in fn.instances.items()}
            if not self._connected.is_set():
                for i in range(fn.config.parallelism):
                    waiting = InstanceStats(i)
                    waiting.set_running(False, error=f"not started: waiting for {self._waiting_for}")
                    figs[i] = waiting.figures()
            return fn.config, figs, dict(fn.restarts)

    def _counters(self, fn: HostedFunction) -> FunctionCounters:
        total = fn.retired
        for h in [*fn.instances.values(), *fn.draining]:
            total = _sum_figures(total, h.figures())
        t = time.time()
        if total is None:
            return FunctionCounters(time=t, arrived=None)
        return FunctionCounters(
            time=t, arrived=None, received=total.received, processed=total.processed, outputs=total.outputs,
            busy_s=total.busy_s, busy_sq_s2=total.busy_sq_s2, interarrival_n=total.interarrival_n,
            interarrival_s=total.interarrival_s, interarrival_sq_s2=total.interarrival_sq_s2, wait_s=total.wait_s,
            newest_publish_s=total.newest_publish_ms / 1000.0 if total.newest_publish_ms else None)

    def health(self, fqfn: str) -> tuple[str, int]:
        """(why the function cannot run or "", how many of its drains were abandoned)."""
        with self._lock:
            fn = self._get(fqfn)
            return fn.failure, fn.abandoned

    def keyed_view(self, fqfn: str) -> dict | None:
        """A keyedState function's routing and migration state (status), else None."""
        with self._lock:
            fn = self._get(fqfn)
            keyed, stopped, parallelism = fn.keyed, sorted(fn.stopped), fn.config.parallelism
            waits = bool(stopped) and self._keyed_change_pending(fn)
        view = None if keyed is None else keyed.view()
        if view is not None and waits:
            view["waiting"] = (f"the change to {parallelism} instances moves key groups once the stopped instances "
                               f"{stopped} start")
        return view

    def counters(self, fqfn: str) -> FunctionCounters:
        """Cumulative since the function was created, drained instances included (for the controller)."""
        with self._lock:
            return self._counters(self._get(fqfn))

    def exception_totals(self, fqfn: str) -> tuple[int, int]:
        """(system, user) exceptions since creation, drained instances included."""
        with self._lock:
            fn = self._get(fqfn)
            figs = [h.figures() for h in [*fn.instances.values(), *fn.draining]] + ([fn.retired] if fn.retired else [])
            return sum(f.system_exceptions for f in figs), sum(f.user_exceptions for f in figs)

    def counters_1min_ago(self, fqfn: str) -> FunctionCounters | None:
        with self._lock:
            fn = self._get(fqfn)
            return fn.history[0][1] if fn.history else None

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            keyed = [fn.keyed for fn in self._functions.values() if fn.keyed is not None]
        for k in keyed:   # a live migration under way finishes first (its groups are half moved)
            if not k.idle(self.drain_timeout_s):
                log.error("a live migration did not finish within %.0f s of close", self.drain_timeout_s)
        with self._lock:
            for fn in self._functions.values():
                if fn.warm_pool is not None:
                    fn.warm_pool.close()
                self._drain(fn, sorted(fn.instances, reverse=True))
            retirers = list(self._retirers)
        for t in retirers:
            t.join(self.drain_timeout_s + 5)
        for k in keyed:
            stopping = k.stop_front() if isinstance(k, ClusterKeyed) else None
            if stopping is not None:
                stopping.join(self.drain_timeout_s)
            try:
                k.stores.close_clean()
            except Exception:   # the next start restores from the changelog instead
                log.exception("could not snapshot the key groups on close")
        self._supervisor.join(5)
        self.stages.close()
        if self._client is not None:
            self._client.close()


class _Counter:
    """Same interface as multiprocessing.Value for the thread runtime."""

    def __init__(self, value: int):
        self.value = value
