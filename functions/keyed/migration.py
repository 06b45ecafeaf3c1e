"""Live migration of key groups between the instances of a keyed stateful function (DRRS, paper 004).

A parallelism change moves only the groups that must move (KeyGroupAssignment.rescale), in
subscales of a few groups (default 4), one after the other. For each subscale:

1. trigger: the router stops serving the subscale's groups; their records wait in order
   (routing.KeyedRouter.stop_serving); every other group goes on;
2. the old owners put the groups down (no record of them in hand) and release them: flush,
   snapshot, forget (the store's `release`); that is their confirm;
3. the new owners open them (the store's `open`: local snapshot or changelog replay);
4. the router serves them from the new owners; the records that waited go first, in order.

Subscales are paced (`duty`, default 0.5: after a subscale that took t, the next starts t later), so
that migration work, which competes with processing for the worker's CPU, never takes more than that
share of it: the load's spare capacity drains what the moving groups held meanwhile, and unaffected
keys keep their latency. `stop_the_world=True` is the baseline it is measured against (bench/state_migration.py;
a function picks it, the subscale size and the duty in customRuntimeOptions.keyedMigration, config.KeyedMigration):
every group pauses, all moves happen as one batch, then everything resumes.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import pulsar

from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.functions.keyed.routing import KeyedRouter
from pulsar_autoscale.functions.model.keygroups import KeyGroupAssignment, key_group, moves, subscales
from pulsar_autoscale.functions.model.migration_settings import KeyedMigration
from pulsar_autoscale.functions.state.changelog import Changelog
from pulsar_autoscale.functions.state.pacing import Pacer
from pulsar_autoscale.functions.state.restore import RestoreStats
from pulsar_autoscale.functions.state.store import StateStore

log = logging.getLogger(__name__)
PUT_DOWN_TIMEOUT_S = 30.0
# Pre-copy rounds before the first subscale (iterative pre-copy, as in live VM migration): each round reads the
# changes made while the one before ran, so the first subscales' opens read a short tail, not the first round's.
# Rounds go on until one took under PRE_COPY_SETTLED_S (what changed meanwhile is read as fast by an open), at
# most PRE_COPY_ROUNDS: a paced pre-copy (preCopyMBps) of a busy function converges in a few.
PRE_COPY_ROUNDS = 5
PRE_COPY_SETTLED_S = 1.0
CLEAN_MARKER = "clean-stop"


class MigrationError(PulsarAutoscaleError):
    """A subscale could not complete (an instance kept a record of a moving group in hand too long)."""


class InstanceStores(Protocol):
    """The state of each instance's key groups (functions/state/store.py's key-grouped store per instance).
    Each call takes {instance id: groups} and returns once every instance has done its part (in parallel
    where the instances are on several workers)."""

    def prepare_all(self, groups: dict[int, set[int]], duty: float, mb_per_s: float | None) -> None:
        """Pre-copy: the new owners bring groups they will receive up to now from the changelog, while the
        old owners still serve them, paced to `duty` and `mb_per_s`; best effort (an open restores what a
        prepare did not)."""

    def release_all(self, groups: dict[int, set[int]]) -> None:
        """Flush + snapshot + forget: the old owners' confirm."""

    def open_all(self, groups: dict[int, set[int]]) -> None:
        """Restore the groups (local snapshot + changelog tail, else a full changelog replay)."""


@dataclass
class MigrationReport:
    moved_groups: int
    subscales: int
    duration_s: float
    stop_the_world: bool
    subscale_s: list[float] = field(default_factory=list)  # trigger -> served, per subscale
    put_down_s: float = 0.0  # summed over subscales: waiting for records in hand
    release_s: float = 0.0  # old owners' flush + snapshot + forget
    open_s: float = 0.0  # new owners' restore
    prepare_s: float = 0.0  # pre-copy before the first subscale (live only)
    pre_copy_rounds: int = 0


def migrate(
    router: KeyedRouter,
    stores: InstanceStores,
    target: KeyGroupAssignment,
    how: KeyedMigration = KeyedMigration(),
    put_down_timeout_s: float = PUT_DOWN_TIMEOUT_S,
    save: Callable[[KeyGroupAssignment], None] = lambda _a: None,
    stop: threading.Event | None = None,
) -> MigrationReport:
    """Move the router's groups to `target`'s owners (the instances of both must be attached).
    `save` gets the assignment to keep after each subscale's releases, before its opens: its groups already
    belong to their new owners there, so an old owner that restarts meanwhile (its groups are read from the
    save) does not take back a group it has just released. `stop` set: no
    further pre-copy round or subscale starts (the function is going); every group is served by one owner
    when it returns, so the assignment it leaves is whole (moved_groups counts what moved)."""
    stop = stop or threading.Event()
    subscale_size, stop_the_world, duty = how.subscale_size, how.stop_the_world, how.duty
    if subscale_size < 1:
        raise ValueError(f"subscale size must be at least 1 key group, got {subscale_size}")
    if not 0 < duty <= 1:
        raise ValueError(f"duty must be in (0, 1], got {duty}")
    if target.num_key_groups != router.num_key_groups:
        raise ValueError(f"target has {target.num_key_groups} key groups, the function {router.num_key_groups}")
    todo = moves(router.assignment, target)
    start = time.monotonic()
    report = MigrationReport(len(todo), 0, 0.0, stop_the_world)
    if todo and not stop_the_world:
        try:
            for _ in range(PRE_COPY_ROUNDS):  # a later round reads only what changed during the one before
                if stop.is_set():
                    break
                began = time.monotonic()
                stores.prepare_all(_by(todo, "dst"), duty, how.pre_copy_mb_per_s)
                report.pre_copy_rounds += 1
                if time.monotonic() - began < PRE_COPY_SETTLED_S:
                    break
        except (MigrationError, pulsar.PulsarException, TimeoutError, OSError, sqlite3.Error) as exc:
            log.warning("pre-copy of %d key groups failed (%s); their opens restore them instead", len(todo), exc)
        report.prepare_s = time.monotonic() - start
    if stop_the_world and todo:
        everything = set(range(router.num_key_groups))
        router.stop_serving(everything)
        _put_down(router, everything, put_down_timeout_s)
        batches = [todo]
    else:  # (stop-the-world with nothing to move pauses nothing)
        batches = subscales(todo, subscale_size)
    pace = Pacer(duty, stop=stop)
    for n, batch in enumerate(batches):
        if n:
            pace()  # the last subscale's time times (1 - duty) / duty
        if stop.is_set():
            report.moved_groups = sum(len(b) for b in batches[:n])
            log.info("migration stopped after %d of %d subscales", n, len(batches))
            break
        t0 = time.monotonic()
        groups = {m.group for m in batch}
        if not stop_the_world:
            router.stop_serving(groups)
            _put_down(router, groups, put_down_timeout_s)
        t1 = time.monotonic()
        stores.release_all(_by(batch, "src"))
        moved = {m.group: m.dst for m in batch}
        save(KeyGroupAssignment(router.num_key_groups, tuple(moved.get(g, o) for g, o in enumerate(router.assignment.owners))))
        t2 = time.monotonic()
        stores.open_all(_by(batch, "dst"))
        t3 = time.monotonic()
        report.put_down_s += t1 - t0
        report.release_s += t2 - t1
        report.open_s += t3 - t2
        if not stop_the_world:
            router.serve({m.group: m.dst for m in batch})
        report.subscale_s.append(time.monotonic() - t0)
        report.subscales += 1
    if stop_the_world and todo:  # stopped before its one batch: every group back to its owner
        owners = target.owners if report.subscales else router.assignment.owners
        router.serve({g: owners[g] for g in range(router.num_key_groups)})
    report.duration_s = time.monotonic() - start
    log.info(
        "migrated %d key groups to %d instances in %d subscale(s) in %.3f s (pre-copy %.2f s)%s",
        report.moved_groups,
        target.parallelism,
        report.subscales,
        report.duration_s,
        report.prepare_s,
        " (stop-the-world)" if stop_the_world else "",
    )
    return report


def _by(batch, end: str) -> dict[int, set[int]]:
    """{instance: groups} of a batch of moves, by their source or their destination."""
    out: dict[int, set[int]] = defaultdict(set)
    for m in batch:
        out[getattr(m, end)].add(m.group)
    return dict(out)


def _put_down(router: KeyedRouter, groups: set[int], timeout_s: float) -> None:
    if not router.wait_put_down(groups, timeout_s):
        raise MigrationError(f"an instance kept a record of key groups {sorted(groups)} in hand for more than {timeout_s:.0f} s")


class InstanceStateStores:
    """One StateStore per instance of a keyed function on this worker, owning exactly its key groups.

    Their snapshots share one directory (the worker's disk), so a group released by one instance opens
    in another from its snapshot plus the changelog after it; on a worker without the snapshot (another
    worker, a lost disk) open replays the whole changelog (functions/state/store.py).

    The changelog is the truth: after a clean stop (close_clean: every group snapshotted) the local
    files are used as they are; after anything else (kill -9, a crash in a migration) each instance's
    groups are restored from their snapshot and the changelog when its store opens, so changes never
    acked (local only) are dropped and come back with the redelivered input.
    """

    def __init__(
        self,
        directory: Path,
        num_key_groups: int,
        owners: Callable[[], KeyGroupAssignment],
        client: Callable[[], pulsar.Client],
        changelog: Changelog,
        new: bool = False,
        restore_always: bool = False,
    ):
        """`new`: a function just created here, whose state starts empty (a changelog left by a deleted
        function of the same name is not its state). `restore_always` (a cluster, where the function may
        have run elsewhere since this worker's files were written): restore every group when it opens."""
        self._dir = directory
        self._num_key_groups = num_key_groups
        self._owners = owners
        self._client = client
        self._changelog = changelog
        self._stores: dict[int, StateStore] = {}
        self._unrestored: set[int] = set()
        self._restoring: dict[int, threading.Lock] = {}
        self._copied: dict[int, set[int]] = {}  # instance -> groups pre-copied for it, not opened yet
        self._lock = threading.Lock()
        self.restores: list[RestoreStats] = []
        marker = directory / CLEAN_MARKER
        self._trust_local = not restore_always and (new or marker.exists())
        marker.unlink(missing_ok=True)

    def store(self, instance_id: int) -> StateStore:
        with self._lock:
            store = self._stores.get(instance_id)
            if store is None:
                store = StateStore(
                    self._dir / f"instance-{instance_id}.sqlite",
                    self._num_key_groups,
                    owned=set(self._owners().groups_of(instance_id)),
                )
                store.snapshot_dir = self._dir / "snapshots"
                if store.owned() and not self._trust_local:
                    self._unrestored.add(instance_id)
                self._stores[instance_id] = store
            return store

    def restore(self, instance_id: int) -> None:
        """Restore the instance's groups if its store needs it (see the class); the instance's own thread
        calls it before it takes records, so the worker's lock is not held and instances restore in parallel."""
        store = self.store(instance_id)
        with self._gate(instance_id):  # a migration's release/open waits for the instance's restore, and back
            if instance_id not in self._unrestored:
                return
            stats = store.open(store.owned(), restore=True, client=self._client(), changelog=self._changelog)
            self._unrestored.discard(instance_id)
        self.restores.append(stats)
        self._log_opened(logging.INFO, "restored", instance_id, stats)

    def _log_opened(self, level: int, verb: str, instance_id: int, stats: RestoreStats) -> None:
        log.log(
            level,
            "%s: instance %d %s %d key groups (%d from a snapshot): %d changelog records, %.1f MB in %.2f s",
            self._changelog,
            instance_id,
            verb,
            stats.groups,
            stats.from_snapshot,
            stats.records,
            stats.bytes / 1e6,
            stats.seconds,
        )

    def _gate(self, instance_id: int) -> threading.Lock:
        with self._lock:
            return self._restoring.setdefault(instance_id, threading.Lock())

    def forget(self, instance_ids: set[int] | None = None) -> None:
        """The function's instances (these, or all) left this worker (a cluster stopped or moved them): when they
        come back, their stores open anew and restore, since the function may have run elsewhere meanwhile."""
        with self._lock:
            for i in list(self._stores) if instance_ids is None else instance_ids & set(self._stores):
                self._stores.pop(i).close()
                self._unrestored.discard(i)
                self._copied.pop(i, None)
                log.info("%s: instance %d left this worker: its store closed", self._changelog, i)

    def snapshot(self, instance_ids: set[int]) -> None:
        """Drained instances' groups, before they are forgotten, so that their next restore here replays only the
        changelog after now, not all of it (a stop and start of a 50 MB function replayed 50 MB). Best effort: a
        group left unsnapshotted replays its whole changelog when it opens next (correct, slower)."""
        with self._lock:
            for i in sorted(instance_ids & set(self._stores) - self._unrestored):  # unrestored: files not its state
                try:
                    self._stores[i].snapshot(self._stores[i].owned())
                except pulsar.PulsarException as exc:
                    log.warning(
                        "%s: instance %d's key groups were not snapshotted (%s): they restore from the "
                        "whole changelog when they open next",
                        self._changelog,
                        i,
                        exc,
                    )

    def instances(self) -> list[int]:
        with self._lock:
            return sorted(self._stores)

    def held(self, instance_id: int) -> set[int]:
        """The groups this worker's store of the instance holds now (none if it has no store here)."""
        with self._lock:
            store = self._stores.get(instance_id)
        return store.owned() if store is not None else set()

    def close_clean(self) -> None:
        """A clean stop (the instances drained): snapshot every group, so the next start trusts the files."""
        with self._lock:
            for i, store in self._stores.items():
                if i not in self._unrestored:  # never restored here: its files are not its state
                    store.snapshot(store.owned())
                store.close()
            if not self._unrestored:
                self._dir.mkdir(parents=True, exist_ok=True)
                (self._dir / CLEAN_MARKER).touch()

    def for_key(self, key: str) -> StateStore:
        """REST querystate/putstate: the store of an instance here whose groups hold the key, else of the
        instance that owns the key's own group."""
        with self._lock:
            stores = list(self._stores.values())
        holder = next((s for s in stores if s.holds(key)), None)
        return holder or self.store(self._owners().owners[key_group(key, self._num_key_groups)])

    def release(self, instance_id: int, groups: set[int]) -> None:
        """An instance never restored here gives its groups up as they are: it has changed nothing, their state is
        the changelog's, and their new owner opens them from it. A surplus instance that starts on a cluster only
        to hand its groups over (keyed_cluster.ClusterKeyed.open_input) replayed their whole changelog first."""
        store = self.store(instance_id)
        with self._gate(instance_id):
            unrestored = instance_id in self._unrestored
            store.release(groups, snapshot=not unrestored)
        if unrestored:
            log.info(
                "%s: instance %d released %d key groups it never restored: they open from the changelog",
                self._changelog,
                instance_id,
                len(groups),
            )

    def _in_use(self) -> set[int]:
        """The groups some store here owns (the caller holds the lock): their files are being served."""
        return set().union(*(s.owned() for s in self._stores.values()))

    def open(self, instance_id: int, groups: set[int]) -> None:
        """Open the groups; the instance's other pre-copied groups come up to now in the same changelog read."""
        self.restore(instance_id)
        with self._lock:
            copied = self._copied.get(instance_id, set()) - set(groups) - self._in_use()
        stats = self.store(instance_id).open(
            groups, restore=True, client=self._client(), changelog=self._changelog, refresh=copied
        )
        with self._lock:
            self._copied[instance_id] = copied
        self.restores.append(stats)
        # per instance and per subscale: DEBUG; a change's one INFO line is migrate()'s "migrated ..."
        self._log_opened(logging.DEBUG, "opened", instance_id, stats)

    def prepare(self, instance_id: int, groups: set[int], duty: float = 1.0, mb_per_s: float | None = None) -> None:
        """Pre-copy the groups whose files no store here uses (on one worker a moving group's file is in use
        by its old owner, and a release makes it current anyway: nothing to do)."""
        with self._lock:
            todo = set(groups) - self._in_use()
        if not todo:
            return
        stats = self.store(instance_id).prepare(todo, self._client(), self._changelog, duty, mb_per_s)
        with self._lock:
            self._copied[instance_id] = todo
        log.debug(
            "%s: instance %d pre-copied %d key groups (%d from a snapshot): %d changelog records, %.1f MB in %.2f s",
            self._changelog,
            instance_id,
            stats.groups,
            stats.from_snapshot,
            stats.records,
            stats.bytes / 1e6,
            stats.seconds,
        )

    def prepare_all(self, groups: dict[int, set[int]], duty: float, mb_per_s: float | None) -> None:
        for i, gs in groups.items():
            self.prepare(i, gs, duty, mb_per_s)

    def release_all(self, groups: dict[int, set[int]]) -> None:
        for i, gs in groups.items():
            self.release(i, gs)

    def open_all(self, groups: dict[int, set[int]]) -> None:
        for i, gs in groups.items():
            self.open(i, gs)
