"""Key-group routing: a keyed stateful function's records reach the instance that owns their key group.

One `KeyedRouter` per keyed function per worker holds the worker's input (one consumer, as
lite.shared_input.SharedInput does for process instances) and a mailbox per local instance. Its
dispatcher thread receives, maps the record's key to its group (state.message_group: the hash
Pulsar's Key_Shared uses) and appends the record to the mailbox of the group's owner, so records
of one key stay in receive order on the worker. A group in transit (live migration,
functions/keyed/migration.py) is served by nobody: its records wait in the router's hold list and go
to the new owner, in order, once it has restored the group. An instance that takes a record of
a group it no longer owns (it was in its mailbox when the group moved) hands it back to the
router, which re-routes it: never dropped, never processed by a non-owner.

Acks go to the one consumer the record came from; a worker that dies leaves its unacked records
to the broker, which redelivers them (docs/dev/keyed-state-design.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import pulsar

from pulsar_autoscale.functions.model.config_parts import DEFAULT_RECEIVER_QUEUE_SIZE
from pulsar_autoscale.functions.model.keygroups import KeyGroupAssignment
from pulsar_autoscale.functions.state.groups import message_group

log = logging.getLogger(__name__)
RECEIVE_TIMEOUT_MS = 100
# One worker: a stopped instance keeps its key groups, and their records wait for it in the worker, at most this
# many times the function's receiverQueueSize; past that the router receives nothing more (every key waits) and
# the backlog stays on the broker, as Pulsar's maxUnackedMessagesPerConsumer stops delivery to a consumer.
STOPPED_WAIT_FACTOR = 100


def keyed_subscription_type(cfg) -> str:
    """A keyedState function's worker consumer: KEY_SHARED for retainKeyOrdering, else SHARED, whatever its
    processingGuarantees (Pulsar's FAILOVER for EFFECTIVELY_ONCE would give one worker every record; here
    exactly-once is per message id and key group in the store, functions/state/message_scope.py)."""
    return "KEY_SHARED" if cfg.retainKeyOrdering else "SHARED"


@dataclass
class RoutingCounters:
    received: int = 0  # records the dispatcher took from the input
    rerouted: int = 0  # records an instance handed back because their group had moved
    held: int = 0  # records that waited for a group in transit
    max_hold_s: float = 0.0  # longest wait of a held record


@dataclass
class _Mailbox:
    items: deque = field(default_factory=deque)
    in_hand: int | None = None  # the group of the record the instance is processing
    # The inputs attached for this instance id, oldest first; only the first takes. A restart starts the new
    # instance before the old one has finished its last record: the new one waits until the old one closed,
    # so a key's records are never processed by two threads at once, and the old one's close leaves the box.
    inputs: list = field(default_factory=list)


class KeyedRouter:
    """Ownership of key groups by the worker's instances, and the dispatch of records to them."""

    def __init__(
        self,
        assignment: KeyGroupAssignment,
        open_consumer: Callable[[], pulsar.Consumer],
        forward: Callable[[int, object], None] | None = None,
        queue_size: Callable[[], int] = lambda: DEFAULT_RECEIVER_QUEUE_SIZE,
    ):
        """`forward(instance_id, record)`: where records of instances without a mailbox here go (a cluster's
        front, functions/keyed/cluster.py); called under the router's lock, in receive order. `queue_size`: the
        function's receiverQueueSize. The mailboxes hold at most that many records per local instance, all
        together: the router receives no more until the instances have taken some, so a backlog stays on the
        broker, as it does for a consumer of its own, instead of in the worker's memory. Records waiting for a
        group in transit or an owner not here do not count (a migration never stops the other groups)."""
        self.assignment = assignment  # effective owners: changes group by group in a migration
        self.counters = RoutingCounters()
        self._open_consumer = open_consumer
        self._forward = forward
        self._queue_size = queue_size
        self._consumer: pulsar.Consumer | None = None
        self._boxes: dict[int, _Mailbox] = {}
        self._moving: set[int] = set()  # groups in transit: served by nobody
        self._held: dict[int, deque] = {}  # group in transit -> (record, since) waiting for it
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._dispatcher: threading.Thread | None = None

    @property
    def num_key_groups(self) -> int:
        return self.assignment.num_key_groups

    # ---- instances ---------------------------------------------------------------------------------
    def attach(self, instance_id: int) -> "KeyedInput":
        """The input of a local instance (its mailbox). The worker's consumer opens with the first one."""
        attached = KeyedInput(self, instance_id)
        with self._cond:
            self._boxes.setdefault(instance_id, _Mailbox()).inputs.append(attached)
            self._start()
            self._release_waiting_for_present_owners(time.monotonic())
        return attached

    def start(self) -> None:
        """Open the input with no local instance (a cluster's front forwards every record)."""
        with self._cond:
            self._start()

    def _start(self) -> None:
        if self._consumer is None:
            self._consumer = self._open_consumer()
            self._closing.clear()
            self._dispatcher = threading.Thread(target=self._dispatch, args=(self._consumer,), name="keyed-dispatch", daemon=True)
            self._dispatcher.start()

    def detach(self, attached: "KeyedInput") -> None:
        """An instance stopped: the instance id's next input (a restart) takes over its mailbox, else whatever
        waited there goes to the owners (re-routed); the consumer closes after the last instance."""
        with self._cond:
            box = self._boxes.get(attached.instance_id)
            if box is None or attached not in box.inputs:
                return
            box.inputs.remove(attached)
            box.in_hand = None
            self._cond.notify_all()
            if box.inputs:
                return
            del self._boxes[attached.instance_id]
            for item in box.items:
                self._place(item, rerouted=True)
            last = not self._boxes
        if last:
            self.close()

    def close(self, before_close: Callable[[], None] = lambda: None) -> None:
        """Close the input unless a local instance still takes from it: records held here go back to the
        broker, which redelivers them. `before_close` runs once nothing is received any more, with the
        consumer still open (a front flushes its forwards there, so their acks still go out)."""
        with self._cond:
            if self._boxes:
                return
            consumer, self._consumer = self._consumer, None
        if consumer is not None:
            self._closing.set()
            if self._dispatcher is not None:
                self._dispatcher.join(2 * RECEIVE_TIMEOUT_MS / 1000 + 1)
            before_close()
            with self._cond:  # records nobody can take any more: the broker redelivers them
                orphans = [m for q in self._held.values() for m, _ in q]
                self._held = {g: deque() for g in self._held}
            for msg in orphans:
                consumer.negative_acknowledge(msg)
            consumer.close()

    def _full(self) -> bool:
        """Under the lock: whether the mailboxes hold their share already (see __init__), or the records that
        wait for stopped instances their bound (STOPPED_WAIT_FACTOR)."""
        if self._boxes and sum(len(b.items) for b in self._boxes.values()) >= self._queue_size() * len(self._boxes):
            return True
        return sum(self._waiting_for_absent().values()) >= self._stopped_bound()

    def _stopped_bound(self) -> int:
        return STOPPED_WAIT_FACTOR * self._queue_size()

    def _waiting_for_absent(self) -> dict[int, int]:
        """Under the lock: instance id -> records held for it while it is not here (stopped, or starting)."""
        out: dict[int, int] = {}
        for g, queue in self._held.items():
            if queue and g not in self._moving:
                owner = self.assignment.owners[g]
                out[owner] = out.get(owner, 0) + len(queue)
        return out

    def waiting_for_absent(self) -> dict[int, int]:
        with self._cond:
            return self._waiting_for_absent()

    def _dispatch(self, consumer: pulsar.Consumer) -> None:
        paused = False
        while not self._closing.is_set():
            with self._cond:  # an instance's take, a detach or an attach wakes it
                ready = self._cond.wait_for(lambda: not self._full() or self._closing.is_set(), timeout=RECEIVE_TIMEOUT_MS / 1000)
                waiting = {} if ready or paused else self._waiting_for_absent()  # off the per-record path
            if ready and paused:
                paused = False
                log.info("keyed input resumed")
            if not ready:
                if sum(waiting.values()) >= self._stopped_bound():
                    paused = True
                    log.warning(
                        "keyed input paused: %d records wait for stopped instances %s (at most %d are held "
                        "in the worker); the rest stays on the broker until they start or the parallelism "
                        "is lowered",
                        sum(waiting.values()),
                        sorted(waiting),
                        self._stopped_bound(),
                    )
                continue
            try:
                msg = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
            except pulsar.Timeout:
                continue
            except pulsar.PulsarException as exc:  # the client reconnects by itself: keep receiving
                if self._closing.is_set():
                    return
                log.warning("keyed input: receive failed (%s); retrying", exc)
                self._closing.wait(RECEIVE_TIMEOUT_MS / 1000)
                continue
            with self._cond:
                self.counters.received += 1
                self._place(msg, rerouted=False)

    def _place(self, msg, rerouted: bool) -> None:
        """Under the lock: the record goes to its group's owner, or waits while the group is in transit."""
        g = message_group(msg, self.num_key_groups)
        if rerouted:
            self.counters.rerouted += 1
        if g in self._moving:
            self.counters.held += 1
            self._held.setdefault(g, deque()).append((msg, time.monotonic()))
            return
        owner = self.assignment.owners[g]
        box = self._boxes.get(owner)
        if box is None and self._forward is not None:
            self._forward(owner, msg)
            return
        if box is None:  # owned by an instance that is not here (yet): wait for it like a group in transit
            self.counters.held += 1
            self._held.setdefault(g, deque()).append((msg, time.monotonic()))
            return
        box.items.append(msg)
        self._cond.notify_all()

    # ---- acks on the one consumer ----------------------------------------------------------------------
    @property
    def input(self) -> pulsar.Consumer | None:
        """The consumer records come from now (a forward acks on the one its record came from)."""
        return self._consumer

    # An instance acks only records it took from its mailbox, and the consumer stays open while a mailbox is here
    # (close() returns early). An ack after the last instance detached (a late callback of an abandoned one) has no
    # consumer to go to: the record went back to the broker with the consumer it came from, which redelivers it.
    def acknowledge(self, msg) -> None:
        if (consumer := self._consumer) is not None:
            consumer.acknowledge(msg)
        else:
            log.debug("keyed input closed: a late ack is dropped; the broker redelivers its record")

    def negative_acknowledge(self, msg) -> None:
        if (consumer := self._consumer) is not None:
            consumer.negative_acknowledge(msg)

    # ---- what an instance takes ------------------------------------------------------------------------
    def take(self, attached: "KeyedInput", timeout_s: float):
        """The next record for the instance, or None after timeout_s. Records of groups it does not serve
        any more are re-routed on the way; the instance's previous record is done when it calls again."""
        instance_id = attached.instance_id
        deadline = time.monotonic() + timeout_s
        with self._cond:
            box = self._boxes.get(instance_id)
            if box is None or attached not in box.inputs:
                return None
            if box.inputs[0] is not attached:  # the instance it restarts has not closed yet
                self._cond.wait_for(
                    lambda: attached not in box.inputs or box.inputs[0] is attached, max(deadline - time.monotonic(), 0)
                )
                if not box.inputs or box.inputs[0] is not attached:
                    return None
            box.in_hand = None
            self._cond.notify_all()  # a migration may wait for this instance to put its group down
            while True:
                while box.items:
                    msg = box.items.popleft()
                    g = message_group(msg, self.num_key_groups)
                    if g in self._moving or self.assignment.owners[g] != instance_id:
                        self._place(msg, rerouted=True)
                        continue
                    box.in_hand = g
                    return msg
                left = deadline - time.monotonic()
                if left <= 0 or self._boxes.get(instance_id) is not box:
                    return None
                self._cond.wait(left)

    # ---- migration (functions/keyed/migration.py) -------------------------------------------------------------
    def stop_serving(self, groups: set[int]) -> None:
        """Trigger: nobody serves these groups from now; their records wait here, in order (those already
        in a mailbox first)."""
        with self._cond:
            self._moving |= set(groups)
            for box in self._boxes.values():
                keep: deque = deque()
                for msg in box.items:
                    g = message_group(msg, self.num_key_groups)
                    if g in groups:
                        self._held.setdefault(g, deque()).append((msg, time.monotonic()))
                        self.counters.held += 1
                    else:
                        keep.append(msg)
                box.items = keep

    def wait_put_down(self, groups: set[int], timeout_s: float) -> bool:
        """Wait until no instance is processing a record of these groups (their state is quiescent)."""
        with self._cond:
            return self._cond.wait_for(lambda: not any(b.in_hand in groups for b in self._boxes.values()), timeout=timeout_s)

    def serve(self, owners: dict[int, int]) -> None:
        """Confirm: the groups have their new owners (their state is open there); waiting records follow."""
        with self._cond:
            self.assignment = KeyGroupAssignment(
                self.num_key_groups, tuple(owners.get(g, o) for g, o in enumerate(self.assignment.owners))
            )
            self._moving -= set(owners)
            now = time.monotonic()
            for g in owners:
                waiting = self._held.pop(g, deque())
                for msg, since in waiting:
                    self.counters.max_hold_s = max(self.counters.max_hold_s, now - since)
                    self._place(msg, rerouted=False)
            self._release_waiting_for_present_owners(now)
            self._cond.notify_all()

    def _release_waiting_for_present_owners(self, now: float) -> None:
        """Records held because their owner was not attached yet go to it once it is."""
        for g in [g for g in self._held if g not in self._moving and self.assignment.owners[g] in self._boxes]:
            for msg, since in self._held.pop(g):
                self.counters.max_hold_s = max(self.counters.max_hold_s, now - since)
                self._place(msg, rerouted=False)

    def moving(self) -> set[int]:
        with self._cond:
            return set(self._moving)

    def attached(self) -> set[int]:
        with self._cond:
            return set(self._boxes)

    def groups_of(self, instance_id: int) -> set[int]:
        with self._cond:
            return set(self.assignment.groups_of(instance_id))


class KeyedInput:
    """What a keyed instance holds instead of a consumer (same methods as one): its mailbox."""

    def __init__(self, router: KeyedRouter, instance_id: int):
        self._router = router
        self.instance_id = instance_id
        self._closed = False

    def receive(self, timeout_millis: int):
        msg = self._router.take(self, timeout_millis / 1000)
        if msg is None:
            raise pulsar.Timeout()
        return msg

    def acknowledge(self, msg) -> None:
        self._router.acknowledge(msg)

    def negative_acknowledge(self, msg) -> None:
        self._router.negative_acknowledge(msg)

    def is_connected(self) -> bool:
        return True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._router.detach(self)
