"""The controller: a MAPE loop run by the elected leader on an apscheduler interval.

Monitor (monitor.Monitor) -> Analyze + Plan (autoscaler.Autoscaler: the policy, then the Plan
step's bounds, cooldown, stabilization and max step) -> Execute (executor.Executor). Every
decision, applied or not, goes to the decision log with the leader epoch and its inputs.
Replicas that are not leader only try, every second, to take the lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field

from apscheduler.schedulers.background import BackgroundScheduler
from flask import Flask, Response, jsonify
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from werkzeug.serving import make_server

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.controller.autoscaler import Autoscaler
from pulsar_autoscale.controller.burst_plan import burst_size
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.decision_log import DecisionLog
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.controller.executor import Executor
from pulsar_autoscale.controller.fast import FastMonitor
from pulsar_autoscale.controller.leader import LeaderElector
from pulsar_autoscale.controller.monitor import Monitor
from pulsar_autoscale.netutil import free_port
from pulsar_autoscale.controller.planner import PlanConfig, Planner, apply_caps, restart_aware
from pulsar_autoscale.policies import load_policy

log = logging.getLogger(__name__)
ELECTION_INTERVAL_S = 1.0


class ControllerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.decisions = Counter("pulsar_autoscale_decisions", "scaling decisions applied (or recommended in dry run)",
                                 ["function", "direction"], registry=self.registry)
        self.errors = Counter("pulsar_autoscale_errors", "errors by stage", ["stage"], registry=self.registry)
        self.iteration = Histogram("pulsar_autoscale_iteration_seconds", "one MAPE iteration", registry=self.registry)
        self.target = Gauge("pulsar_autoscale_target_parallelism", "parallelism after the last decision",
                            ["function"], registry=self.registry)
        self.bursts = Counter("pulsar_autoscale_bursts", "burst drains asked of the worker (or recommended in dry run)",
                              ["function"], registry=self.registry)
        self.leader = Gauge("pulsar_autoscale_leader", "1 while this replica is leader", registry=self.registry)
        self.epoch = Gauge("pulsar_autoscale_epoch", "leader epoch held by this replica (0: none)",
                           registry=self.registry)


@dataclass
class Iteration:
    time: float
    epoch: int | None
    decisions: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


def build_planner(config: ControllerConfig) -> Planner:
    # stock Pulsar restarts every instance on each update: plan fewer, larger changes there
    plan = restart_aware(config.plan, config.period_s) if config.mode == "stock" else dict(config.plan)
    plan = config.fast_config().stabilization(plan, config.period_s)
    try:
        return Planner(plan_config(plan))
    except TypeError as exc:
        raise ConfigError(f"plan: {exc}") from exc


def plan_config(data: dict) -> PlanConfig:
    from pulsar_autoscale.configparse import from_mapping
    data = dict(data)
    if "bounds" in data:
        bounds = []
        for b in data["bounds"]:
            if not isinstance(b, dict) or "pattern" not in b:
                raise ConfigError(f"plan.bounds entries need pattern, min and max; got {b!r}")
            bounds.append((b["pattern"], int(b.get("min", 1)), int(b.get("max", 15))))
        data["bounds"] = tuple(bounds)
    return from_mapping(PlanConfig, data, "plan")


class Controller:
    def __init__(self, config: ControllerConfig, admin: FunctionsAdmin | None = None):
        self.config = config
        self.admin = admin or config.admin()
        self.policy = load_policy(config.policy, config.policy_params)
        self.fast = config.fast_config()
        self.autoscaler = Autoscaler(self.policy, build_planner(config), self.fast)
        self.fast_monitor = FastMonitor(self.admin, self.fast)
        self._fast_current: dict[str, int] = {}   # parallelism as the last period saw it, fast decisions applied
        self.monitor = Monitor(self.admin, config.metrics_url, config.namespaces, config.window_s)
        self.executor = Executor(self.admin, retries=config.execute_retries)
        self.burst = config.burst_config()
        self.elector = LeaderElector(config.service_url, config.lock_topic, config.identity)
        self.log = DecisionLog(config.decision_log)
        self.metrics = ControllerMetrics()
        self.history: deque[Iteration] = deque(maxlen=20)
        self.last_observation = None  # for live views: the graph and snapshot of the last period
        self._iter_lock = threading.Lock()
        self._scheduler: BackgroundScheduler | None = None
        self._http = None
        self.http_port = config.http_port

    @property
    def identity(self) -> str:
        return self.elector.identity

    # ---- one MAPE iteration --------------------------------------------------------------------
    def iterate(self, now: float | None = None) -> Iteration | None:
        """Run one period if this replica leads; None when it does not."""
        with self._iter_lock:
            if not self.elector.check():
                return None
            term = self.elector.term
            now = time.time() if now is None else now
            started = time.perf_counter()
            it = Iteration(time=now, epoch=term.epoch)
            with self.metrics.iteration.time():
                try:
                    obs = self.monitor.observe(now)
                except PulsarAutoscaleError as exc:
                    self.metrics.errors.labels("monitor").inc()
                    it.errors.append(f"monitor: {exc}")
                    log.error("monitor failed, nothing decided this period: %s", exc)
                    self.history.append(it)
                    return it
                it.errors.extend(obs.errors)
                self.last_observation = obs
                self._fast_current = dict(obs.current)
                step = self.autoscaler.step(obs.graph, obs.snapshot, obs.current, now)
                if step.error:
                    self.metrics.errors.labels("policy").inc()
                    it.errors.append(f"policy: {step.error}")
                    log.error("policy %s failed, nothing applied: %s", self.config.policy, step.error)
                decisions = apply_caps(step.decisions, obs.caps)
                for d in decisions:
                    it.decisions.append(self._execute(d, term.epoch, now))
                    if it.decisions[-1]["applied"]:
                        self._fast_current[d.function] = d.new
                if self.burst.enabled:
                    chosen = {**obs.current, **{d.function: d.new for d in decisions}}
                    it.decisions.extend(self._bursts(obs.snapshot, chosen, term.epoch, now))
            it.seconds = time.perf_counter() - started
            self.history.append(it)
            return it

    def fast_iterate(self, now: float | None = None) -> Iteration | None:
        """One fast check (controller.fast) if this replica leads and a period has run; None otherwise."""
        with self._iter_lock:
            if not self._fast_current or not self.elector.check():
                return None
            term = self.elector.term
            now = time.time() if now is None else now
            it = Iteration(time=now, epoch=term.epoch)
            snapshot, it.errors = self.fast_monitor.observe(self._fast_current, now)
            step = self.autoscaler.step(self.last_observation.graph, snapshot, self._fast_current, now)
            if step.error:
                self.metrics.errors.labels("policy").inc()
                it.errors.append(f"policy (fast): {step.error}")
            for d in apply_caps(step.decisions, self.last_observation.caps):
                if d.changed:
                    it.decisions.append(self._execute(d, term.epoch, now, kind="fast"))
                    if it.decisions[-1]["applied"]:
                        self._fast_current[d.function] = d.new
            if it.decisions:
                self.history.append(it)
            return it

    def _record(self, function: str, epoch: int, now: float, **fields) -> dict:
        """A decision-log record: who decided what, when, under which term; applied/error follow."""
        return {"time": now, "epoch": epoch, "controller": self.identity, "policy": self.config.policy,
                "mode": self.config.mode, "function": function, **fields, "dry_run": self.config.dry_run,
                "applied": False, "error": None}

    def _execute(self, decision, epoch: int, now: float, kind: str = "period") -> dict:
        record = self._record(decision.function, epoch, now, kind=kind, old=decision.old,
                              proposed=decision.proposed, new=decision.new, reason=decision.reason,
                              inputs=asdict(decision.inputs) if decision.inputs else None)
        if self.config.mode == "stock" and decision.changed:
            record["restart_cost_s"] = self.admin.restart_cost_s()   # what this update costs on stock Pulsar
        if decision.changed:
            if self.config.dry_run:
                log.info("[dry run] would scale %s %d -> %d: %s", decision.function, decision.old, decision.new,
                         decision.reason)
            else:
                result = self.executor.apply(decision.function, decision.new, epoch)
                record.update(applied=result.ok, error=result.error, execute_seconds=round(result.seconds, 4))
                if result.ok:
                    log.info("scaled %s %d -> %d (epoch %d): %s", decision.function, decision.old, decision.new,
                             epoch, decision.reason)
                else:
                    self.metrics.errors.labels("execute").inc()
                    log.error("could not scale %s to %d: %s", decision.function, decision.new, result.error)
            direction = "out" if decision.new > decision.old else "in"
            self.metrics.decisions.labels(decision.function, direction).inc()
        self.metrics.target.labels(decision.function).set(decision.new)
        if decision.changed:
            self.log.append(record)
        return record

    def _bursts(self, snapshot, parallelism: dict[str, int], epoch: int, now: float) -> list[dict]:
        """Ask the worker to drain, with Spark, what the instances cannot clear by the deadline even at
        their maximum parallelism (burst_plan); a drain still running for a function is left alone."""
        records = []
        for fn, k in parallelism.items():
            fs = snapshot.functions.get(fn)
            if fs is None:
                continue
            k_max = self.autoscaler.planner.config.limits(fn)[1]
            n = burst_size(fs, k, k_max, self.burst)
            if n == 0:
                continue
            record = self._record(fn, epoch, now, kind="burst", messages=n, partitions=self.burst.partitions,
                                  parallelism=k, max_parallelism=k_max, inputs=asdict(fs),
                                  reason=f"backlog {fs.backlog:.0f} + arrivals over {self.burst.deadline_s:g} s "
                                         f"exceed what {k_max} instances complete")
            if self.config.dry_run:
                log.info("[dry run] would burst-drain %d messages of %s", n, fn)
                self.metrics.bursts.labels(fn).inc()
            else:
                result = self.executor.burst(fn, n, self.burst.partitions, self.burst.threads_per_partition, epoch)
                record.update(applied=bool(result.started), error=result.error)
                if result.started:
                    self.metrics.bursts.labels(fn).inc()
                    log.info("burst drain of %d messages of %s asked (epoch %d)", n, fn, epoch)
                elif result.ok:   # the worker is still running the last one: not an error
                    record["reason"] += "; a drain is still running"
                else:
                    self.metrics.errors.labels("burst").inc()
                    log.error("could not start a burst drain of %s: %s", fn, result.error)
            self.log.append(record)
            records.append(record)
        return records

    # ---- leadership ------------------------------------------------------------------------------------
    def _elect(self) -> None:
        term = self.elector.term if self.elector.check() else self.elector.try_acquire()
        self.metrics.leader.set(1 if term else 0)
        self.metrics.epoch.set(term.epoch if term else 0)

    # ---- running ---------------------------------------------------------------------------------------
    def start(self) -> "Controller":
        self._start_http()
        self._scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
        self._scheduler.add_job(self._elect, "interval", seconds=ELECTION_INTERVAL_S, id="elect",
                                next_run_time=_now_dt())
        self._scheduler.add_job(self._safe_iterate, "interval", seconds=self.config.period_s, id="mape")
        if self.fast.enabled:
            self._scheduler.add_job(self._safe_fast, "interval", seconds=self.fast.period_s, id="fast")
        self._scheduler.start()
        return self

    def _safe_iterate(self) -> None:
        try:
            self.iterate()
        except Exception:  # the loop must go on; the error is counted and logged with its traceback
            self.metrics.errors.labels("iteration").inc()
            log.exception("MAPE iteration failed")

    def _safe_fast(self) -> None:
        try:
            self.fast_iterate()
        except Exception:
            self.metrics.errors.labels("fast").inc()
            log.exception("fast check failed")

    def stop(self) -> None:
        if self._scheduler:
            self._scheduler.shutdown(wait=True)
        if self._http:
            self._http.shutdown()
        self.elector.release()

    def status(self) -> dict:
        term = self.elector.term
        return {"controller": self.identity, "leader": term is not None, "epoch": term.epoch if term else None,
                "policy": self.config.policy, "mode": self.config.mode, "dry_run": self.config.dry_run,
                "period_s": self.config.period_s, "fast_period_s": self.fast.period_s if self.fast.enabled else None,
                "iterations": [asdict(i) for i in list(self.history)[-5:]]}

    def _start_http(self) -> None:
        app = Flask("pulsar_autoscale.controller.loop")

        @app.get("/metrics")
        def metrics():
            return Response(generate_latest(self.metrics.registry), mimetype="text/plain; version=0.0.4")

        @app.get("/status")
        def status():
            return jsonify(self.status())

        self.http_port = self.config.http_port or free_port(self.config.http_host)
        self._http = make_server(self.config.http_host, self.http_port, app, threaded=True)
        threading.Thread(target=self._http.serve_forever, name="controller-http", daemon=True).start()


def _now_dt():
    from datetime import datetime
    return datetime.now()
