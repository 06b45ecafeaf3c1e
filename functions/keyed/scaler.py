"""Scaling a keyed stateful function's instances on one worker around live migrations of its key groups.

KeyedScaler applies the latest wanted parallelism on a thread of its own: it starts the new instances, moves
key groups to their new owners (migration.migrate), then drains the surplus instances. LocalStores is what it
needs of the stores when the instances run on this worker.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Generic, Protocol, TypeVar

from pulsar_autoscale.functions.keyed.migration import InstanceStores, MigrationReport, migrate
from pulsar_autoscale.functions.keyed.routing import KeyedInput, KeyedRouter
from pulsar_autoscale.functions.model.keygroups import KeyGroupAssignment, moves
from pulsar_autoscale.functions.model.migration_settings import KeyedMigration

log = logging.getLogger(__name__)


class LocalStores(InstanceStores, Protocol):
    """InstanceStores whose instances run on this worker (InstanceStateStores): KeyedScaler.open_input restores
    an instance's groups here before its mailbox opens."""

    def restore(self, instance_id: int) -> None: ...


Stores = TypeVar("Stores", bound=InstanceStores)
Local = TypeVar("Local", bound=LocalStores)


class KeyedScaler(Generic[Stores]):
    """A keyed function's instances on one worker, scaled around live migrations.

    Scale-out starts the new instances (they own nothing yet), then moves groups to them; scale-in
    first moves every group off the surplus instances, then drains them. One background thread per
    function applies the latest wanted parallelism; a change that arrives during a migration stops it after
    its current subscale (every group served by one owner) and the next starts from the assignment it left,
    so a migration never goes on towards a parallelism the function no longer has (a resumed one included).
    """

    def __init__(
        self,
        router: KeyedRouter,
        stores: Stores,
        start: Callable[[int], None],
        drain: Callable[[list[int]], None],
        save: Callable[[KeyGroupAssignment], None],
        settings: Callable[[], KeyedMigration] = KeyedMigration,
        retry_s: float | None = None,
    ):
        """`retry_s`: retry a failed migration after this long (on a cluster an instance that died meanwhile
        comes back on another worker); None: the next scale() retries."""
        self.router = router
        self.stores = stores
        self._start, self._drain, self._save = start, drain, save
        self.settings = settings  # the function's current customRuntimeOptions.keyedMigration
        self.retry_s = retry_s
        self.reports: list[MigrationReport] = []
        self.failure = ""
        self._wanted: int | None = None
        self._cond = threading.Condition()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._called_off = threading.Event()
        self._interrupt = threading.Event()  # set: the migration under way stops (called off, or a new target)
        self._target: int | None = None  # what the migration under way moves to

    def stop(self) -> None:
        """No more retries: this scaler's router is closing (a cluster's front moved); a migration under way
        finishes (the next front would have to move its groups again)."""
        self._stopped = True

    def call_off(self) -> None:
        """The function is deleted: a migration under way stops after its current subscale (every group is
        served by one owner), and nothing more starts."""
        self._stopped = True
        self._called_off.set()
        self._interrupt.set()

    def halt(self, timeout_s: float) -> bool:
        """call_off(), then wait for the migration under way to stop (False: still busy after timeout_s)."""
        self.call_off()
        return self.idle(timeout_s)

    def open_input(self: KeyedScaler[Local], instance_id: int) -> KeyedInput:
        """What a keyed instance's thread opens instead of a consumer: its groups' state restored first
        (records of its groups wait in the router meanwhile), then its mailbox."""
        self.stores.restore(instance_id)
        return self.router.attach(instance_id)

    def scale(self, target: int) -> None:
        """Ask for `target` instances; returns at once (idle() says when it is done)."""
        with self._cond:
            self._wanted = target
            self._busy = True
            if self._target is not None and target != self._target:
                self._interrupt.set()  # stop moving towards a parallelism the function no longer has
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="keyed-scaler", daemon=True)
                self._thread.start()

    def view(self) -> dict:
        """What status shows: whether groups are moving, who owns how many, the last migration, a failure."""
        owners = self.router.assignment.owners
        last = self.reports[-1] if self.reports else None
        waiting = self.router.waiting_for_absent()  # records of stopped instances, held here (routing.py)
        return {
            "migrating": self._busy,
            "groupsPerInstance": {str(i): owners.count(i) for i in sorted(set(owners))},
            "lastMigration": None
            if last is None
            else {
                "movedGroups": last.moved_groups,
                "subscales": last.subscales,
                "seconds": round(last.duration_s, 3),
                "stopTheWorld": last.stop_the_world,
                "preCopySeconds": round(last.prepare_s, 3),
                "preCopyRounds": last.pre_copy_rounds,
            },
            **({"waitingForStoppedInstances": {str(i): n for i, n in sorted(waiting.items())}} if waiting else {}),
            **({"failure": self.failure} if self.failure else {}),
        }

    def idle(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy, timeout=timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                target, self._wanted = self._wanted, None
                if target is None or self._called_off.is_set():
                    self._busy, self._target = False, None
                    self._cond.notify_all()
                    return
                self._target = target
                if not self._called_off.is_set():
                    self._interrupt.clear()
            try:
                self._apply(target)
                self.failure = ""
            except Exception as exc:  # status shows it; the next scale() retries from where it stopped
                log.exception("live migration to %d instances failed", target)
                self.failure = f"live migration to {target} instances failed: {type(exc).__name__}: {exc}"
                if self.retry_s is not None and not self._stopped:
                    self._called_off.wait(self.retry_s)  # pacing the retry, not synchronisation
                    with self._cond:
                        self._wanted = target if self._wanted is None else self._wanted

    def _apply(self, target: int) -> None:
        for i in range(target):
            self._start(i)  # a no-op for a running instance
        new = self.router.assignment.rescale(target)
        # groups a failed migration left in transit that this one does not move: back to their owner
        stale = self.router.moving() - {m.group for m in moves(self.router.assignment, new)}
        if stale:
            self.router.serve({g: self.router.assignment.owners[g] for g in stale})
        report = migrate(self.router, self.stores, new, self.settings(), save=self._save, stop=self._interrupt)
        if report.moved_groups or not self.reports:  # status' lastMigration: the last one that moved groups
            self.reports.append(report)
        if self._interrupt.is_set():  # called off, or retargeted: _run goes on from the assignment left
            return
        surplus = sorted((i for i in self.router.attached() if i >= target), reverse=True)
        if surplus:
            self._drain(surplus)
