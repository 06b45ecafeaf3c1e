"""Consumer-id floors (B2 between clients, B14): every client incarnation gets ids no other live client uses.

pulsar-lite tracks consumer ids per subscription, not per connection, and every client numbers its
consumers from 0, so a second client joining a subscription collides (B2). Every client that consumes
next to other clients (a worker incarnation, a second worker, the burst drain's driver) is an
`incarnation_client`: its consumer ids start at a floor of its own. Padding to the floor happens under
one subscription per slot, since pulsar-lite never forgets a subscription name (B14).

Tests: tests/integration/broker_conformance/test_incarnations.py (processes joining and leaving, one
padding subscription per slot, a join that times out), tests/system/spark/test_burst.py::test_repeated_lite_joins_lose_nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

import pulsar

from pulsar_autoscale.broker.profile import LITE, BrokerProfile
from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.pulsar_client import ClientSettings, open_client

log = logging.getLogger(__name__)

# A floor is a block of consumer ids: slot k's client numbers its consumers from k * ID_BLOCK.
ID_BLOCK = 1024
MAX_SLOTS = 16
PROBE_BATCH = 4
SETTLE_S = 0.05
SLOT_TOPIC = "persistent://public/default/__pulsar_autoscale_idslot-{}"
SLOT_SUBSCRIPTION = "holder"
# A join's client: the worker's timeout (functions/worker/worker.py). A 5 s one, left from a design that retried
# id collisions, was passed by padding under load (docs/spark-burst.md).
JOIN_OPERATION_TIMEOUT_S = 30
JOIN_ATTEMPTS = 3


class LiteJoinError(PulsarAutoscaleError):
    """A client could not get consumer ids of its own, or could not join with them: says which step failed."""


class _SlotLock:
    """Slot k is held by an Exclusive subscription on its own client, as the controller's leader lock.

    The broker frees it the moment the holder's connection ends (close, exit or kill -9; through
    the embedded broker's relay a kill -9 is a clean close too, B10), and with it the holder's
    consumers: a freed slot's ids are free. A refused subscribe drops that client's connection
    (B3), so each probe has a client of its own with a 1 s operation timeout.
    """

    def __init__(self, settings: ClientSettings | str, slot: int):
        self.slot = slot
        self._client = open_client(settings, operation_timeout_seconds=1)
        try:
            self._client.subscribe(
                SLOT_TOPIC.format(slot), SLOT_SUBSCRIPTION, consumer_type=pulsar.ConsumerType.Exclusive, receiver_queue_size=1
            )
        except pulsar.PulsarException:
            self._client.close()
            raise

    def release(self) -> None:
        try:
            self._client.close()
        except pulsar.PulsarException:
            pass


def _take_slot(settings: ClientSettings | str) -> _SlotLock:
    """A free slot, probing PROBE_BATCH slots at a time in parallel: a held one only answers after
    its 1 s timeout, so we take the lowest slot acquired within SETTLE_S of the first success
    (and release the others, late ones included)."""
    for first in range(0, MAX_SLOTS, PROBE_BATCH):
        results: queue.Queue = queue.Queue()

        def probe(k: int) -> None:
            try:
                results.put(_SlotLock(settings, k))
            except pulsar.PulsarException:
                results.put(None)

        for k in range(first, first + PROBE_BATCH):
            threading.Thread(target=probe, args=(k,), daemon=True).start()
        got: list[_SlotLock] = []
        answered = 0
        while answered < PROBE_BATCH:
            try:
                lock = results.get(timeout=SETTLE_S if got else None)
            except queue.Empty:
                break
            answered += 1
            if lock is not None:
                got.append(lock)
        if got:
            got.sort(key=lambda lock: lock.slot)
            for extra in got[1:]:
                extra.release()
            threading.Thread(target=_release_late, args=(results, PROBE_BATCH - answered), daemon=True).start()
            return got[0]
    raise LiteJoinError(
        f"no consumer-id floor could be taken: all {MAX_SLOTS} slot locks "
        f"({SLOT_TOPIC.format('*')}) refused or did not answer within 1 s (held by live clients, "
        "or the broker is that slow)"
    )


def _release_late(results: queue.Queue, pending: int) -> None:
    for _ in range(pending):
        lock = results.get()
        if lock is not None:
            lock.release()


class IncarnationClient(pulsar.Client):
    """A pulsar.Client whose consumer ids start at its incarnation's floor; close() frees the floor."""

    floor: int = 0
    _slot: _SlotLock | None = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._slot is not None:
                self._slot.release()
                self._slot = None


def incarnation_client(settings: ClientSettings | str, broker: BrokerProfile, **client_kwargs) -> IncarnationClient:
    """A client for one incarnation of a worker, a drain or any other process that consumes a Shared
    subscription next to others (B2): where the broker needs it (pulsar-lite) its consumer ids start at a
    floor that no live client on the broker uses; on Apache Pulsar it is a plain client (floor 0).

    pulsar-lite tracks consumer ids per subscription, not per connection, and every client numbers its
    consumers from 0. The floor comes from the lowest free slot lock (_SlotLock), held until close();
    the client's id counter is moved to it by padding (_pad_consumer_ids: about 0.4 s per 1024 ids,
    so slot 0, the first client, costs nothing). A client that opens more than ID_BLOCK consumers in
    its life walks into the next slot's ids (docs/dev/pulsar-lite-defects.md, "Consumer-id floors").
    """
    slot = _take_slot(settings) if broker.consumer_id_floors else None
    try:
        client = open_client(settings, client_class=IncarnationClient, **client_kwargs)
    except Exception:
        if slot is not None:
            slot.release()
        raise
    client._slot = slot
    if slot is not None:
        client.floor = slot.slot * ID_BLOCK
        subscription = PAD_SUBSCRIPTION.format(slot.slot)
        try:
            _pad_consumer_ids(client, client.floor, subscription)
        except pulsar.PulsarException as exc:
            client.close()
            raise LiteJoinError(
                f"moving this client's consumer ids to its floor {client.floor} (slot {slot.slot}: "
                f"subscribes as {subscription} on {PAD_TOPIC.format('*')}) failed: "
                f"{type(exc).__name__} {exc}"
            ) from exc
        except Exception:
            client.close()
            raise
        log.info("pulsar-lite: consumer ids of this client start at %d (slot %d)", client.floor, slot.slot)
    return client


def join_shared_subscription(
    settings: ClientSettings | str,
    subscribe: Callable[[pulsar.Client], pulsar.Consumer],
    what: str,
    operation_timeout_s: int = JOIN_OPERATION_TIMEOUT_S,
    attempts: int = JOIN_ATTEMPTS,
) -> tuple[pulsar.Client, pulsar.Consumer]:
    """A second client on a Shared subscription (the burst drain's driver) on pulsar-lite: an
    incarnation client, so its consumer ids differ from every other live client's. Returns
    (client, consumer); closing the client frees its floor. `what` names the subscription in errors.

    A join that times out (a slot probe, the padding or the subscribe, under CPU load) is retried on a
    fresh client, `attempts` in all; then LiteJoinError says which step of `what` timed out.

    tests/system/spark/test_burst.py counts every message of repeated joins next to a consuming instance, and
    tests/integration/broker_conformance/test_incarnations.py N processes joining and leaving.
    """
    for attempt in range(1, attempts + 1):
        try:
            client = incarnation_client(settings, LITE, operation_timeout_seconds=operation_timeout_s)
        except LiteJoinError as exc:
            error = exc
        else:
            try:
                return client, subscribe(client)
            except pulsar.Timeout as exc:
                error = LiteJoinError(
                    f"subscribing (consumer ids from {client.floor}) timed out after {operation_timeout_s} s ({exc})"
                )
                client.close()
            except Exception:
                client.close()
                raise
        if attempt < attempts:
            log.warning("pulsar-lite: %s, attempt %d of %d: %s; retrying on a fresh client", what, attempt, attempts, error)
    raise LiteJoinError(f"pulsar-lite: {what}: {attempts} attempts failed, the last: {error}")


# The scratch topics that padding subscribes to, and the subscription of slot k on them.
PAD_TOPIC = "persistent://public/default/__burst-idpad-{}"
PAD_SUBSCRIPTION = "__idpad-slot{}"


def _pad_consumer_ids(client: pulsar.Client, count: int, subscription: str, chunk: int = 256) -> None:
    """Use up `count` consumer ids of `client`: subscribe to scratch topics, then unsubscribe.

    `subscription` is the slot's own (PAD_SUBSCRIPTION): pulsar-lite never forgets a subscription name
    (B14: its series stay, and creating a new one slows as they pile up), so a fresh name per client
    added 256 at every join, and padding slowed with them (1.7 s to 5.3 s over 12 joins under load)
    until a subscribe passed the drain's 5 s operation timeout. One name per slot bounds them to 256
    per slot; only the slot's holder pads on it, so two paddings never share consumer ids on it (B2).
    """
    done = 0
    while done < count:
        n = min(chunk, count - done)
        pad = client.subscribe(
            [PAD_TOPIC.format(i) for i in range(n)], subscription, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1
        )
        try:
            pad.unsubscribe()
        except pulsar.PulsarException:
            pad.close()
        done += n
