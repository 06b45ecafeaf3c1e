"""The controller: a MAPE loop run by the elected leader on an apscheduler interval.

Monitor (monitor.Monitor) -> Analyze + Plan (autoscaler.Autoscaler: the policy, then the Plan
step's bounds, cooldown, stabilization and max step) -> Execute (executor.Executor). Every
decision, applied or not, goes to the decision log with the leader epoch and its inputs.
Replicas that are not leader only try, every second, to take the lock.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pulsar
import requests
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.admin.http_auth import cluster_session, host_port
from pulsar_autoscale.controller.autoscaler import DEFAULT as DEFAULT_POLICY
from pulsar_autoscale.controller.autoscaler import Autoscaler
from pulsar_autoscale.controller.burst_plan import burst_size
from pulsar_autoscale.controller.capacity import cap_to_capacity, cluster_capacity
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.controls import ControlStore, Effective, FunctionControls, effective
from pulsar_autoscale.controller.decision_log import DecisionLog
from pulsar_autoscale.controller.executor import Executor
from pulsar_autoscale.controller.fast import FastMonitor
from pulsar_autoscale.controller.monitor import Monitor
from pulsar_autoscale.controller.planner import FunctionPlan, PlanConfig, Planner, apply_caps, restart_aware
from pulsar_autoscale.controller.rest import build_app
from pulsar_autoscale.controller.wake import WakeWatcher
from pulsar_autoscale.controller.warm_sizing import WarmPoolSizer
from pulsar_autoscale.controller.watchdog import IterationWatchdog
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.leader import LeaderElector
from pulsar_autoscale.netutil import free_port
from pulsar_autoscale.policies import Policy, load_policy
from pulsar_autoscale.security.redact import redact_url
from pulsar_autoscale.security.serving import ServerSecurity

log = logging.getLogger(__name__)
ELECTION_INTERVAL_S = 1.0
STUCK_AFTER_PERIODS, STUCK_AFTER_MIN_S = 3, 10.0   # an iteration longer than this is reported with its stack


class ControllerMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self.decisions = Counter("pulsar_autoscale_decisions", "parallelism changes applied (not recommendations)",
                                 ["function", "direction"], registry=self.registry)
        self.failures = Counter("pulsar_autoscale_decision_failures", "parallelism changes the worker did not apply",
                                ["function"], registry=self.registry)
        self.errors = Counter("pulsar_autoscale_errors", "errors by stage", ["stage"], registry=self.registry)
        self.iteration = Histogram("pulsar_autoscale_iteration_seconds", "one MAPE iteration", registry=self.registry)
        self.target = Gauge("pulsar_autoscale_target_parallelism", "parallelism after the last decision",
                            ["function"], registry=self.registry)
        self.bursts = Counter("pulsar_autoscale_bursts", "burst drains asked of the worker (or recommended in dry run)",
                              ["function"], registry=self.registry)
        self.leader = Gauge("pulsar_autoscale_leader", "1 while this replica is leader", registry=self.registry)
        self.epoch = Gauge("pulsar_autoscale_epoch", "leader epoch held by this replica (0: none)",
                           registry=self.registry)
        self.paused = Gauge("pulsar_autoscale_paused", "1 while an operator has paused the function",
                            ["function"], registry=self.registry)
        self.max_parallelism = Gauge("pulsar_autoscale_max_parallelism", "the function's upper bound (its controls)",
                                     ["function"], registry=self.registry)
        self.backlog = Gauge("pulsar_autoscale_backlog", "messages waiting, as the last period measured them",
                             ["function"], registry=self.registry)
        # 1 per (function, input): dashboards join the broker's per-topic series to functions with it.
        # The topic appears twice, as Apache Pulsar labels it (persistent://...) and as pulsar-lite does
        # (the local name, with the namespace label), so one join works on both brokers.
        self.function_input = Gauge("pulsar_autoscale_function_input", "the function consumes this topic",
                                    ["function", "namespace", "topic", "subscription"], registry=self.registry)
        self._inputs: dict[str, set[tuple]] = {}

    def describe_inputs(self, inputs: dict[str, tuple[tuple[str, ...], str]]) -> None:
        """function -> (its input topics, its subscription); a function not listed any more loses its
        series, here and in every per-function metric, so dashboards stop showing it."""
        for fn in set(self._inputs) - set(inputs):
            for metric, labels in ((self.target, (fn,)), (self.paused, (fn,)), (self.failures, (fn,)),
                                   (self.max_parallelism, (fn,)), (self.backlog, (fn,)),
                                   (self.bursts, (fn,)), (self.decisions, (fn, "out")), (self.decisions, (fn, "in")),
                                   *((self.function_input, labels) for labels in self._inputs[fn])):
                try:
                    metric.remove(*labels)
                except KeyError:
                    pass
            del self._inputs[fn]
        for fn, (topics, subscription) in inputs.items():
            labels = set()
            for topic in topics:
                namespace = "/".join(topic.split("://", 1)[-1].split("/")[:2])
                labels |= {(fn, namespace, topic, subscription), (fn, namespace, topic.rsplit("/", 1)[-1], subscription)}
            for stale in self._inputs.get(fn, set()) - labels:
                self.function_input.remove(*stale)
            for label in labels:
                self.function_input.labels(*label).set(1)
            self._inputs[fn] = labels


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
    plan = config.fast_config().stabilization(plan, config.period_s, config.window_s)
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
    def __init__(self, config: ControllerConfig, admin: FunctionsAdmin | None = None,
                 config_path: str | None = None, overrides: dict | None = None,
                 security: ServerSecurity | None = None):
        self.config = config
        self.config_path = config_path          # re-read on reload (SIGHUP, POST /autoscaler/reload)
        self.overrides = dict(overrides or {})  # command-line options, kept over a reload
        self.security = security or ServerSecurity()
        self.security.check_bind(config.http_host)  # refuse before anything starts
        self.admin = admin or config.admin()
        self.policy = load_policy(config.policy, config.policy_params)
        self.fast = config.fast_config()
        self.autoscaler = Autoscaler(self.policy, build_planner(config), self.fast)
        self.fast_monitor = FastMonitor(self.admin, self.fast)
        self._fast_current: dict[str, int] = {}   # parallelism as the last period saw it, fast decisions applied
        self._fast_controls: tuple[dict, dict] = ({}, {})   # the last period's per-function rules and policies
        self.monitor = Monitor(self.admin, config.metrics_url, config.namespaces, config.window_s)
        self.executor = Executor(self.admin, retries=config.execute_retries)
        self.burst = config.burst_config()
        self.warm_pools = WarmPoolSizer(config.warm_pool_config())
        self.elector = LeaderElector(config.client_settings(), config.lock_topic, config.identity)
        self.log = DecisionLog(config.decision_log, config.decision_log_max_bytes, config.decision_log_backups)
        self.controls = ControlStore(config.client_settings(), config.lock_topic + "-controls", self.identity)
        self.watcher = WakeWatcher(config.client_settings(), self._wake)
        self.effective: dict[str, Effective] = {}   # per function, as of the last period
        self._declared: dict[str, FunctionControls] = {}
        self._policies: dict[str, Policy] = {}      # per-function policy overrides, by key
        self.metrics = ControllerMetrics()
        self.history: deque[Iteration] = deque(maxlen=20)
        self.last_observation = None  # for live views: the graph and snapshot of the last period
        self._iter_lock = threading.Lock()
        self.watchdog = IterationWatchdog(
            lambda: max(STUCK_AFTER_MIN_S, STUCK_AFTER_PERIODS * self.config.period_s),
            on_stuck=lambda what: self.metrics.errors.labels("stuck").inc())
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
                self.watcher.watch({})
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
                rules, overrides, failed = self._controls(obs, it)
                current = {fn: k for fn, k in obs.current.items() if fn not in failed}
                self._fast_current, self._fast_controls = dict(current), (rules, overrides)
                step = self.autoscaler.step(obs.graph, obs.snapshot, current, now, rules, overrides)
                if step.error:
                    self.metrics.errors.labels("policy").inc()
                    it.errors.append(f"policy: {step.error}")
                    log.error("policy failed, nothing applied to %d function(s): %s", len(step.failed), step.error)
                for fn, error in {**failed, **step.failed}.items():
                    self.log.append(self._record(fn, term.epoch, now, old=obs.current[fn], new=obs.current[fn],
                                                 reason="policy failed: nothing decided", error=error))
                decisions = apply_caps(step.decisions, obs.caps)
                if self.config.mode == "worker":  # our worker cluster's room; stock Pulsar reports none
                    decisions = cap_to_capacity(decisions, cluster_capacity(self.admin))
                for d in decisions:
                    it.decisions.append(self._execute(d, term.epoch, now))
                    if it.decisions[-1]["applied"]:
                        self._fast_current[d.function] = d.new
                self.metrics.describe_inputs({fn: (obs.graph.nodes[fn].inputs, obs.subscriptions.get(fn, fn))
                                              for fn in obs.current if fn in obs.graph.nodes})
                self._watch(obs, decisions)
                if self.burst.enabled:
                    chosen = {**obs.current, **{d.function: d.new for d in decisions}}
                    it.decisions.extend(self._bursts(obs.snapshot, chosen, term.epoch, now))
                if self.warm_pools.config.enabled:   # from the parallelism now in force (applied decisions)
                    it.errors.extend(self._size_warm_pools(self._fast_current, term.epoch, now))
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
            obs = self.last_observation
            inputs = {fn: (obs.graph.nodes[fn].inputs, obs.subscriptions.get(fn, fn))
                      for fn in self._fast_current if fn in obs.graph.nodes}
            snapshot, it.errors = self.fast_monitor.observe(self._fast_current, now, inputs)
            step = self.autoscaler.step(obs.graph, snapshot, self._fast_current, now,
                                        *self._fast_controls)
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

    def _controls(self, obs, it: Iteration) -> tuple[dict[str, FunctionPlan], dict[str, tuple[str, Policy]],
                                                      dict[str, str]]:
        """This period's controls per function: Plan rules, policy overrides, and the functions whose
        own policy cannot be loaded (no decision for them, an error each)."""
        try:
            operator = self.controls.refresh()
        except pulsar.PulsarException as exc:   # keep following the controls last read
            operator = self.controls.known()
            it.errors.append(f"controls topic unreadable, last known controls apply: {exc}")
        self._declared = dict(obs.declared)
        self.effective = {fn: self._effective(fn, operator.get(fn, FunctionControls())) for fn in obs.current}
        rules, overrides, failed = {}, {}, {}
        for fn, e in self.effective.items():
            rules[fn] = FunctionPlan(e.min, e.max, e.paused, e.idle_s)
            self.metrics.paused.labels(fn).set(1 if e.paused else 0)
            self.metrics.max_parallelism.labels(fn).set(e.max)
            fs = obs.snapshot.functions.get(fn)
            if fs is not None and fs.backlog is not None:
                self.metrics.backlog.labels(fn).set(fs.backlog)
            if (e.policy, e.policy_params) != (self.config.policy, dict(self.config.policy_params)):
                try:
                    overrides[fn] = self._policy(e.policy, e.policy_params)
                except ConfigError as exc:
                    failed[fn] = f"policy override of {fn}: {exc}"
                    it.errors.append(failed[fn])
        return rules, overrides, failed

    def _policy(self, spec: str, params: dict) -> tuple[str, Policy]:
        key = f"{spec} {json.dumps(params, sort_keys=True)}"
        if key not in self._policies:
            self._policies[key] = load_policy(self._named_policy(spec), params)
        return key, self._policies[key]

    def _named_policy(self, name: str) -> str:
        """What a per-function policy name loads. Such names come from REST callers and from functions' own
        configs, so they never reach a file the operator did not put in policy_dir."""
        if name == self.config.policy:   # the controller's own, from its config file
            return name
        if name.endswith(".py") or "/" in name or "\\" in name:
            raise ConfigError(f"policy {name!r}: a per-function policy is given by name, not by file: register it "
                              f"as an entry point or put NAME.py in the controller's policy_dir")
        if self.config.policy_dir:
            plugin = Path(self.config.policy_dir, f"{name}.py")
            if plugin.is_file():
                return str(plugin)
        return name

    def _effective(self, fn: str, operator: FunctionControls) -> Effective:
        lo, hi = self.autoscaler.planner.config.limits(fn)
        base = FunctionControls(paused=False, min=lo, max=hi, policy=self.config.policy,
                                policy_params=dict(self.config.policy_params), dry_run=self.config.dry_run,
                                idle_s=self.autoscaler.planner.config.scale_to_zero_idle_s)
        return effective(fn, base, self._declared.get(fn, FunctionControls()), operator,
                         stock=self.config.mode == "stock")

    def _dry_run(self, fn: str) -> bool:
        """The controller-wide dry run wins; a function's own makes only that one recommend-only."""
        e = self.effective.get(fn)
        return self.config.dry_run or (e is not None and e.dry_run)

    def _record(self, function: str, epoch: int, now: float, **fields) -> dict:
        """A decision-log record: who decided what, when, under which term; applied/error follow."""
        e = self.effective.get(function)
        return {"time": now, "epoch": epoch, "controller": self.identity,
                "policy": e.policy if e else self.config.policy, "mode": self.config.mode, "function": function,
                "dry_run": self._dry_run(function), "paused": bool(e and e.paused), "applied": False,
                "error": None, **fields}

    @staticmethod
    def _applied(record: dict, result) -> None:
        """The execution's outcome in the record. A scale already in force (the wake watcher and the
        period both woke a function) changed nothing, and its record says so: one wake, not two."""
        record.update(applied=result.ok, error=result.error, execute_seconds=round(result.seconds, 4))
        if result.in_force:
            record.update(changed=False, reason=f"{record['reason']} (already in force)")

    def _execute(self, decision, epoch: int, now: float, kind: str = "period") -> dict:
        record = self._record(decision.function, epoch, now, kind=kind, old=decision.old,
                              proposed=decision.proposed, new=decision.new, reason=decision.reason,
                              changed=decision.changed,
                              inputs=asdict(decision.inputs) if decision.inputs else None)
        if self.config.mode == "stock" and decision.changed:
            record["restart_cost_s"] = self.admin.restart_cost_s()   # what this update costs on stock Pulsar
        if decision.changed:
            if record["dry_run"]:
                log.info("[dry run] would scale %s %d -> %d: %s", decision.function, decision.old, decision.new,
                         decision.reason)
            else:
                result = self.executor.apply(decision.function, decision.new, epoch)
                self._applied(record, result)
                if result.in_force:
                    log.info("%s was at %d already", decision.function, decision.new)
                elif result.ok:
                    log.info("scaled %s %d -> %d (epoch %d): %s", decision.function, decision.old, decision.new,
                             epoch, decision.reason)
                    direction = "out" if decision.new > decision.old else "in"
                    self.metrics.decisions.labels(decision.function, direction).inc()
                else:
                    self.metrics.errors.labels("execute").inc()
                    self.metrics.failures.labels(decision.function).inc()
                    log.error("could not scale %s to %d: %s", decision.function, decision.new, result.error)
        self.metrics.target.labels(decision.function).set(decision.new)
        self.log.append(record)   # every evaluation, changed or not: `autoscaler why` explains them
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
                self.admin.set_warm_pool(*fn.split("/"), size, epoch=epoch)
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
        self.watcher.watch({fn: tuple(nodes[fn].inputs) for fn, k in now_at.items()
                            if k == 0 and fn in nodes and not self.effective[fn].paused})

    def _wake(self, fn: str) -> None:
        """A message arrived on a sleeping function's input: scale it to its min (at least 1) now."""
        term, e = self.elector.term, self.effective.get(fn)
        if term is None or e is None or e.paused:
            return
        new, now = max(e.min, 1), time.time()
        record = self._record(fn, term.epoch, now, old=0, proposed=new, new=new, changed=True, kind="wake",
                              reason="wake: a message arrived on its input")
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

    # ---- operator controls (rest.py serves them; `pulsar-autoscale autoscaler` calls them) ----------------
    def controls_of(self, fn: str) -> dict:
        """Effective controls of one function, the layers they came from, and its last evaluation."""
        operator = self.controls.get(fn)
        e = self._effective(fn, operator)
        last = self.log.recent(fn, 1)
        return {**asdict(e), "dry_run": self.config.dry_run or e.dry_run,
                "layers": {"function config": self._declared.get(fn, FunctionControls()).set_fields(),
                           "operator": operator.set_fields()},
                "asleep": fn in self.watcher.watching, "last": last[0] if last else None}

    def set_controls(self, fn: str, update: dict) -> dict:
        """Operator controls of one function changed (None clears a field), checked, then stored on the
        controls topic, so every replica and the next leader follow them."""
        controls = self.controls.get(fn).changed(update, f"controls of {fn}")
        if self.config.mode == "stock" and controls.min == 0:
            raise ConfigError(f"{fn}: min 0 refused: stock Pulsar refuses parallelism 0 (no scale to zero); "
                              f"min stays at least 1")
        e = self._effective(fn, controls)
        if (e.policy, e.policy_params) != (self.config.policy, dict(self.config.policy_params)):
            self._policy(e.policy, e.policy_params)   # a bad policy or parameter is refused now, not each period
        self.controls.put(fn, controls)
        log.info("controls of %s set: %s", fn, controls.set_fields() or "none (controller defaults)")
        return self.controls_of(fn)

    def clear_controls(self, fn: str) -> dict:
        self.controls.put(fn, FunctionControls())
        return self.controls_of(fn)

    def why(self, fn: str, limit: int = 10) -> list[dict]:
        """This replica's evaluations of fn (a replica logs only the terms it led)."""
        return self.log.recent(fn, limit)

    def why_with_leader(self, fn: str, limit: int = 10) -> tuple[list[dict], str | None]:
        """Asked of a replica that does not lead: its own records merged with the leader's, fetched from
        the URL the leader advertised with its term, if that URL is one of the configured peers, with this
        controller's own credentials (the caller's never leave this replica). The second
        value says why only this replica's records could be given, else None."""
        own = self.why(fn, limit)
        if self.elector.is_leader():
            return own, None
        try:
            term = self.elector.latest()
        except pulsar.PulsarException as exc:
            return own, f"the broker did not say who leads ({exc}): this replica's records only"
        if term is None or term.holder == self.identity or not term.url:
            return own, None
        if host_port(term.url) not in {host_port(u) for u in self.config.peers}:
            return own, (f"the leader {term.holder} advertises {term.url}, which is not one of this controller's "
                         f"peers: this replica's records only")
        try:
            session = cluster_session(self.config.peers, self.config.auth, timeout_s=5)
            resp = session.get(f"{term.url}/autoscaler/functions/{fn}/why", params={"limit": limit})
            resp.raise_for_status()
            theirs = resp.json()
        except (requests.RequestException, ValueError) as exc:
            return own, (f"the leader {term.holder} at {term.url} did not answer ({redact_url(str(exc))}): "
                         f"this replica's records only")
        merged = {(r["time"], r["controller"], r.get("kind")): r for r in own + theirs}
        return sorted(merged.values(), key=lambda r: r["time"])[-limit:], None

    def reload(self) -> dict:
        """Re-read the config file; everything is built before anything is swapped, so a bad file
        leaves the running config as it was (ConfigError says why)."""
        if not self.config_path:
            raise ConfigError("this controller was not started from a config file: nothing to reload")
        try:
            new = ControllerConfig.from_file(self.config_path)
            new = ControllerConfig(**{**new.__dict__, **self.overrides}) if self.overrides else new
            new, kept = self.config.reloaded(new)
            changed = [f.name for f in dataclasses.fields(new) if getattr(new, f.name) != getattr(self.config, f.name)]
            policy = load_policy(new.policy, new.policy_params)
            planner = build_planner(new)
            burst = new.burst_config()
            warm_pool = new.warm_pool_config()
        except ConfigError as exc:
            log.error("reload of %s refused, the running config stays: %s", self.config_path, exc)
            raise ConfigError(f"reload of {self.config_path} refused, the running config stays: {exc}") from exc
        with self._iter_lock:
            if (new.policy, new.policy_params) != (self.config.policy, self.config.policy_params):
                self.policy = self.autoscaler.policy = policy
                self.autoscaler.states.pop(DEFAULT_POLICY, None)
            self.autoscaler.planner = planner
            self.monitor.metrics_url, self.monitor.namespaces = new.metrics_url, new.namespaces
            self.monitor.window_s = new.window_s
            self.executor.retries = new.execute_retries
            self.burst = burst
            self.warm_pools.config = warm_pool
            if (new.decision_log, new.decision_log_max_bytes, new.decision_log_backups) != \
                    (self.config.decision_log, self.config.decision_log_max_bytes, self.config.decision_log_backups):
                self.log = DecisionLog(new.decision_log, new.decision_log_max_bytes, new.decision_log_backups)
            self._policies.clear()
            self.config = new
        if self._scheduler and "period_s" in changed:
            self._scheduler.reschedule_job("mape", trigger="interval", seconds=new.period_s)
        log.info("reloaded %s: changed %s%s", self.config_path, ", ".join(changed) or "nothing",
                 f"; needs a restart, kept: {', '.join(kept)}" if kept else "")
        return {"reloaded": self.config_path, "changed": changed, "restart_needed": kept}

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
        if self._http:
            self._http.shutdown()
        self.watcher.close()
        self.controls.close()
        self.elector.release()

    def status(self) -> dict:
        term = self.elector.term
        return {"controller": self.identity, "leader": term is not None, "epoch": term.epoch if term else None,
                "policy": self.config.policy, "mode": self.config.mode, "dry_run": self.config.dry_run,
                "period_s": self.config.period_s, "fast_period_s": self.fast.period_s if self.fast.enabled else None,
                "paused": sorted(fn for fn, e in self.effective.items() if e.paused),
                "asleep": sorted(self.watcher.watching),
                "iterations": [_shown(asdict(i)) for i in list(self.history)[-5:]]}

    def _start_http(self) -> None:
        self.http_port = self.config.http_port or free_port(self.config.http_host)
        self._http = self.security.make_server(self.config.http_host, self.http_port, build_app(self))
        host = self.config.http_host if self.config.http_host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        self.elector.url = f"{self.security.scheme}://{host}:{self.http_port}"   # advertised with each term
        threading.Thread(target=self._http.serve_forever, name="controller-http", daemon=True).start()


def _shown(iteration: dict) -> dict:
    """An iteration for /status: error texts may quote URLs, whose user-info is a credential."""
    return {**iteration, "errors": [redact_url(e) for e in iteration["errors"]]}


def _now_dt():
    from datetime import datetime
    return datetime.now()
