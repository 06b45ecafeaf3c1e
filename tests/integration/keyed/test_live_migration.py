"""keyedState on one worker: records reach the owner of their key group; a parallelism change moves only the
groups that must move, in subscales, and no key is lost, counted twice or processed by two instances at once."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.model.keygroups import key_group
from pulsar_autoscale.functions.worker.worker import Worker
from tests.support.scenario import EXAMPLES, KEYED_COUNT, OutputCollector, keyed_count, wait_until

KEYS = [f"k{i}" for i in range(200)]


@pytest.fixture(scope="module")
def worker(broker, tmp_path_factory):
    w = Worker(broker.service_url, str(tmp_path_factory.mktemp("keyed")), broker_kind="pulsar-lite")
    yield w
    w.close()


def _create(worker: Worker, name: str, src: str, dst: str, parallelism: int) -> FunctionConfig:
    cfg = FunctionConfig.from_dict(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "keyed_count.KeyedCount",
            "inputs": [src],
            "output": dst,
            "parallelism": parallelism,
            "keyedState": True,
        }
    )
    return worker.create(cfg, (EXAMPLES / "keyed_count.py").read_bytes(), "keyed_count.py")


def test_scale_out_and_in_moves_only_what_must_move_and_counts_exactly(broker, worker, client):
    name = f"kc-{uuid.uuid4().hex[:6]}"
    src, dst = f"persistent://public/default/{name}-in", f"persistent://public/default/{name}-out"
    collector = OutputCollector(client, dst)
    cfg = _create(worker, name, src, dst, 2)
    fn = worker._functions[cfg.fqfn]
    wait_until(lambda: fn.keyed.router.attached() == {0, 1}, 30, "2 keyed instances attached")
    producer = client.create_producer(src, batching_enabled=True, batching_max_publish_delay_ms=2, block_if_queue_full=True)
    sent = 0
    stop = threading.Event()

    def produce():
        nonlocal sent
        while not stop.is_set():
            for k in KEYS:
                producer.send_async(b"x", None, partition_key=k)
                sent += 1
            time.sleep(0.2)  # 1,000 records/s
        producer.flush()

    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    try:
        wait_until(lambda: collector.distinct() > 1000, 30, "outputs flowing")
        for target in (3, 2):
            worker.update(cfg.fqfn, {"parallelism": target})
            assert fn.keyed.idle(60), f"migration to {target} did not finish: {fn.keyed.failure}"
            assert not fn.keyed.failure
            before = collector.distinct()
            wait_until(
                lambda: collector.distinct() > before + 500,
                30,
                lambda: f"outputs after the change to {target} (router {fn.keyed.router.counters})",
            )
    finally:
        stop.set()
        sender.join(10)
    wait_until(lambda: collector.distinct() >= sent, 60, lambda: f"all {sent} outputs (got {collector.distinct()})")
    reports = [r for r in fn.keyed.reports if r.moved_groups]
    # 128 groups, 2 -> 3: 42 groups move (128/3 rounded), 3 -> 2: the 42 of instance 2 move back.
    assert [r.moved_groups for r in reports] == [42, 42]
    assert all(r.subscales == 11 for r in reports)  # ceil(42 / 4)
    per_key: dict[str, list[tuple[int, int]]] = {}
    for payload in collector.counts:
        key, count, instance = payload.decode().split(":")
        per_key.setdefault(key, []).append((int(count), int(instance)))
    assert collector.duplicates() == 0
    owners = fn.keyed.router.assignment.owners
    for key, seen in per_key.items():
        counts = sorted(c for c, _ in seen)
        assert counts == list(range(1, len(counts) + 1)), f"key {key}: counts {counts[:10]}... not 1..n"
        last = max(seen)[1]
        assert last == owners[key_group(key, 128)], f"key {key} last counted by {last}, owner is {owners[key_group(key, 128)]}"
    view = worker.keyed_view(cfg.fqfn)
    assert view["groupsPerInstance"] == {"0": 64, "1": 64} and not view["migrating"] and "failure" not in view
    assert view["lastMigration"]["movedGroups"] == 42
    stats = fn.keyed.router.counters
    print(
        f"\nsent {sent}, reports {[(r.moved_groups, r.subscales, round(r.duration_s, 3)) for r in reports]}, "
        f"held {stats.held}, rerouted {stats.rerouted}, longest hold {stats.max_hold_s * 1000:.1f} ms"
    )
    collector.close()
    producer.close()
    worker.delete(cfg.fqfn)


def test_a_backlog_stays_on_the_broker_not_in_the_mailboxes(broker, worker, client):
    """The router takes at most receiverQueueSize records per instance into its mailboxes, as a consumer of the
    instance's own would buffer: before, it received a whole backlog into the worker's memory at once."""
    name = f"kb-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    producer = client.create_producer(src, batching_enabled=True, block_if_queue_full=True)
    for i in range(1000):
        producer.send_async(b"x", None, partition_key=f"k{i % 50}")
    producer.flush()
    cfg = worker.create(
        FunctionConfig.from_dict(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "sleepy.Sleepy",
                "inputs": [src],
                "parallelism": 2,
                "keyedState": True,
                "subscriptionPosition": "Earliest",
                "inputSpecs": {src: {"receiverQueueSize": 50}},
                "userConfig": {"service_ms": 5, "dist": "deterministic"},
            }
        ),
        (EXAMPLES / "sleepy.py").read_bytes(),
        "sleepy.py",
    )
    fn = worker._functions[cfg.fqfn]
    router = fn.keyed.router
    processed = lambda: sum(h.figures().processed for h in list(fn.instances.values()))  # noqa: E731
    peak, deadline = 0, time.monotonic() + 60
    while processed() < 1000:  # sampled while the 1,000 records (2.5 s of work for 2 instances) are processed
        assert time.monotonic() < deadline, f"only {processed()} of 1000 processed within 60 s"
        with router._cond:
            peak = max(peak, sum(len(b.items) for b in router._boxes.values()))
        assert peak <= 2 * 50, (
            f"{peak} records in the mailboxes of 2 instances with receiverQueueSize 50 "
            f"({router.counters.received} of 1000 received): the backlog came in"
        )
        time.sleep(0.02)
    assert peak >= 50, f"the mailboxes never filled ({peak}): the test saw no backlog"
    producer.close()
    worker.delete(cfg.fqfn)


def test_a_stopped_instances_records_wait_in_the_worker_only_up_to_a_bound(broker, worker, client):
    """A stopped instance keeps its groups and their records wait for it, in the worker's memory up to
    STOPPED_WAIT_FACTOR x receiverQueueSize records; past that the router receives nothing more and the rest stays
    on the broker (before, a stopped instance's records came into the worker's memory without end). Status says
    how many wait; started again, the instance takes them all and every count is exact."""
    from pulsar_autoscale.functions.keyed.routing import STOPPED_WAIT_FACTOR

    name = f"ks-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    queue, keys, per_key = 2, 40, 50
    bound = STOPPED_WAIT_FACTOR * queue
    cfg = worker.create(
        FunctionConfig.from_dict(keyed_count(name, src, parallelism=2, inputSpecs={src: {"receiverQueueSize": queue}})),
        KEYED_COUNT.read_bytes(),
        "keyed_count.py",
    )
    fn = worker._functions[cfg.fqfn]
    router = fn.keyed.router
    wait_until(lambda: router.attached() == {0, 1}, 30, "2 keyed instances attached")
    worker.set_running(cfg.fqfn, False, 1)
    wait_until(lambda: router.attached() == {0}, 30, "instance 1 stopped")
    stopped_keys = {f"k{k}" for k in range(keys) if router.assignment.owners[key_group(f"k{k}", 128)] == 1}
    assert len(stopped_keys) * per_key > bound, f"the test sends too few records of instance 1's keys to pass {bound}"
    producer = client.create_producer(src, batching_enabled=True, block_if_queue_full=True)
    for i in range(keys * per_key):
        producer.send_async(b"x", None, partition_key=f"k{i % keys}")
    producer.flush()
    waiting = lambda: fn.keyed.view().get("waitingForStoppedInstances", {}).get("1", 0)  # noqa: E731
    wait_until(lambda: waiting() >= bound, 60, lambda: f"{bound} records held for instance 1, saw {waiting()}")
    seen = [router.counters.received]

    def stopped_receiving() -> bool:
        """The count of received records unchanged over 0.5 s with the bound held: records of the running
        instance may still arrive between reaching the bound and the router's pause taking hold."""
        seen.append(router.counters.received)
        return waiting() == bound and seen[-1] == seen[-2]

    wait_until(
        stopped_receiving, 10, lambda: f"the router to stop receiving at {bound} held (received {seen[-1]})", interval_s=0.5
    )
    assert seen[-1] < keys * per_key, "the whole backlog came into the worker"
    worker.set_running(cfg.fqfn, True, 1)
    state = lambda k: worker.state_store(cfg.fqfn, k).get_counter(k)  # noqa: E731
    wait_until(
        lambda: all(state(f"k{k}") == per_key for k in range(keys)),
        60,
        lambda: f"{per_key} per key: { ({f'k{k}': state(f'k{k}') for k in range(keys)}) }",
    )
    assert "waitingForStoppedInstances" not in fn.keyed.view()
    producer.close()
    worker.delete(cfg.fqfn)
