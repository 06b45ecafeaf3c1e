"""A spread keyedState function's parts in one process (functions/keyed/cluster.py), driven as a cluster member
drives them: the front forwards records to the instances' route topics, a record forwarded twice applies once
under EFFECTIVELY_ONCE (deduped on the original message id), and scale 2 -> 3 -> 2 migrates groups through
RELEASE/OPEN markers with exact counts."""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass

import pulsar
import pytest

from pulsar_autoscale.functions.keyed.cluster import (
    ClusterKeyed,
    SavedAssignment,
    read_assignment,
    read_saved,
    save_assignment,
)
from pulsar_autoscale.functions.keyed.migration import MigrationError
from pulsar_autoscale.functions.keyed.protocol import ANNOUNCE, OP, ORIGINAL_ID, FrontMarkers, KeyedTopics
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.model.errors import NotFound
from pulsar_autoscale.functions.worker.worker import Worker
from tests.support.scenario import EXAMPLES, wait_until

KEYS, PER_KEY = 20, 10


def _counts(worker: Worker, fqfn: str) -> dict[str, int]:
    out = {}
    for k in range(KEYS):
        try:
            out[f"k{k}"] = worker.state_store(fqfn, f"k{k}").for_key(f"k{k}").get_counter(f"k{k}")
        except NotFound:
            out[f"k{k}"] = -1
    return out


def _send(producer: pulsar.Producer, n: int) -> None:
    for i in range(n):
        producer.send_async(b"x", None, partition_key=f"k{i % KEYS}")
    producer.flush()


def _keyed_count(worker: Worker, tmp_path, prefix: str) -> tuple[FunctionConfig, str, str]:
    """A keyed count at parallelism 2 over 16 groups, hosted here with its front: (config, code path, input)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    code = shutil.copy(EXAMPLES / "keyed_count.py", tmp_path / "keyed_count.py")
    cfg = FunctionConfig.from_dict(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "keyed_count.KeyedCount",
            "inputs": [src],
            "parallelism": 2,
            "keyedState": True,
            "processingGuarantees": "EFFECTIVELY_ONCE",
            "subscriptionPosition": "Earliest",
            "numKeyGroups": 16,
        }
    )
    worker.host_instances(cfg, str(code), {0, 1}, front=True)
    return cfg, str(code), src


def _half_counted(worker: Worker, cfg: FunctionConfig, producer: pulsar.Producer) -> None:
    _send(producer, KEYS * PER_KEY // 2)
    wait_until(
        lambda: sum(_counts(worker, cfg.fqfn).values()) == KEYS * PER_KEY // 2,
        30,
        lambda: f"half the records counted: {_counts(worker, cfg.fqfn)}",
    )


def test_forwarding_dedupe_and_migration_through_route_topics(broker, client, tmp_path):
    worker = Worker(broker.service_url, str(tmp_path / "w"), broker_kind="pulsar-lite")
    worker.keyed_spread = True
    try:
        cfg, code, src = _keyed_count(worker, tmp_path, "kr")
        topics = KeyedTopics.of(cfg)
        probe = client.subscribe(topics.route(1), "probe", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(src, block_if_queue_full=True)
        _half_counted(worker, cfg, producer)

        # a front that forwarded a record, died before the input ack and forwarded it again
        forwarded = probe.receive(5000)
        if forwarded.properties().get(OP) == ANNOUNCE:  # the front's epoch comes first
            forwarded = probe.receive(5000)
        assert ORIGINAL_ID in forwarded.properties(), (forwarded.properties(), forwarded.data())
        client.create_producer(topics.route(1)).send(
            forwarded.data(), properties=forwarded.properties(), partition_key=forwarded.partition_key()
        )

        worker.host_instances(FunctionConfig.from_dict({**cfg.to_dict(), "parallelism": 3}), code, {0, 1, 2}, front=True)
        wait_until(lambda: worker.keyed_holds_groups(cfg.fqfn, 2), 30, "instance 2 given key groups (OPEN)")
        _send(producer, KEYS * PER_KEY // 2)
        worker.host_instances(cfg, code, {0, 1, 2}, front=True)  # the surplus stays while it holds groups
        wait_until(lambda: not worker.keyed_holds_groups(cfg.fqfn, 2), 30, "instance 2's groups moved off (RELEASE)")
        worker.host_instances(cfg, code, {0, 1}, front=True)
        expected = {f"k{k}": PER_KEY for k in range(KEYS)}
        wait_until(
            lambda: _counts(worker, cfg.fqfn) == expected,
            30,
            lambda: f"exact counts (the duplicate applied once): {_counts(worker, cfg.fqfn)}",
        )
        wait_until(
            lambda: set(getattr(read_assignment(client, topics.assignment), "owners", ())) == {0, 1},
            30,
            lambda: f"the saved assignment without instance 2: {read_assignment(client, topics.assignment)}",
        )
    finally:
        worker.close()


def test_a_front_started_again_while_the_last_one_closes(broker, client, tmp_path, caplog):
    """The front leaves this worker and comes back at once (`functions stop`, then an instance added or
    `functions start`, within a second: the member reconciles twice while the first front still closes in the
    background). The new front must keep its own input and its answer listener: before, the closing front
    closed both, so no record was forwarded any more and a migration waited for ever for its answers."""
    worker = Worker(broker.service_url, str(tmp_path / "w"), broker_kind="pulsar-lite")
    worker.keyed_spread = True
    caplog.set_level(logging.INFO, logger="pulsar_autoscale.functions.keyed.cluster")
    try:
        cfg, code, src = _keyed_count(worker, tmp_path, "kf")
        producer = client.create_producer(src, block_if_queue_full=True)
        _half_counted(worker, cfg, producer)
        worker.host_instances(cfg, code, {0, 1}, front=False)  # the front closes, in the background
        worker.host_instances(cfg, code, {0, 1}, front=True)  # and starts again before it has closed
        wait_until(lambda: f"{cfg.name}: the front that ran here closed" in caplog.text, 30, "the first front closed")
        worker.host_instances(FunctionConfig.from_dict({**cfg.to_dict(), "parallelism": 3}), code, {0, 1, 2}, front=True)
        wait_until(
            lambda: worker.keyed_holds_groups(cfg.fqfn, 2),
            30,
            "instance 2 given key groups: the new front heard the answers to its markers",
        )
        _send(producer, KEYS * PER_KEY // 2)
        wait_until(
            lambda: _counts(worker, cfg.fqfn) == {f"k{k}": PER_KEY for k in range(KEYS)},
            30,
            lambda: f"exact counts: the new front forwards every record: {_counts(worker, cfg.fqfn)}",
        )
    finally:
        worker.close()


@dataclass
class _Fronted:
    """A spread keyedState function on one worker, half counted: its front's saved assignment and its part."""

    worker: Worker
    cfg: FunctionConfig
    topics: KeyedTopics
    current: SavedAssignment
    keyed: ClusterKeyed

    def groups_of(self, instance_id: int) -> set[int]:
        return {g for g, owner in enumerate(self.current.assignment.owners) if owner == instance_id}


@pytest.fixture
def fronted(broker, client, tmp_path):
    worker = Worker(broker.service_url, str(tmp_path / "w"), broker_kind="pulsar-lite")
    worker.keyed_spread = True
    try:
        cfg, _code, src = _keyed_count(worker, tmp_path, "ks")
        _half_counted(worker, cfg, client.create_producer(src, block_if_queue_full=True))
        topics = KeyedTopics.of(cfg)
        current = read_saved(client, topics.assignment)
        assert current is not None and current.epoch >= 1, current
        keyed = worker._functions[cfg.fqfn].keyed
        assert isinstance(keyed, ClusterKeyed)
        assert worker.keyed_holds_groups(cfg.fqfn, 1), "instance 1 holds key groups before any stale release"
        yield _Fronted(worker, cfg, topics, current, keyed)
    finally:
        worker.close()


def test_a_stale_fronts_markers_and_saves_are_refused(client, fronted):
    """A front frozen during its migration wakes after another front took over (a higher epoch, announced to
    every instance): its RELEASE is refused with an error answer and the instance keeps its groups, and the
    assignment it saves loses to the newer front's."""
    current = fronted.current
    stale = FrontMarkers(fronted.keyed.stores, current.epoch - 1)
    with pytest.raises(MigrationError, match="stale front"):
        stale.release_all({1: fronted.groups_of(1)})
    assert fronted.worker.keyed_holds_groups(fronted.cfg.fqfn, 1), "the stale front's RELEASE was carried out"

    moved = type(current.assignment)(current.assignment.num_key_groups, (0,) * current.assignment.num_key_groups)
    producer = client.create_producer(fronted.topics.assignment)
    save_assignment(producer, moved, current.epoch - 1)
    producer.close()
    assert read_assignment(client, fronted.topics.assignment) == current.assignment, "a stale front's save won"


@pytest.mark.parametrize("stale_announcement", [False, True], ids=["release-first", "stale-announcement-first"])
def test_an_input_that_missed_the_announcement_checks_the_saved_epoch_before_a_release(client, fronted, stale_announcement):
    """An instance that replaced a frozen one may never hear the newer front's announcement (the frozen consumer
    of its route topic holds it). Until it hears one, its first marker is checked against the saved assignment's
    epoch: a newer front's save is enough to refuse the frozen front's RELEASE when it wakes. The first marker may
    be the frozen front's own announcement, redelivered from the frozen consumer's backlog: it must not count as
    the newest."""
    current, keyed = fronted.current, fronted.keyed
    instance1 = next(i for i in keyed._inputs if i._id == 1)
    instance1._saved_epoch = keyed._saved_epoch  # as if it had opened on another worker than the front's
    producer = client.create_producer(fronted.topics.assignment)
    save_assignment(producer, current.assignment, current.epoch + 1)  # a newer front, its announcement lost
    producer.close()
    if stale_announcement:
        keyed.stores.announce(current.epoch, {1})
    with pytest.raises(MigrationError, match="stale front"):
        FrontMarkers(keyed.stores, current.epoch).release_all({1: fronted.groups_of(1)})
    assert fronted.worker.keyed_holds_groups(fronted.cfg.fqfn, 1), "the frozen front's RELEASE was carried out"


@pytest.mark.parametrize("spread", [True, False], ids=["route-topics", "one-worker-mailboxes"])
def test_a_record_an_instance_keeps_failing_on_is_dead_lettered_after_max_message_retries(broker, client, tmp_path, spread):
    """On a cluster the front acks the input once a record is forwarded, so retries and the dead-letter topic
    apply on the route topic; on one worker on the input itself, through the router's one consumer. Either way:
    maxMessageRetries redeliveries, then the function's dead-letter topic."""
    worker = Worker(broker.service_url, str(tmp_path / "w"), broker_kind="pulsar-lite")
    worker.keyed_spread = spread
    try:
        name = f"kp-{uuid.uuid4().hex[:6]}"
        src, dlq = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-dlq"
        code = shutil.copy(EXAMPLES / "poison.py", tmp_path / "poison.py")
        cfg = FunctionConfig.from_dict(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "poison.Poison",
                "inputs": [src],
                "parallelism": 2,
                "keyedState": True,
                "maxMessageRetries": 2,
                "deadLetterTopic": dlq,
                "subscriptionPosition": "Earliest",
                "numKeyGroups": 16,
            }
        )
        dead = client.subscribe(dlq, "test", initial_position=pulsar.InitialPosition.Earliest)
        if spread:
            worker.host_instances(cfg, str(code), {0, 1}, front=True)
        else:
            worker.create(cfg, code.read_bytes(), "poison.py")
        producer = client.create_producer(src, block_if_queue_full=True)
        producer.send(b"poison", partition_key="p")
        producer.send(b"fine", partition_key="p")
        msg = dead.receive(30_000)
        assert msg.data() == b"poison"
        deliveries = worker.state_store(cfg.fqfn, "p").for_key("p").get_counter("deliveries:poison")
        assert deliveries == 3, f"{deliveries} deliveries: 1 + maxMessageRetries 2"
    finally:
        worker.close()
