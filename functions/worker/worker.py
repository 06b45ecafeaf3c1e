"""The function worker: hosts functions and applies parallelism changes as a diff.

A thin facade over its parts, one concept each: the broker link (broker_link.py: the broker's profile,
this incarnation's client, fenced inputs), the functions on disk (function_files.py), the parallelism
diff and drains (parallelism.py), keyed wiring (keyed_wiring.py), warm standbys (warm_pools.py) and
figures (figures.py). Scaling changes only the instance ids that come or go (parallelism.py). Anything
else in an update (updates.py: code, userConfig, ...) restarts all instances, as Pulsar does, because the
running code or configuration changes.

User code never runs in the worker's control path: a create or update imports the code in a child
process first (functions/instance/validation.py) and only then puts it in place, atomically; drains (scale-in,
update, delete, stop) stop the instances at once and wait for their in-flight work in the background,
with a bound, so no request waits on user code and no function blocks another.
"""

from __future__ import annotations

import builtins
import logging
import shutil
import threading
import time
from pathlib import Path

from pulsar_autoscale.broker.lite.function_limits import check_function
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.functions.instance.instance_user import InstanceUser, InstanceUsers
from pulsar_autoscale.functions.instance.validation import VALIDATE_TIMEOUT_S, code_digest, serde_names, validate
from pulsar_autoscale.functions.keyed.cluster import ClusterKeyed
from pulsar_autoscale.functions.model.config import FunctionConfig, with_new_state
from pulsar_autoscale.functions.model.config_validation import DEFAULT_MAX_PARALLELISM
from pulsar_autoscale.functions.model.errors import Conflict, NotFound, StaleEpoch
from pulsar_autoscale.functions.runtimes.handles import RUNTIMES, ProcessInstance, start_process_server
from pulsar_autoscale.functions.spark.bursts import BurstRecord, BurstRunner
from pulsar_autoscale.functions.spark.stages import StageHost
from pulsar_autoscale.functions.state.store import StateStore
from pulsar_autoscale.functions.worker import figures
from pulsar_autoscale.functions.worker.broker_link import BrokerLink
from pulsar_autoscale.functions.worker.cluster_hosting import ClusterHosting
from pulsar_autoscale.functions.worker.figures import FunctionFigures
from pulsar_autoscale.functions.worker.function_files import FunctionFiles
from pulsar_autoscale.functions.worker.hosted import Counter, HostedFunction
from pulsar_autoscale.functions.worker.keyed_wiring import wire_keyed
from pulsar_autoscale.functions.worker.leftovers import Leftovers
from pulsar_autoscale.functions.worker.parallelism import Parallelism, keyed_stores
from pulsar_autoscale.functions.worker.updates import FunctionUpdates
from pulsar_autoscale.functions.worker.warm_pools import WarmPools, WarmPoolView
from pulsar_autoscale.pulsar_client import ClientSettings
from pulsar_autoscale.spark_bridge.session import SparkSettings

log = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 30.0  # a draining instance still busy after this is abandoned (runtime.InstanceHandle.abandon)
STALL_AFTER_S = 30.0  # in-flight work without progress this long: status says running false, "stalled"


class Worker(ClusterHosting, FunctionFigures, FunctionUpdates):
    def __init__(
        self,
        service_url: str | ClientSettings,
        data_dir: str,
        worker_id: str = "worker-0",
        default_runtime: str = "thread",
        max_parallelism: int = DEFAULT_MAX_PARALLELISM,
        broker_kind: str = "apache",
        hostname: str = "127.0.0.1",
        port: int = 0,
        warm_pool: int = 0,
        metrics_url: str | None = None,
        spark: SparkSettings | None = None,
        web_service_url: str | None = None,
        instance_users: InstanceUsers | None = None,
        tenant_thread_runtime: bool = False,
    ):
        """`broker_kind`: "auto" (read `metrics_url` to tell pulsar-lite from Apache Pulsar), "apache" or
        "pulsar-lite" (broker/profile.py). `instance_users`: whom each function's code runs as in process instances
        and validation (None: nobody for a root worker, else the worker's user; instance/instance_user.py);
        `tenant_thread_runtime`: tenant admins' functions may run on the thread runtime (api/rest.py)."""
        if default_runtime not in RUNTIMES:
            raise ConfigError(f"runtime {default_runtime!r} is unknown: use one of {', '.join(RUNTIMES)}")
        # the broker and its auth/TLS settings (pulsar_client.py); service_url stays for what takes a URL only
        self.client_settings = ClientSettings.of(service_url)
        self.service_url = self.client_settings.service_url
        self.data_dir = Path(data_dir)
        self.instance_users = instance_users or InstanceUsers(InstanceUser.resolve())
        self.tenant_thread_runtime = tenant_thread_runtime
        self.worker_id = worker_id
        self.default_runtime = default_runtime
        self.max_parallelism = max_parallelism
        self.hostname, self.port = hostname, port
        self.validate_timeout_s = VALIDATE_TIMEOUT_S
        self.drain_timeout_s = DRAIN_TIMEOUT_S
        self.stall_after_s = STALL_AFTER_S
        self._closing = threading.Event()
        self.link = BrokerLink(self.client_settings, broker_kind, metrics_url, self._closing)
        self.files = FunctionFiles(self.data_dir)
        # warm standbys per process-runtime function (functions/runtimes/warm_pool.py)
        self._pools = WarmPools(warm_pool, self.link, self.files, default_runtime, max_parallelism, self.instance_users)
        self._functions: dict[str, HostedFunction] = {}
        self._leftovers = Leftovers(self.files, self.link, web_service_url, self._hosts)
        self.bursts = BurstRunner(self.client_settings, self.link.profile, spark)  # spark: --spark-master
        self.stages = StageHost(self.data_dir, self.client_settings, worker_id, spark)
        self._max_epoch = 0
        # A cluster member sets it: a keyedState function's instances are spread over the cluster's workers,
        # fed through route topics by one front (functions/keyed/cluster.py, docs/dev/keyed-state-design.md).
        self.keyed_spread = False
        self.state_router = None  # a cluster: the owner of each non-keyed function's state (cluster/state_owner.py)
        self._lock = threading.RLock()
        self._parallelism = Parallelism(
            self._lock,
            self.link,
            self.files,
            self.client_settings,
            default_runtime,
            lambda: self.drain_timeout_s,
            self.instance_users,
        )
        self._retirers = self._parallelism.retirers  # background drains
        self._creating: set[str] = set()  # names reserved while their code is validated
        self._deleting: set[str] = set()  # names reserved until a delete has moved the files aside
        self._supervisor = threading.Thread(target=self._supervise, name="worker-supervisor", daemon=True)
        self._restore()
        threading.Thread(target=self._connect, name="worker-connect", daemon=True).start()
        self._supervisor.start()

    @property
    def broker_kind(self) -> str:
        """The --broker-kind asked, or what "auto" found once the broker answered."""
        return self.link.kind

    # ---- the broker: reached in the background, so the API serves (and status tells) at once -------
    def _connect(self) -> None:
        """Learn the broker's profile and open this incarnation's client (broker_link.py), then start the
        instances of the restored functions."""
        client = self.link.connect(self._probe_topic)
        self.bursts.broker = self.link.profile
        if client is None:
            return
        with self._lock:
            self.link.client = client
            self.link.connected.set()
            for fn in self._functions.values():
                if fn.failure:
                    continue
                if fn.shared_input is None and self.link.profile.shared_process_input:
                    self._fence_input(fn)
                try:
                    if fn.config.skipToLatest:
                        self.link.skip_to_latest(fn.config)
                    self._parallelism.scale(fn, fn.config.parallelism)
                except Exception:
                    log.exception("cannot start the instances of %s", fn.config.fqfn)
        log.info("connected to the broker (%s); %d function(s) running", self.link.kind, len(self._functions))

    def _probe_topic(self) -> str | None:
        # no lock: a request holding it for seconds must not look like a silent broker
        return next((fn.config.inputs[0] for fn in list(self._functions.values()) if fn.instances and fn.config.inputs), None)

    def broker_problem(self) -> str:
        """Why no instance can be running now ("" while the broker answers its probe)."""
        return self.link.problem()

    def _restore(self) -> None:
        """Every function saved in the data dir, hosted again (function_files.py)."""
        for path in self.files.saved():
            try:
                saved = self.files.load(path)
                cfg = FunctionConfig.accepted(saved["config"], self.max_parallelism)
                self._host(
                    cfg,
                    saved.get("code_path"),
                    *self.files.checked_restore(cfg, saved, self.validate_timeout_s, self.instance_users.of(cfg.fqfn)),
                )
                log.info("restored function %s with parallelism %d", cfg.fqfn, cfg.parallelism)
            except (PulsarAutoscaleError, ValueError, KeyError) as exc:
                log.error("cannot restore function from %s: %s", path, exc)

    # ---- admin operations ---------------------------------------------------------------------
    def create(self, cfg: FunctionConfig, code: bytes | None = None, filename: str | None = None) -> FunctionConfig:
        cfg = with_new_state(FunctionConfig.from_dict(cfg.to_dict(), self.max_parallelism))
        self.files.check_names(cfg)
        self.link.require()
        check_function(cfg, self.link.profile)
        with self._lock:
            if cfg.fqfn in self._functions or cfg.fqfn in self._creating or self.stages.has(cfg.fqfn):
                raise Conflict(f"Function {cfg.name} already exists")
            if cfg.fqfn in self._deleting:
                raise Conflict(f"Function {cfg.name} is being deleted: create it again once the delete has answered")
            self._creating.add(cfg.fqfn)
        try:
            # Nothing is left behind by a create that fails: the function's directory is new and ours.
            try:
                code_path = self.files.stage_code(cfg, code, filename)
                self._validate(cfg.className, code_path, cfg)
            except BaseException:
                shutil.rmtree(self.files.fn_dir(cfg), ignore_errors=True)
                raise
            with self._lock:
                fn = self._host(cfg, code_path, code_digest(code_path))
                self.files.save(fn)
            return cfg
        finally:
            with self._lock:
                self._creating.discard(cfg.fqfn)

    def _validate(self, class_name: str, code_path: str | None, cfg: FunctionConfig) -> None:
        """Import the code in a child process (functions/instance/validation.py): refuse now what could never run,
        its serde classes included."""
        validate(
            class_name,
            code_path,
            timeout_s=self.validate_timeout_s,
            serdes=serde_names(cfg),
            user=self.instance_users.of(cfg.fqfn),
        )

    def _host(self, cfg: FunctionConfig, code_path: str | None, digest: str | None = None, failure: str = "") -> HostedFunction:
        fn = self._hosted(cfg, code_path, digest, failure)
        if not failure and self.link.connected.is_set():  # else _connect starts them
            if cfg.skipToLatest:
                self.link.skip_to_latest(cfg)
            self._parallelism.scale(fn, cfg.parallelism)
        return fn

    def _hosted(self, cfg: FunctionConfig, code_path: str | None, digest: str | None = None, failure: str = "") -> HostedFunction:
        runtime = cfg.instanceRuntime or self.default_runtime
        if runtime == "process":  # the fork server boots meanwhile (restore, validation, connecting)
            start_process_server()
        num = ProcessInstance._ctx.Value("i", cfg.parallelism) if runtime == "process" else Counter(cfg.parallelism)
        state = StateStore(self.files.fn_dir(cfg) / "state.sqlite", cfg.numKeyGroups, keyed=cfg.keyedState)
        fn = HostedFunction(cfg, code_path, state, num_instances=num, code_digest=digest, failure=failure)
        if cfg.keyedState:
            fn.keyed = wire_keyed(
                fn,
                self.files,
                self.link,
                self.keyed_spread,
                lambda i: self._start_if_hosted(fn, i),
                lambda ids: self._drain_locked(fn, ids),
            )
        self._functions[cfg.fqfn] = fn
        self._fence_input(fn)
        return fn

    def _start_if_hosted(self, fn: HostedFunction, i: int) -> None:
        with self._lock:
            if self._functions.get(fn.config.fqfn) is fn and i not in fn.instances:
                self._parallelism.start(fn, i)

    def _drain_locked(self, fn: HostedFunction, ids: list[int]) -> None:
        with self._lock:
            self._parallelism.drain(fn, ids)

    def _fence_input(self, fn: HostedFunction) -> None:
        """Process instances' input as the broker's profile says (broker_link.share_input, B2), and warm
        standbys made for that input. Again once _connect has learnt the broker's profile."""
        self.link.share_input(fn)
        self._pools.renew(fn)

    def set_warm_pool(self, fqfn: str, size: int) -> WarmPoolView:
        """The controller sizes a function's warm pool (warm_pools.WarmPools.resize)."""
        self._pools.check_size(size)
        with self._lock:
            self._pools.resize(self._get(fqfn), size)
            return self.warm_pool_view(fqfn)

    def warm_pool_view(self, fqfn: str) -> WarmPoolView:
        with self._lock:
            return self._pools.view(self._get(fqfn))

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

    def burst(
        self,
        fqfn: str,
        messages: int,
        partitions: int,
        threads: int = 1,
        function: tuple[FunctionConfig, str | None] | None = None,
    ) -> tuple[BurstRecord, bool]:
        """Hand up to `messages` of the function's backlog to a Spark burst drain (functions/spark/bursts.py);
        False with the running drain when one is still running. `function`: (config, code path) from a
        cluster's metadata, so a worker that runs none of the function's instances drains it too."""
        if function is None:
            with self._lock:
                fn = self._get(fqfn)
                function = fn.config, fn.code_path
        cfg, code_path = function
        return self.bursts.start(cfg, code_path, str(self.files.fn_dir(cfg) / "state.sqlite"), messages, partitions, threads)

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
                log.error("%s: the live migration under way did not stop within %.0f s of the delete", fqfn, self.drain_timeout_s)
            with self._lock:
                then = self._leftovers.remove(fn)
                if fn.warm_pool is not None:
                    fn.warm_pool.close()
                self._parallelism.drain(fn, sorted(fn.instances, reverse=True), then=then)
        finally:
            with self._lock:
                self._deleting.discard(fqfn)

    def _hosts(self, fqfn: str) -> bool:
        with self._lock:
            return fqfn in self._functions

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
            if fn.keyed is not None:
                return fn.keyed.stores.for_key(key)  # not spread: keyed_wiring.wire_keyed's InstanceStateStores
            router = self.state_router
            if router is None:
                return fn.state
        return router.local_store(fqfn)  # outside the lock: the first call restores the state from the changelog

    def list(self, tenant: str, namespace: str) -> builtins.list[str]:
        with self._lock:
            return sorted(
                f.config.name for f in self._functions.values() if f.config.tenant == tenant and f.config.namespace == namespace
            )

    def functions(self) -> builtins.list[FunctionConfig]:
        with self._lock:
            return [f.config for f in self._functions.values()]

    def set_running(self, fqfn: str, running: bool, instance_id: int | None = None) -> None:
        """Pulsar's start/stop: a stopped instance stays stopped until started again."""
        self.link.require()
        with self._lock:
            fn = self._get(fqfn)
            ids = range(fn.config.parallelism) if instance_id is None else [self._check_instance(fn, instance_id)]
            if running:
                self._check_runnable(fn)
            for i in ids:
                if running:
                    fn.stopped.discard(i)
                    if i not in fn.instances:
                        self._parallelism.start(fn, i)
                else:
                    fn.stopped.add(i)
                    self._parallelism.drain(fn, [i])
            if running and Parallelism.keyed_change_pending(fn):
                self._parallelism.scale(fn, fn.config.parallelism)  # a change made while owners were stopped

    def restart(self, fqfn: str, instance_id: int | None = None) -> None:
        self.link.require()
        with self._lock:
            fn = self._get(fqfn)
            ids = list(range(fn.config.parallelism)) if instance_id is None else [self._check_instance(fn, instance_id)]
            self._check_runnable(fn)
            self._parallelism.drain(fn, [i for i in ids if i in fn.instances])
            for i in ids:
                fn.stopped.discard(i)
                fn.restarts[i] = fn.restarts.get(i, 0) + 1
                self._parallelism.start(fn, i)

    def _check_runnable(self, fn: HostedFunction) -> None:
        if fn.failure:
            raise ConfigError(f"Function {fn.config.name} cannot start: {fn.failure} (update it with code that loads)")

    def _check_instance(self, fn: HostedFunction, instance_id: int) -> int:
        if not 0 <= instance_id < fn.config.parallelism:
            raise NotFound(f"Function {fn.config.name} has no instance {instance_id} (parallelism {fn.config.parallelism})")
        return instance_id

    def _get(self, fqfn: str) -> HostedFunction:
        fn = self._functions.get(fqfn)
        if fn is None:
            raise NotFound(f"Function {fqfn} doesn't exist")
        return fn

    # ---- supervision: history for the "1min" window, crashed instances restarted ------------------
    def _supervise(self) -> None:
        while not self._closing.wait(1.0):
            with self._lock:
                now = time.monotonic()
                for fn in self._functions.values():
                    figures.record_history(fn, now)
                    self._parallelism.restart_exited(fn, now)

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            keyed = [fn.keyed for fn in self._functions.values() if fn.keyed is not None]
        for k in keyed:  # a live migration under way finishes first (its groups are half moved)
            if not k.idle(self.drain_timeout_s):
                log.error("a live migration did not finish within %.0f s of close", self.drain_timeout_s)
        with self._lock:
            for fn in self._functions.values():
                if fn.warm_pool is not None:
                    fn.warm_pool.close()
                self._parallelism.drain(fn, sorted(fn.instances, reverse=True))
            retirers = list(self._retirers)
        for t in retirers:
            t.join(self.drain_timeout_s + 5)
        for k in keyed:
            stopping = k.stop_front() if isinstance(k, ClusterKeyed) else None
            if stopping is not None:
                stopping.join(self.drain_timeout_s)
            try:
                keyed_stores(k).close_clean()
            except Exception:  # the next start restores from the changelog instead
                log.exception("could not snapshot the key groups on close")
        self._supervisor.join(5)
        self.stages.close()
        if self.link.client is not None:
            self.link.client.close()
