"""One worker's part in a cluster: joins, follows the assignment, leads when it holds the lock,
and answers the admin API for the whole cluster.

Writes go through the topics only (metadata records from any worker, assignment snapshots
from the leader with its epoch). Worker-to-worker traffic is the admin API with `?scope=local`: the status
and stats of an instance are read from the worker that runs it, and querystate/putstate of a key go to
the worker whose instance holds its key group (a state write there is a state change like the instance's
own, persisted by that worker's changelog).
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

from pulsar_autoscale.broker.lite.function_limits import check_function
from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.functions.cluster.assignments import AssignmentTailer, Snapshot
from pulsar_autoscale.functions.cluster.membership import LocalReport, MembershipManager
from pulsar_autoscale.functions.cluster.metadata import FunctionMetaDataManager, MetadataTimeout
from pulsar_autoscale.functions.cluster.peers import Peers, merge_stats
from pulsar_autoscale.functions.cluster.scheduler import POLICIES, WorkerLoad, rebalance, schedule
from pulsar_autoscale.functions.cluster.state_owner import StateOwnerRouter
from pulsar_autoscale.functions.cluster.topics import ClusterTopics
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.model.errors import NotFound
from pulsar_autoscale.functions.worker.status import function_stats, instance_status
from pulsar_autoscale.functions.worker.worker import Worker
from pulsar_autoscale.leader import LeaderElector, Term
from pulsar_autoscale.pulsar_client import ClientSettings, open_client

log = logging.getLogger(__name__)
LOOP_S = 0.1
OPERATION_TIMEOUT_S = 10  # the client's: how long a join's try waits for the broker
LEADER_RETRY_S = 0.5


@dataclass(frozen=True)
class ClusterSettings:
    name: str
    capacity: int = 32  # instances this worker accepts
    heartbeat_interval_s: float = 0.5
    heartbeat_timeout_s: float = 2.5  # a worker is dead after this long without a heartbeat
    scheduler: str = "round-robin"
    handoff_timeout_s: float = 10.0  # make-before-break: longest wait for the new owner to run

    def __post_init__(self):
        ClusterTopics(self.name)  # validates the name
        if self.scheduler not in POLICIES:
            raise ValueError(f"unknown scheduler {self.scheduler!r}: use one of {', '.join(POLICIES)}")
        if self.capacity < 1:
            raise ValueError(f"worker capacity must be at least 1 instance, got {self.capacity}")
        if not 0 < self.heartbeat_interval_s < self.heartbeat_timeout_s:
            raise ValueError("the heartbeat interval must be positive and shorter than the heartbeat timeout")


class ClusterMember:
    def __init__(self, worker: Worker, url: str, settings: ClusterSettings, client: ClientSettings | str):
        self.worker = worker
        self.me = worker.worker_id
        self.url = url
        self.settings = settings
        self.topics = ClusterTopics(settings.name)
        self._client = open_client(client, operation_timeout_seconds=OPERATION_TIMEOUT_S)
        try:
            worker.keyed_spread = True  # keyedState instances spread over workers (functions/keyed/cluster.py)
            self.metadata = FunctionMetaDataManager(
                self._client, self.topics, Path(worker.data_dir), self.me, worker.max_parallelism, worker.instance_users
            )
            self.assignments = AssignmentTailer(self._client, self.topics, self.me)
            self._report = LocalReport()
            self.membership = MembershipManager(
                self._client,
                self.topics,
                self.me,
                url,
                settings.capacity,
                lambda: self._report,
                settings.heartbeat_interval_s,
                settings.heartbeat_timeout_s,
            )
            self.elector = LeaderElector(client, lock_topic=self.topics.leader_lock, identity=self.me)
            self._leaving = threading.Event()
            self._closing = threading.Event()
            self._handoff_since: dict[tuple[str, int], float] = {}
            self._applied: dict[str, tuple[int, frozenset[int], bool]] = {}  # (version, ids, front)
            self._restarts_seen: dict[tuple[str, int], int] = {}  # restart requests already acted on here
            # peers' REST APIs, with this worker's own credentials and trust (--auth-params: a superuser's token)
            self.peers = Peers(self.membership, self.me, ClientSettings.of(client).http_session())
            self.state_elsewhere = self.peers.state_elsewhere  # the admin API's state routes ask the member
            # one copy of a non-keyed function's state: the worker assigned its instance 0 owns it
            self.state_router = StateOwnerRouter(
                self.me,
                url,
                self.assignments,
                self.membership,
                ClientSettings.of(client).http_session(),
                worker.hosted_function,
                lambda: worker.pulsar_client,
            )
            worker.state_router = self.state_router
            self._threads = [
                threading.Thread(target=f, name=n, daemon=True)
                for f, n in (
                    (self._follow, "cluster-follow"),
                    (self._lead, "cluster-lead"),
                    (self._refresh_report, "cluster-report"),
                )
            ]
        except BaseException:  # a topic that did not open in time: this attempt's readers end with its client
            self._client.close()
            raise

    def start(self) -> "ClusterMember":
        # pulsar-lite B2: the worker's client is a lite.incarnation.incarnation_client, whose consumer ids
        # already start at a floor no other live client on the broker uses.
        try:
            self.membership.join()
            if not (self.metadata.wait_caught_up(15) and self.assignments.caught_up.wait(15)):
                log.warning("%s: cluster topics not read to the end within 15 s; continuing", self.me)
            self._discard_deleted()
        except BaseException:  # as in __init__: this attempt's readers and producers end with its client
            self._client.close()
            raise
        for t in self._threads:
            t.start()
        return self

    def _discard_deleted(self) -> None:
        """Before anything runs here: the files of functions deleted while this worker was down (a worker
        that is up removes a deleted function's files itself). Only against a view synced to the metadata
        topic's end, so that no function's state is taken for a deleted one's."""
        try:
            self.metadata.sync()
        except MetadataTimeout as exc:
            log.warning("%s: files of functions deleted meanwhile kept for now: %s", self.me, exc)
            return
        for fqfn in self.worker.discard_files_except(set(self.metadata.functions())):
            log.info("%s: removed the files of %s, deleted while this worker was down", self.me, fqfn)

    # ---- following the assignment -------------------------------------------------------------------
    def _refresh_report(self) -> None:
        while not self._closing.wait(self.settings.heartbeat_interval_s / 2):
            running, hosted, busy = [], [], 0.0
            ids = self.worker.hosted_ids()
            for cfg in self.worker.functions():
                try:
                    _, figs, _ = self.worker.instance_figures(cfg.fqfn)
                    busy += self.worker.counters(cfg.fqfn).busy_s
                except NotFound:
                    continue
                running += [f"{cfg.fqfn}:{i}" for i, f in figs.items() if f.running]
                hosted += [f"{cfg.fqfn}:{i}" for i in ids.get(cfg.fqfn, ())]
            term = self.elector.term
            self._report = LocalReport(
                tuple(sorted(running)), busy, self._leaving.is_set(), term.epoch if term else None, tuple(sorted(hosted))
            )

    def _follow(self) -> None:
        while not self._closing.is_set():
            try:
                self._reconcile()
            except Exception:
                log.exception("%s: applying the assignment failed; retrying", self.me)
            with self.assignments.changed:
                self.assignments.changed.wait(LOOP_S)

    def _reconcile(self) -> None:
        snap = self.assignments.current()
        records = self.metadata.functions()
        hosted = self.worker.hosted_ids()
        now = time.monotonic()
        for fqfn, rec in records.items():
            if fqfn not in snap.assignment and fqfn not in hosted:
                continue  # not scheduled yet
            want = {i for i, w in snap.assignment.get(fqfn, {}).items() if w == self.me}
            if rec.config.keyedState and rec.config.parallelism == 0:
                # asleep: every instance drains where it is and no front moves groups (its groups' owners stay as
                # saved), also while the leader's assignment still places instances from before
                want, keep = set(), set()
            elif rec.config.keyedState:
                # Break before make, per instance: an instance's key groups are restored from the changelog
                # by the worker that takes it over, and its route topic has one consumer, so the old worker
                # stops it first (its changes flushed) and the new one starts it only once no other live
                # worker runs it. A surplus instance (scale-in) runs until the front has moved its groups off;
                # one whose worker died meanwhile (no worker is assigned a surplus instance) runs on the front's.
                here = hosted.get(fqfn, set())
                want = {i for i in want if i in here or not self._running_elsewhere(fqfn, i)}
                keep = {i for i in here - want if i >= rec.config.parallelism and self.worker.keyed_holds_groups(fqfn, i)}
                keep |= {i for i in self.worker.keyed_surplus(fqfn) if i in here or not self._hosted_elsewhere(fqfn, i)}
            else:
                keep = {
                    i
                    for i in hosted.get(fqfn, set()) - want
                    if i < rec.config.parallelism and not self._handed_over(snap, fqfn, i, now)
                }
            target = frozenset((want | keep) - rec.stopped)
            # a keyedState function's front runs where instance 0 is assigned, also while instance 0 is stopped
            # (its keys wait in its route topic; the others go on), unless every instance is stopped
            front = 0 in want and bool(set(range(rec.config.parallelism)) - rec.stopped)
            if self._applied.get(fqfn) != (rec.version, target, front) or not hosted.get(fqfn, set()) >= target:
                self.worker.host_instances(rec.config, self.metadata.code_path(rec), set(target), front)
                self._applied[fqfn] = (rec.version, target, front)
                if (want - rec.stopped) - hosted.get(fqfn, set()):
                    self._beat_when_running(fqfn, want - rec.stopped)
            self._restart_requested(rec, target)
        for fqfn in set(hosted) - set(records):
            self.worker.unhost(fqfn)
            self._applied.pop(fqfn, None)

    def _restart_requested(self, rec, running: frozenset[int]) -> None:
        """The worker that runs an instance carries out each restart request for it once. An instance
        that starts here counts the requests made before as done: it starts fresh anyway."""
        fqfn = rec.config.fqfn
        for key in [k for k in self._restarts_seen if k[0] == fqfn and k[1] not in running]:
            del self._restarts_seen[key]
        for i in sorted(running):
            wanted = rec.restart_count(i)
            seen = self._restarts_seen.setdefault((fqfn, i), wanted)
            if wanted > seen:
                self._restarts_seen[(fqfn, i)] = wanted
                try:
                    self.worker.restart(fqfn, i)
                except PulsarAutoscaleError as exc:
                    log.warning("%s: restart of %s instance %d failed: %s", self.me, fqfn, i, exc)

    def _running_elsewhere(self, fqfn: str, instance_id: int) -> bool:
        name = f"{fqfn}:{instance_id}"
        return any(name in m.running for m in self.membership.alive() if m.worker_id != self.me)

    def _hosted_elsewhere(self, fqfn: str, instance_id: int) -> bool:
        """Also while another live worker starts it (restoring its state, not yet receiving)."""
        name = f"{fqfn}:{instance_id}"
        return any(name in m.hosted for m in self.membership.alive() if m.worker_id != self.me)

    def _handed_over(self, snap: Snapshot, fqfn: str, i: int, now: float) -> bool:
        """Make-before-break: an instance assigned away keeps running here until its new owner runs it
        (its heartbeat says so), the new owner is gone, or the hand-off times out."""
        owner = snap.owner(fqfn, i)
        since = self._handoff_since.setdefault((fqfn, i), now)
        member = self.membership.get(owner) if owner else None
        done = member is None or f"{fqfn}:{i}" in member.running or now - since > self.settings.handoff_timeout_s
        if done:
            self._handoff_since.pop((fqfn, i), None)
        return done

    def _beat_when_running(self, fqfn: str, ids: set[int]) -> None:
        """Tell the cluster as soon as new instances receive, so a hand-off does not wait a heartbeat."""

        def wait_and_beat():
            deadline = time.monotonic() + self.settings.handoff_timeout_s
            while time.monotonic() < deadline and not self._closing.is_set():
                try:
                    _, figs, _ = self.worker.instance_figures(fqfn)
                except NotFound:
                    return
                if all(figs.get(i) and figs[i].running for i in ids):
                    break
                time.sleep(0.05)
            names = {f"{fqfn}:{i}" for i in ids}
            self._report = replace(
                self._report,
                running=tuple(sorted(set(self._report.running) | names)),
                hosted=tuple(sorted(set(self._report.hosted) | names)),
                leaving=self._leaving.is_set(),
            )
            self.membership.beat_now()

        threading.Thread(target=wait_and_beat, daemon=True).start()

    # ---- leading --------------------------------------------------------------------------------------
    def _lead(self) -> None:
        while not self._closing.is_set():
            term = self.elector.term
            if term is None or not self.elector.check():
                if not self._closing.wait(LEADER_RETRY_S):
                    try:
                        self._try_lead()
                    except Exception:  # this thread is the cluster's only way to a leader: it must not end
                        log.exception("%s: an attempt to lead failed; retrying", self.me)
                continue
            try:
                self._schedule(term)
            except Exception:
                log.exception("%s: scheduling failed; retrying", self.me)
            self._closing.wait(LOOP_S)

    def _try_lead(self) -> bool:
        term = self.elector.try_acquire()
        if term is None:
            return False
        self._report = replace(self._report, leaving=self._leaving.is_set(), leader_epoch=term.epoch)
        self.membership.beat_now()
        log.info("%s leads cluster %s with epoch %d", self.me, self.settings.name, term.epoch)
        return True

    def _schedule(self, term: Term) -> None:
        snap = self.assignments.current()
        if snap.epoch > term.epoch:  # someone newer leads: we were deposed
            self.elector.release()
            return
        eligible = [WorkerLoad(m.worker_id, m.capacity, m.busy_rate) for m in self.membership.alive() if not m.leaving]
        records = self.metadata.functions()
        parallelism = {f: r.config.parallelism for f, r in records.items()}
        nxt, unplaced = schedule(snap.assignment, parallelism, eligible, self.settings.scheduler)
        pending = tuple(r for r in self.metadata.rebalances() if r not in snap.rebalanced)
        if pending:  # keyedState instances stay where they are (a move would be a hand-over of their groups)
            nxt = rebalance(nxt, eligible, frozenset(f for f, r in records.items() if r.config.keyedState))
        new = Snapshot(term.epoch, self.me, nxt, snap.rebalanced + pending, unplaced)
        if new == snap:
            return
        self.assignments.publish(new)
        if not self.assignments.wait_for(lambda s: s == new or s.epoch > term.epoch, 5.0):
            log.warning("%s: assignment not read back within 5 s", self.me)

    # ---- the cluster-wide admin answers -----------------------------------------------------------------
    def create(self, cfg: FunctionConfig, code: bytes | None = None, filename: str | None = None) -> FunctionConfig:
        self._check(cfg)
        return self.metadata.create(cfg, code, filename)

    def update(self, fqfn: str, changes: dict, code: bytes | None = None, filename: str | None = None) -> FunctionConfig:
        return self.metadata.update(fqfn, changes, code, filename, check=self._check)

    def _check(self, cfg: FunctionConfig) -> None:
        """What this broker cannot serve is refused before any worker runs it (broker/lite/function_limits.py)."""
        self.worker.link.require()
        check_function(cfg, self.worker.link.profile)

    def delete(self, fqfn: str) -> None:
        self.metadata.delete(fqfn)

    def get(self, fqfn: str) -> FunctionConfig:
        return self.metadata.get(fqfn).config

    def list(self, tenant: str, namespace: str) -> builtins.list[str]:
        return sorted(
            r.config.name
            for r in self.metadata.functions().values()
            if r.config.tenant == tenant and r.config.namespace == namespace
        )

    def functions(self) -> builtins.list[FunctionConfig]:
        return [r.config for r in self.metadata.functions().values()]

    def rebalance(self) -> str:
        return self.metadata.request_rebalance()

    def function_source(self, fqfn: str) -> tuple[FunctionConfig, str | None]:
        """The config and this worker's copy of the code (from the package topic), hosted here or not."""
        rec = self.metadata.get(fqfn)
        return rec.config, self.metadata.code_path(rec)

    def control(self, fqfn: str, action: str, instance_id: int | None) -> None:
        """start/stop/restart, accepted by any worker; the worker that runs the instance acts."""
        self.metadata.control(fqfn, action, instance_id)

    def members(self) -> builtins.list[dict]:
        return [m.view() for m in self.membership.alive()]

    def leader(self) -> dict:
        m = self.membership.leader()
        if m is None:
            raise NotFound(f"cluster {self.settings.name} has no leader right now (an election takes about 1 s)")
        return {**m.view(), "epoch": m.leader_epoch}

    def assignment_view(self) -> dict:
        out: dict[str, list[str]] = {m.worker_id: [] for m in self.membership.alive()}
        for fqfn, placed in sorted(self.assignments.current().assignment.items()):
            for i, wid in sorted(placed.items()):
                out.setdefault(wid, []).append(f"{fqfn}:{i}")
        return out

    def local_status(self, fqfn: str) -> dict[int, dict]:
        try:
            _, figs, restarts = self.worker.instance_figures(fqfn)
            front = self.worker.keyed_view(fqfn)  # a keyedState function's front (instance 0's worker): migrations
        except NotFound:
            return {}
        out = {i: instance_status(i, f, restarts.get(i, 0), self.me) for i, f in figs.items()}
        if front is not None and 0 in out:
            out[0]["keyedState"] = front
        return out

    def local_stats(self, fqfn: str) -> dict | None:
        try:
            _, figs, _ = self.worker.instance_figures(fqfn)
            return function_stats(
                figs, self.worker.counters(fqfn), self.worker.counters_1min_ago(fqfn), self.worker.exception_totals(fqfn)
            )
        except NotFound:
            return None

    def stopped(self, fqfn: str) -> set[int]:
        """The function's instances stopped by start/stop (they run nowhere, and their state with them)."""
        return set(self.metadata.get(fqfn).stopped)

    def status(self, fqfn: str) -> dict:
        rec = self.metadata.get(fqfn)
        cfg = rec.config
        snap = self.assignments.current()
        owners = {i: snap.owner(fqfn, i) for i in range(cfg.parallelism)}
        # each worker's status body of its instances (ours, or a peer's JSON), None from one that did not answer
        views = cast(
            "dict[str, dict | None]",
            self.peers.gather(
                fqfn, "status", lambda f: {str(i): s for i, s in self.local_status(f).items()}, {w for w in owners.values() if w}
            ),
        )
        instances = []
        for i, wid in owners.items():
            st = (views.get(wid) or {}).get(str(i)) if wid else None
            if st is None:
                error = (
                    "stopped"
                    if i in rec.stopped
                    else "unassigned: the cluster has no capacity left"
                    if wid is None
                    else f"not running on {wid} yet"
                    if wid in views and views[wid] is not None
                    else f"worker {wid} is unreachable"
                )
                st = {"instanceId": i, "status": {"running": False, "error": error, "numRestarts": 0, "workerId": wid or ""}}
            instances.append(st)
        keyed = next((st.pop("keyedState") for st in instances if "keyedState" in st), None)
        return {
            "numInstances": cfg.parallelism,
            "numRunning": sum(1 for s in instances if s["status"]["running"]),
            "instances": instances,
            **({"autoscale": {"keyedState": keyed}} if keyed is not None else {}),
        }

    def stats(self, fqfn: str) -> dict:
        """Sums over every live worker: cumulative counters include instances drained there. A worker
        killed with -9 takes its drained instances' counts with it."""
        self.get(fqfn)
        snap = self.assignments.current()
        # each worker's stats body (local_stats's, or a peer's JSON), None from one that did not answer
        gathered = cast(
            "dict[str, dict | None]",
            self.peers.gather(fqfn, "stats", self.local_stats, {m.worker_id for m in self.membership.alive()}),
        )
        views = [v for v in gathered.values() if v]
        owned = {i for i, w in snap.assignment.get(fqfn, {}).items()}
        return merge_stats(views, owned)

    # ---- leaving ----------------------------------------------------------------------------------------
    def leave(self, timeout_s: float = 30.0) -> None:
        """SIGTERM: make-before-break. Say we are leaving, let the leader move our instances, keep them
        running until their new owners run them, then stop."""
        self._leaving.set()
        self._report = replace(self._report, leaving=True)
        self.membership.beat_now()
        others = [m for m in self.membership.alive() if m.worker_id != self.me and not m.leaving]
        if others:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and any(self.worker.hosted_ids().values()):
                time.sleep(0.05)
        self.close()

    def close(self) -> None:
        self._closing.set()
        for t in self._threads:
            if t.is_alive():
                t.join(5)
        self.membership.close(self._report)
        self.elector.release()
        self.assignments.close()
        self.metadata.close()
        self._client.close()
