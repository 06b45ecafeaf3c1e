"""The controller: a MAPE loop run by the elected leader on an apscheduler interval.

Monitor (monitor.Monitor) -> Analyze + Plan (autoscaler.Autoscaler: the policy, then the Plan
step's bounds, cooldown, stabilization and max step) -> Execute (executor.Executor). Every
decision, applied or not, goes to the decision log with the leader epoch and its inputs.
Replicas that are not leader only try, every second, to take the lock. The HTTP API
(service.HttpService over rest.py) sees the loop only as an api.ControllerApi; what an operator asks
of it (controls, why, reload) is operator_controls.OperatorControls, a part of the Controller.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import cast

from apscheduler.schedulers.background import BackgroundScheduler

from pulsar_autoscale.admin.api import FunctionsApi, TopicFigures
from pulsar_autoscale.controller.autoscaler import Autoscaler
from pulsar_autoscale.controller.burst_plan import burst_size
from pulsar_autoscale.controller.capacity import cap_to_capacity, cluster_capacity
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.controls import ControlStore, Effective
from pulsar_autoscale.controller.decision_log import DecisionLog
from pulsar_autoscale.controller.executor import Executor
from pulsar_autoscale.controller.fast import FastMonitor
from pulsar_autoscale.controller.function_controls import FunctionControlsView
from pulsar_autoscale.controller.metrics import ControllerMetrics
from pulsar_autoscale.controller.monitor import Monitor, Observation
from pulsar_autoscale.controller.operator_controls import OperatorControls
from pulsar_autoscale.controller.planner import Planner, apply_caps
from pulsar_autoscale.controller.planning_config import build_planner
from pulsar_autoscale.controller.policy_registry import PolicyRegistry
from pulsar_autoscale.controller.service import HttpService
from pulsar_autoscale.controller.wake import WakeWatcher
from pulsar_autoscale.controller.warm_sizing import WarmPoolSizer
from pulsar_autoscale.controller.watchdog import IterationWatchdog
from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.leader import LeaderElector, Term
from pulsar_autoscale.policies import Policy, load_policy
from pulsar_autoscale.security.redact import redact_url
from pulsar_autoscale.security.serving import ServerSecurity

log = logging.getLogger(__name__)
ELECTION_INTERVAL_S = 1.0
STUCK_AFTER_PERIODS, STUCK_AFTER_MIN_S = 3, 10.0  # an iteration longer than this is reported with its stack


@dataclass
class Iteration:
    time: float
    epoch: int | None
    decisions: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Controller(OperatorControls):
    """The loop, given its collaborators (as flink-autoscaler's JobAutoScalerImpl is): each one not given is
    built from the config, so Controller(config) is the whole controller, and the simulator or a test
    swaps the parts it fakes (monitor, policy, planner, executor, decision log, controls store, elector,
    HTTP service) and reuses the rest."""

    def __init__(
        self,
        config: ControllerConfig,
        admin: FunctionsApi | None = None,
        config_path: str | None = None,
        overrides: dict | None = None,
        security: ServerSecurity | None = None,
        *,
        http: HttpService | None = None,
        monitor: Monitor | None = None,
        policy: Policy | None = None,
        policies: PolicyRegistry | None = None,
        planner: Planner | None = None,
        executor: Executor | None = None,
        decision_log: DecisionLog | None = None,
        controls: ControlStore | None = None,
        elector: LeaderElector | None = None,
    ):
        self.config = config
        self.config_path = config_path  # re-read on reload (SIGHUP, POST /autoscaler/reload)
        self.overrides = dict(overrides or {})  # command-line options, kept over a reload
        self.http = http or HttpService(config.http_host, config.http_port, security)  # refuses a bad bind now
        self.admin = admin or config.admin()
        self.policy = policy or load_policy(config.policy, config.policy_params)
        self.fast = config.fast_config()
        self.autoscaler = Autoscaler(self.policy, planner or build_planner(config), self.fast)
        self.fast_monitor = FastMonitor(self.admin, self.fast)
        self._fast_current: dict[str, int] = {}  # parallelism as the last period saw it, fast decisions applied
        self._fast_controls: tuple[dict, dict] = ({}, {})  # the last period's per-function rules and policies
        self.monitor = monitor or Monitor(self.admin, config.metrics_url, config.namespaces, config.window_s)
        self.executor = executor or Executor(self.admin, retries=config.execute_retries)
        self.burst = config.burst_config()
        self.warm_pools = WarmPoolSizer(config.warm_pool_config())
        self.elector = elector or LeaderElector(config.client_settings(), config.lock_topic, config.identity)
        self.log = decision_log or DecisionLog(config.decision_log, config.decision_log_max_bytes, config.decision_log_backups)
        self.controls = controls or ControlStore(config.client_settings(), config.lock_topic + "-controls", self.identity)
        self.watcher = WakeWatcher(config.client_settings(), self._wake)
        self.functions = FunctionControlsView(self.controls, policies or PolicyRegistry(config.policy, config.policy_dir))
        self.metrics = ControllerMetrics()
        self.history: deque[Iteration] = deque(maxlen=20)
        self.last_observation: Observation | None = None  # for live views: the graph and snapshot of the last period
        self._iter_lock = threading.Lock()
        self.watchdog = IterationWatchdog(
            lambda: max(STUCK_AFTER_MIN_S, STUCK_AFTER_PERIODS * self.config.period_s),
            on_stuck=lambda what: self.metrics.errors.labels("stuck").inc(),
        )
        self._scheduler: BackgroundScheduler | None = None

    @property
    def http_port(self) -> int:
        """The port the HTTP API listens on (chosen on start when the config says 0)."""
        return self.http.port

    @property
    def effective(self) -> dict[str, Effective]:
        return self.functions.effective

    @property
    def identity(self) -> str:
        return self.elector.identity

    # ---- one MAPE iteration --------------------------------------------------------------------
    def iterate(self, now: float | None = None) -> Iteration | None:
        """Run one period if this replica leads; None when it does not."""
        with self._iter_lock:
            if not self.elector.check():
                self.watcher.watch({})
                return None
            term = cast(Term, self.elector.term)  # check() passed: this replica holds a term
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
                rules, overrides, failed = self.functions.follow(
                    obs, self.config, self.autoscaler.planner.config, self.metrics, it.errors
                )
                current = {fn: k for fn, k in obs.current.items() if fn not in failed}
                self._fast_current, self._fast_controls = dict(current), (rules, overrides)
                step = self.autoscaler.step(obs.graph, obs.snapshot, current, now, rules, overrides)
                if step.error:
                    self.metrics.errors.labels("policy").inc()
                    it.errors.append(f"policy: {step.error}")
                    log.error("policy failed, nothing applied to %d function(s): %s", len(step.failed), step.error)
                for fn, error in {**failed, **step.failed}.items():
                    self.log.append(
                        self._record(
                            fn,
                            term.epoch,
                            now,
                            old=obs.current[fn],
                            new=obs.current[fn],
                            reason="policy failed: nothing decided",
                            error=error,
                        )
                    )
                decisions = apply_caps(step.decisions, obs.caps)
                if self.config.mode == "worker":  # our worker cluster's room; stock Pulsar reports none
                    decisions = cap_to_capacity(decisions, cluster_capacity(self.admin))
                for d in decisions:
                    it.decisions.append(self._execute(d, term.epoch, now))
                    if it.decisions[-1]["applied"]:
                        self._fast_current[d.function] = d.new
                self.metrics.describe_inputs(
                    {
                        fn: (obs.graph.nodes[fn].inputs, obs.subscriptions.get(fn, fn))
                        for fn in obs.current
                        if fn in obs.graph.nodes
                    }
                )
                self._watch(obs, decisions)
                if self.burst.enabled:
                    chosen = {**obs.current, **{d.function: d.new for d in decisions}}
                    it.decisions.extend(self._bursts(obs.snapshot, chosen, term.epoch, now))
                if self.warm_pools.config.enabled:  # from the parallelism now in force (applied decisions)
                    it.errors.extend(self._size_warm_pools(self._fast_current, term.epoch, now))
            it.seconds = time.perf_counter() - started
            self.history.append(it)
            return it

    def fast_iterate(self, now: float | None = None) -> Iteration | None:
        """One fast check (controller.fast) if this replica leads and a period has run; None otherwise."""
        with self._iter_lock:
            if not self._fast_current or not self.elector.check():
                return None
            term = cast(Term, self.elector.term)  # check() passed: this replica holds a term
            now = time.time() if now is None else now
            it = Iteration(time=now, epoch=term.epoch)
            obs = cast(Observation, self.last_observation)  # set by the period that filled _fast_current
            inputs = {
                fn: (obs.graph.nodes[fn].inputs, obs.subscriptions.get(fn, fn))
                for fn in self._fast_current
                if fn in obs.graph.nodes
            }
            snapshot, it.errors = self.fast_monitor.observe(self._fast_current, now, inputs)
            step = self.autoscaler.step(obs.graph, snapshot, self._fast_current, now, *self._fast_controls)
            if step.error:
                self.metrics.errors.labels("policy").inc()
                it.errors.append(f"policy (fast): {step.error}")
            for d in apply_caps(step.decisions, obs.caps):
                if d.changed:
                    it.decisions.append(self._execute(d, term.epoch, now, kind="fast"))
                    if it.decisions[-1]["applied"]:
                        self._fast_current[d.function] = d.new
            if it.decisions:
                self.history.append(it)
            return it

    def _dry_run(self, fn: str) -> bool:
        return self.functions.dry_run(fn, self.config)

    def _record(self, function: str, epoch: int, now: float, **fields) -> dict:
        """A decision-log record: who decided what, when, under which term; applied/error follow."""
        e = self.effective.get(function)
        return {
            "time": now,
            "epoch": epoch,
            "controller": self.identity,
            "policy": e.policy if e else self.config.policy,
            "mode": self.config.mode,
            "function": function,
            "dry_run": self._dry_run(function),
            "paused": bool(e and e.paused),
            "applied": False,
            "error": None,
            **fields,
        }

    @staticmethod
    def _applied(record: dict, result) -> None:
        """The execution's outcome in the record. A scale already in force (the wake watcher and the
        period both woke a function) changed nothing, and its record says so: one wake, not two."""
        record.update(applied=result.ok, error=result.error, execute_seconds=round(result.seconds, 4))
        if result.in_force:
            record.update(changed=False, reason=f"{record['reason']} (already in force)")

    def _execute(self, decision, epoch: int, now: float, kind: str = "period") -> dict:
        record = self._record(
            decision.function,
            epoch,
            now,
            kind=kind,
            old=decision.old,
            proposed=decision.proposed,
            new=decision.new,
            reason=decision.reason,
            changed=decision.changed,
            inputs=asdict(decision.inputs) if decision.inputs else None,
        )
        if decision.changed and isinstance(self.admin, TopicFigures):
            record["restart_cost_s"] = self.admin.restart_cost_s()  # what this update costs on stock Pulsar
        if decision.changed:
            if record["dry_run"]:
                log.info("[dry run] would scale %s %d -> %d: %s", decision.function, decision.old, decision.new, decision.reason)
            else:
                result = self.executor.apply(decision.function, decision.new, epoch)
                self._applied(record, result)
                if result.in_force:
                    log.info("%s was at %d already", decision.function, decision.new)
                elif result.ok:
                    log.info(
                        "scaled %s %d -> %d (epoch %d): %s", decision.function, decision.old, decision.new, epoch, decision.reason
                    )
                    direction = "out" if decision.new > decision.old else "in"
                    self.metrics.decisions.labels(decision.function, direction).inc()
                else:
                    self.metrics.errors.labels("execute").inc()
                    self.metrics.failures.labels(decision.function).inc()
                    log.error("could not scale %s to %d: %s", decision.function, decision.new, result.error)
        self.metrics.target.labels(decision.function).set(decision.new)
        self.log.append(record)  # every evaluation, changed or not: `autoscaler why` explains them
        return record

    # ---- scale to zero: wake-up -------------------------------------------------------------------------
    def _size_warm_pools(self, parallelism: dict[str, int], epoch: int, now: float) -> list[str]:
        """Ask each function's worker for the warm pool its likely next scale-out needs (warm_sizing)."""
        for fn, k in parallelism.items():
            self.warm_pools.observe(fn, k, now)
        self.warm_pools.forget(set(parallelism))
        errors = []
        for fn, size in self.warm_pools.changes(now).items():
            try:
                tenant, namespace, name = fn.split("/")
                self.admin.set_warm_pool(tenant, namespace, name, size, epoch=epoch)
                self.warm_pools.sent(fn, size)
                log.info("warm pool of %s: %d standby(s)", fn, size)
            except PulsarAutoscaleError as exc:
                self.warm_pools.sent(fn, None)
                errors.append(f"warm pool {fn}: {exc}")
        return errors

    def _watch(self, obs, decisions) -> None:
        """Watch the inputs of the functions that are at parallelism 0 now (and not paused)."""
        now_at = dict(obs.current)
        for d in decisions:
            if d.changed and not self._dry_run(d.function):
                now_at[d.function] = d.new
        nodes = obs.graph.nodes
        self.watcher.watch(
            {fn: tuple(nodes[fn].inputs) for fn, k in now_at.items() if k == 0 and fn in nodes and not self.effective[fn].paused}
        )

    def _wake(self, fn: str) -> None:
        """A message arrived on a sleeping function's input: scale it to its min (at least 1) now."""
        term, e = self.elector.term, self.effective.get(fn)
        if term is None or e is None or e.paused:
            return
        new, now = max(e.min, 1), time.time()
        record = self._record(
            fn,
            term.epoch,
            now,
            old=0,
            proposed=new,
            new=new,
            changed=True,
            kind="wake",
            reason="wake: a message arrived on its input",
        )
        if not record["dry_run"]:
            result = self.executor.apply(fn, new, term.epoch)
            self._applied(record, result)
            if result.ok:
                self._fast_current[fn] = new
            if result.in_force:
                log.info("%s was awake already (at %d)", fn, new)
            elif result.ok:
                self.metrics.decisions.labels(fn, "out").inc()
                log.info("woke %s: 0 -> %d in %.3fs (epoch %d)", fn, new, result.seconds, term.epoch)
            else:
                self.metrics.failures.labels(fn).inc()
                log.error("could not wake %s: %s", fn, result.error)
        self.log.append(record)

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
            record = self._record(
                fn,
                epoch,
                now,
                kind="burst",
                messages=n,
                partitions=self.burst.partitions,
                parallelism=k,
                max_parallelism=k_max,
                inputs=asdict(fs),
                reason=f"backlog {fs.backlog:.0f} + arrivals over {self.burst.deadline_s:g} s "
                f"exceed what {k_max} instances complete",
            )
            if self.config.dry_run:
                log.info("[dry run] would burst-drain %d messages of %s", n, fn)
                self.metrics.bursts.labels(fn).inc()
            else:
                result = self.executor.burst(fn, n, self.burst.partitions, self.burst.threads_per_partition, epoch)
                record.update(applied=bool(result.started), error=result.error)
                if result.started:
                    self.metrics.bursts.labels(fn).inc()
                    log.info("burst drain of %d messages of %s asked (epoch %d)", n, fn, epoch)
                elif result.ok:  # the worker is still running the last one: not an error
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
        self.elector.url = self.http.start(self)  # advertised with each term
        self._scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
        self._scheduler.add_job(self._elect, "interval", seconds=ELECTION_INTERVAL_S, id="elect", next_run_time=datetime.now())
        self._scheduler.add_job(self._safe_iterate, "interval", seconds=self.config.period_s, id="mape")
        if self.fast.enabled:
            self._scheduler.add_job(self._safe_fast, "interval", seconds=self.fast.period_s, id="fast")
        self._scheduler.start()
        return self

    def _safe_iterate(self) -> None:
        try:
            with self.watchdog.watch("MAPE iteration"):
                self.iterate()
        except Exception:  # the loop must go on; the error is counted and logged with its traceback
            self.metrics.errors.labels("iteration").inc()
            log.exception("MAPE iteration failed")

    def _safe_fast(self) -> None:
        try:
            with self.watchdog.watch("fast check"):
                self.fast_iterate()
        except Exception:
            self.metrics.errors.labels("fast").inc()
            log.exception("fast check failed")

    def stop(self) -> None:
        if self._scheduler:
            self._scheduler.shutdown(wait=True)
        self.http.stop()
        self.watcher.close()
        self.controls.close()
        self.elector.release()

    def status(self) -> dict:
        term = self.elector.term
        return {
            "controller": self.identity,
            "leader": term is not None,
            "epoch": term.epoch if term else None,
            "policy": self.config.policy,
            "mode": self.config.mode,
            "dry_run": self.config.dry_run,
            "period_s": self.config.period_s,
            "fast_period_s": self.fast.period_s if self.fast.enabled else None,
            "paused": sorted(fn for fn, e in self.effective.items() if e.paused),
            "asleep": sorted(self.watcher.watching),
            "iterations": [_shown(asdict(i)) for i in list(self.history)[-5:]],
        }


def _shown(iteration: dict) -> dict:
    """An iteration for /status: error texts may quote URLs, whose user-info is a credential."""
    return {**iteration, "errors": [redact_url(e) for e in iteration["errors"]]}
