"""The function worker: hosts functions and applies parallelism changes as a diff.

Scaling out starts only the missing instance ids; scaling in drains and stops only the
highest ids. Every other instance keeps running: its numRestarts and start time do not
change. Anything else in an update (code, userConfig, ...) restarts all instances, as
Pulsar does, because the running code or configuration changes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import pulsar

from pulsar_autoscale.broker import lite_quirks
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.snapshot import FunctionCounters

from .bursts import BurstRecord, BurstRunner
from .config import DEFAULT_MAX_PARALLELISM, FunctionConfig
from .instance import subscribe
from .loader import load_callable
from .runtime import RUNTIMES, InstanceHandle, ProcessInstance, ThreadInstance
from .stages import StageHost
from .state import StateStore
from .stats import InstanceFigures

log = logging.getLogger(__name__)
DRAIN_TIMEOUT_S = 60.0
HISTORY_S = 70.0
RESTART_BACKOFF_S = 5.0


class NotFound(PulsarAutoscaleError):
    """No such function (REST: 404)."""


class Conflict(PulsarAutoscaleError):
    """The function exists already (REST: 400, as Pulsar answers)."""


class StaleEpoch(PulsarAutoscaleError):
    """An action from a deposed controller leader (REST: 409)."""


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
        last_invocation_ms=max(a.last_invocation_ms, b.last_invocation_ms),
    )


class Worker:
    def __init__(self, service_url: str, data_dir: str, worker_id: str = "worker-0", default_runtime: str = "thread",
                 max_parallelism: int = DEFAULT_MAX_PARALLELISM, broker_kind: str = "apache",
                 hostname: str = "127.0.0.1", port: int = 0):
        if default_runtime not in RUNTIMES:
            raise ConfigError(f"runtime {default_runtime!r} is unknown: use one of {', '.join(RUNTIMES)}")
        self.service_url = service_url
        self.data_dir = Path(data_dir)
        self.worker_id = worker_id
        self.default_runtime = default_runtime
        self.max_parallelism = max_parallelism
        self.broker_kind = broker_kind
        self.hostname, self.port = hostname, port
        self._client = pulsar.Client(service_url, operation_timeout_seconds=30,
                                     logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        self._functions: dict[str, HostedFunction] = {}
        self.bursts = BurstRunner(service_url, broker_kind)
        self.stages = StageHost(self.data_dir, service_url, worker_id)
        self._max_epoch = 0
        self._lock = threading.RLock()
        self._closing = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="worker-supervisor", daemon=True)
        self._restore()
        self._supervisor.start()

    # ---- persistence: nothing accepted is lost when the worker restarts ------------------------
    def _fn_dir(self, cfg: FunctionConfig) -> Path:
        return self.data_dir / "functions" / cfg.tenant / cfg.namespace / cfg.name

    def _save(self, fn: HostedFunction) -> None:
        d = self._fn_dir(fn.config)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "config.json.tmp"
        tmp.write_text(json.dumps({"config": fn.config.to_dict(), "code_path": fn.code_path}, indent=1))
        os.replace(tmp, d / "config.json")

    def _restore(self) -> None:
        for path in sorted((self.data_dir / "functions").glob("*/*/*/config.json")):
            try:
                saved = json.loads(path.read_text())
                cfg = FunctionConfig.from_dict(saved["config"], self.max_parallelism)
                self._host(cfg, saved.get("code_path"))
                log.info("restored function %s with parallelism %d", cfg.fqfn, cfg.parallelism)
            except (PulsarAutoscaleError, ValueError, KeyError) as exc:
                log.error("cannot restore function from %s: %s", path, exc)

    # ---- admin operations ---------------------------------------------------------------------
    def create(self, cfg: FunctionConfig, code: bytes | None = None, filename: str | None = None) -> FunctionConfig:
        cfg = FunctionConfig.from_dict(cfg.to_dict(), self.max_parallelism)
        with self._lock:
            if cfg.fqfn in self._functions or self.stages.has(cfg.fqfn):
                raise Conflict(f"Function {cfg.name} already exists")
            code_path = self._store_code(cfg, code, filename)
            try:
                load_callable(cfg.className, code_path)  # refuse now what could never run
            except ConfigError:
                if code is not None:
                    shutil.rmtree(self._fn_dir(cfg), ignore_errors=True)
                raise
            fn = self._host(cfg, code_path)
            self._save(fn)
            return cfg

    def _store_code(self, cfg: FunctionConfig, code: bytes | None, filename: str | None) -> str | None:
        if code is None:
            if cfg.py and Path(cfg.py).is_file():
                return str(Path(cfg.py).resolve())
            return None
        name = Path(filename or cfg.py or f"{cfg.className.split('.')[0]}.py").name
        if not name.endswith(".py"):
            raise ConfigError(f"function package {name!r} is not a .py file (only Python files run here)")
        d = self._fn_dir(cfg)
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(code)
        return str(d / name)

    def _host(self, cfg: FunctionConfig, code_path: str | None) -> HostedFunction:
        fn = self._hosted(cfg, code_path)
        self._scale(fn, cfg.parallelism)
        return fn

    def _hosted(self, cfg: FunctionConfig, code_path: str | None) -> HostedFunction:
        runtime = cfg.instanceRuntime or self.default_runtime
        num = ProcessInstance._ctx.Value("i", cfg.parallelism) if runtime == "process" else _Counter(cfg.parallelism)
        fn = HostedFunction(cfg, code_path, StateStore(self._fn_dir(cfg) / "state.sqlite"), num_instances=num)
        if self.broker_kind == "pulsar-lite":
            fn.shared_input = lite_quirks.SharedInput(lambda: subscribe(self._client, fn.config, fn.config.fqfn))
        self._functions[cfg.fqfn] = fn
        return fn

    # ---- cluster mode (functions/cluster/): the cluster's assignment says which ids run here ------
    @property
    def pulsar_client(self) -> pulsar.Client:
        return self._client

    def host_instances(self, cfg: FunctionConfig, code_path: str | None, ids: set[int]) -> None:
        """Run exactly `ids` of the function here: start the missing ones, drain the others (highest
        first); the rest keep running. A change of anything but parallelism restarts them, as update() does."""
        with self._lock:
            fn = self._functions.get(cfg.fqfn)
            if fn is None:
                fn = self._hosted(cfg, code_path)
            elif code_path != fn.code_path or replace(cfg, parallelism=fn.config.parallelism) != fn.config:
                self._drain(fn, sorted(fn.instances, reverse=True))
                fn.restarts = {i: n + 1 for i, n in fn.restarts.items()}
            fn.config, fn.code_path = cfg, code_path
            fn.num_instances.value = cfg.parallelism
            self._drain(fn, sorted((i for i in fn.instances if i not in ids), reverse=True))
            for i in sorted(ids):
                if i not in fn.instances:
                    self._start_instance(fn, i)

    def hosted_ids(self) -> dict[str, set[int]]:
        with self._lock:
            return {fqfn: set(fn.instances) for fqfn, fn in self._functions.items()}

    def unhost(self, fqfn: str) -> None:
        """Cluster mode: the function was deleted."""
        with self._lock:
            fn = self._functions.pop(fqfn, None)
            if fn is not None:
                self._drain(fn, sorted(fn.instances, reverse=True))
                shutil.rmtree(self._fn_dir(fn.config), ignore_errors=True)

    def update(self, fqfn: str, changes: dict, code: bytes | None = None, filename: str | None = None) -> FunctionConfig:
        with self._lock:
            fn = self._get(fqfn)
            old = fn.config
            try:
                new = old.merged(changes, self.max_parallelism)
            except ConfigError as exc:
                if code is None or str(exc) != "Update contains no change":
                    raise
                new = old
            code_path = self._store_code(new, code, filename) if code is not None else fn.code_path
            if code is not None:
                load_callable(new.className, code_path)
            only_parallelism = code is None and replace(new, parallelism=old.parallelism) == old
            fn.config, fn.code_path = new, code_path
            if only_parallelism:
                self._scale(fn, new.parallelism)
            else:
                self._scale(fn, 0)
                fn.restarts = {i: n + 1 for i, n in fn.restarts.items()}
                self._scale(fn, new.parallelism)
            self._save(fn)
            return new

    def fence(self, epoch: int) -> None:
        """Refuse a controller action whose leader epoch is older than one already seen."""
        with self._lock:
            if epoch < self._max_epoch:
                raise StaleEpoch(f"stale leader epoch {epoch} < {self._max_epoch}: this controller was deposed")
            self._max_epoch = epoch

    def create_stage(self, data: dict) -> None:
        """A Spark stateful stage next to the functions (functions/stages.py)."""
        with self._lock:
            fqfn = f"{data.get('tenant', 'public')}/{data.get('namespace', 'default')}/{data.get('name')}"
            if fqfn in self._functions:
                raise Conflict(f"Function {data.get('name')} already exists")
            self.stages.create(data)

    def burst(self, fqfn: str, messages: int, partitions: int, threads: int = 1) -> tuple[BurstRecord, bool]:
        """Hand up to `messages` of the function's backlog to a Spark burst drain (functions/bursts.py);
        False with the running drain when one is still running."""
        with self._lock:
            fn = self._get(fqfn)
            cfg, code_path = fn.config, fn.code_path
        return self.bursts.start(cfg, code_path, str(self._fn_dir(cfg) / "state.sqlite"), messages, partitions,
                                 threads)

    def delete(self, fqfn: str) -> None:
        with self._lock:
            fn = self._get(fqfn)
            self._scale(fn, 0)
            del self._functions[fqfn]
            shutil.rmtree(self._fn_dir(fn.config), ignore_errors=True)

    def get(self, fqfn: str) -> FunctionConfig:
        with self._lock:
            return self._get(fqfn).config

    def list(self, tenant: str, namespace: str) -> list[str]:
        with self._lock:
            return sorted(f.config.name for f in self._functions.values()
                          if f.config.tenant == tenant and f.config.namespace == namespace)

    def functions(self) -> list[FunctionConfig]:
        with self._lock:
            return [f.config for f in self._functions.values()]

    def set_running(self, fqfn: str, running: bool, instance_id: int | None = None) -> None:
        """Pulsar's start/stop: a stopped instance stays stopped until started again."""
        with self._lock:
            fn = self._get(fqfn)
            ids = range(fn.config.parallelism) if instance_id is None else [self._check_instance(fn, instance_id)]
            for i in ids:
                if running:
                    fn.stopped.discard(i)
                    if i not in fn.instances:
                        self._start_instance(fn, i)
                else:
                    fn.stopped.add(i)
                    self._drain(fn, [i])

    def restart(self, fqfn: str, instance_id: int | None = None) -> None:
        with self._lock:
            fn = self._get(fqfn)
            ids = list(range(fn.config.parallelism)) if instance_id is None else [self._check_instance(fn, instance_id)]
            self._drain(fn, [i for i in ids if i in fn.instances])
            for i in ids:
                fn.stopped.discard(i)
                fn.restarts[i] = fn.restarts.get(i, 0) + 1
                self._start_instance(fn, i)

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
        surplus = sorted((i for i in fn.instances if i >= target), reverse=True)
        self._drain(fn, surplus)
        for i in range(target):
            if i not in fn.instances and i not in fn.stopped:
                self._start_instance(fn, i)
        fn.stopped = {i for i in fn.stopped if i < target}

    def _start_instance(self, fn: HostedFunction, i: int) -> None:
        cfg = fn.config
        if fn.runtime(self.default_runtime) == "process":
            handle: InstanceHandle = ProcessInstance(
                cfg, i, self.service_url, fn.code_path, str(self._fn_dir(cfg) / "state.sqlite"), fn.num_instances,
                fn.shared_input)
        else:
            handle = ThreadInstance(cfg, i, self._client, fn.code_path, fn.state, lambda: fn.num_instances.value)
        fn.instances[i] = handle
        fn.restarts.setdefault(i, 0)
        log.info("started %s instance %d (%s)", cfg.fqfn, i, fn.runtime(self.default_runtime))

    def _drain(self, fn: HostedFunction, ids: list[int]) -> None:
        """Stop receiving on all of them at once, then wait for each to finish in-flight work and close."""
        handles = [fn.instances.pop(i) for i in ids if i in fn.instances]
        for h in handles:
            h.stop()
        for h in handles:
            if not h.join(DRAIN_TIMEOUT_S):
                log.error("%s instance %d did not drain within %.0fs", fn.config.fqfn, h.instance_id, DRAIN_TIMEOUT_S)
            fn.retired = _sum_figures(fn.retired, h.figures())
            log.info("drained %s instance %d", fn.config.fqfn, h.instance_id)

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
            return fn.config, figs, dict(fn.restarts)

    def _counters(self, fn: HostedFunction) -> FunctionCounters:
        total = fn.retired
        for h in fn.instances.values():
            total = _sum_figures(total, h.figures())
        t = time.time()
        if total is None:
            return FunctionCounters(time=t, arrived=None)
        return FunctionCounters(
            time=t, arrived=None, received=total.received, processed=total.processed, outputs=total.outputs,
            busy_s=total.busy_s, busy_sq_s2=total.busy_sq_s2, interarrival_n=total.interarrival_n,
            interarrival_s=total.interarrival_s, interarrival_sq_s2=total.interarrival_sq_s2)

    def counters(self, fqfn: str) -> FunctionCounters:
        """Cumulative since the function was created, drained instances included (for the controller)."""
        with self._lock:
            return self._counters(self._get(fqfn))

    def exception_totals(self, fqfn: str) -> tuple[int, int]:
        """(system, user) exceptions since creation, drained instances included."""
        with self._lock:
            fn = self._get(fqfn)
            figs = [h.figures() for h in fn.instances.values()] + ([fn.retired] if fn.retired else [])
            return sum(f.system_exceptions for f in figs), sum(f.user_exceptions for f in figs)

    def counters_1min_ago(self, fqfn: str) -> FunctionCounters | None:
        with self._lock:
            fn = self._get(fqfn)
            return fn.history[0][1] if fn.history else None

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            for fn in self._functions.values():
                self._drain(fn, sorted(fn.instances, reverse=True))
        self._supervisor.join(5)
        self.stages.close()
        self._client.close()


class _Counter:
    """Same interface as multiprocessing.Value for the thread runtime."""

    def __init__(self, value: int):
        self.value = value
