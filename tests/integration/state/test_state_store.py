"""The key-grouped store and its changelog on a real pulsar-lite broker: restore, release/open, EFFECTIVELY_ONCE."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pulsar
import pytest

from pulsar_autoscale.broker.lite.readers import MIN_READER_QUEUE
from pulsar_autoscale.functions.model.keygroups import key_group
from pulsar_autoscale.functions.state.changelog import (
    COUNTER,
    PACED_READER_BYTES,
    PACED_READER_QUEUE,
    Changelog,
    ChangelogWriter,
    ReadStats,
    Record,
    read_changelog,
)
from pulsar_autoscale.functions.state.groups import NONE_KEY
from pulsar_autoscale.functions.state.store import NotOwnedError, StateRemovedError, StateStore

G = 16


@pytest.fixture(params=[1, 4], ids=["one-topic", "4-shards"])
def changelog(request):
    """Every test here runs on a changelog of one topic and on one split in 4 shards of G/4 groups."""
    return Changelog(f"persistent://public/default/__state-t{uuid.uuid4().hex[:10]}-changelog", request.param, G)


def store(tmp_path, client, changelog, name="a", owned=None) -> StateStore:
    s = StateStore(tmp_path / name / "state.sqlite", G, owned)
    s.attach_changelog(client, changelog)
    return s


def process(s: StateStore, key: str, updates, msg_id: str | None = None) -> bool:
    """What an instance does for one message: its state calls in its key's group, commit, flush."""
    view = s.for_key(key)
    if not s.begin(view.group, msg_id):
        return False
    for verb, *args in updates:
        getattr(view, verb)(*args)
    s.commit()
    s.flush()
    return True


def contents(s: StateStore) -> dict:
    return s.rows()


def test_a_restore_from_the_changelog_gives_the_same_state(tmp_path, client, changelog):
    a = store(tmp_path, client, changelog)
    for i in range(300):
        process(a, f"k{i % 37}", [("incr_counter", f"c{i % 11}", 1 + i % 3), ("put_state", f"s{i % 5}", f"v{i}")])
    process(a, "k1", [("del_counter", "c1")])
    a.put_state("rest-key", b"\xff\x00")  # a write outside a message (REST putstate)
    a.set_counter("rest-counter", 41)
    b = store(tmp_path, client, changelog, "b")
    stats = b.open(set(range(G)))
    assert contents(b) == contents(a) and contents(a)
    assert b.get_state("rest-key") == b"\xff\x00" and b.get_counter("rest-counter") == 41
    assert b.for_key("k1").get_counter("c1") == 0
    assert stats.records >= 600 and stats.bytes > 0 and stats.from_snapshot == 0


def test_release_snapshots_and_open_replays_only_the_tail(tmp_path, client, changelog):
    a = store(tmp_path, client, changelog)
    for i in range(200):
        process(a, f"k{i}", [("incr_counter", "n", 1)])
    groups = {key_group("k7", G), key_group("k8", G)}
    before = {g: a.group(g).get_counter("n") for g in groups}
    a.release(groups)
    assert a.owned() == set(range(G)) - groups
    with pytest.raises(NotOwnedError):
        a.for_key("k7").get_counter("n")
    b = store(tmp_path, client, changelog, "b", owned=set())  # the new owner: full replay
    b.open(groups)
    assert {g: b.group(g).get_counter("n") for g in groups} == before
    process(b, "k7", [("incr_counter", "n", 100)])
    b.release(groups)
    stats = a.open(groups)  # back: snapshot + the tail after it
    assert stats.from_snapshot == len(groups) and stats.records == 1
    assert a.for_key("k7").get_counter("n") == before[key_group("k7", G)] + 100


def test_an_open_brings_the_other_pre_copied_groups_up_to_now(tmp_path, client, changelog):
    """Subscales open pre-copied groups one batch after another while the old owner keeps changing the rest:
    each open refreshes the groups still to come, so the next open reads only what came since."""
    a = store(tmp_path, client, changelog)
    g1, g2 = key_group("k1", G), key_group("k2", G)
    b = store(tmp_path, client, changelog, "b", owned=set())
    b.prepare({g1, g2}, client, changelog)
    for i in range(20):  # both change after the pre-copy
        process(a, "k1", [("incr_counter", "n", 1)])
        process(a, "k2", [("incr_counter", "n", 1)])
    a.release({g1})
    first = b.open({g1}, refresh={g2})
    assert first.records == 40, first  # one read for both groups' tails
    process(a, "k2", [("incr_counter", "n", 5)])
    a.release({g2})
    second = b.open({g2})
    assert second.from_snapshot == 1 and second.records == 1, second  # only what came after the first open
    assert b.for_key("k1").get_counter("n") == 20 and b.for_key("k2").get_counter("n") == 25


def test_groups_released_at_different_positions_open_in_one_pass(tmp_path, client, changelog):
    """One read from the oldest position; a group's records at or before its own position are skipped (its
    file has them), so a group released later is not set back by older records."""
    a = store(tmp_path, client, changelog)
    g1, g2 = key_group("k1", G), key_group("k2", G)
    assert g1 != g2
    process(a, "k1", [("incr_counter", "n", 1)])
    process(a, "k2", [("put_state", "s", "old")])
    a.release({g1})  # position P1
    b = store(tmp_path, client, changelog, "b", owned=set())
    b.open({g1})
    process(b, "k1", [("incr_counter", "n", 10)])
    b.release({g1})
    process(a, "k2", [("put_state", "s", "new")])
    a.release({g2})  # position P3, after P1
    stats = a.open({g1, g2})
    assert stats.from_snapshot == 2 and stats.records == 2, stats  # b's change and k2's "new", read once
    assert a.for_key("k1").get_counter("n") == 11 and a.for_key("k2").get_state("s") == b"new"


def test_a_pre_copied_group_opens_from_its_copy_and_replays_only_what_changed_since(tmp_path, client, changelog):
    """A live migration to another worker pre-copies the moving groups (the whole changelog, while the old
    owner still serves them); the open at hand-over then reads only the changes made after the copy."""
    a = store(tmp_path, client, changelog)
    for i in range(300):
        process(a, f"k{i % 50}", [("incr_counter", "n", 1), ("put_state", "s", f"v{i}")], msg_id=f"m{i}")
    groups = {key_group("k7", G), key_group("k8", G)}
    b = store(tmp_path, client, changelog, "b", owned=set())  # another worker's disk
    copied = b.prepare(groups, client, changelog)
    assert copied.records == 2 * in_shards(changelog, groups, [f"k{i % 50}" for i in range(300)]), copied
    assert copied.from_snapshot == 0 and b.owned() == set()
    process(a, "k7", [("incr_counter", "n", 100)], msg_id="late")  # still served by a after the copy
    expected = {g: a.group(g).get_counter("n") for g in groups}
    value = a.for_key("k8").get_state("s")
    a.release(groups)
    stats = b.open(groups)
    assert stats.from_snapshot == len(groups) and stats.records == 1, stats  # the late change only
    assert {g: b.group(g).get_counter("n") for g in groups} == expected
    assert b.for_key("k8").get_state("s") == value and value, "the copy lost a value"
    assert not process(b, "k7", [("incr_counter", "n", 1)], msg_id="late"), "an applied id was not copied"
    assert not process(b, "k8", [("incr_counter", "n", 1)], msg_id="m8"), "an applied id was not copied"


def in_shards(changelog: Changelog, groups: set[int], keys: list[str]) -> int:
    """How many of these keys' messages fall in the shards of these groups."""
    shards = {changelog.shard(g) for g in groups}
    return sum(changelog.shard(key_group(k, G)) in shards for k in keys)


def test_an_open_reads_only_the_shards_of_its_groups(tmp_path, client, changelog):
    """Moving a few groups reads their shards' records, not the whole function's changelog."""
    a = store(tmp_path, client, changelog)
    keys = [f"k{i % 40}" for i in range(400)]
    for i, k in enumerate(keys):
        process(a, k, [("incr_counter", "n", 1)], msg_id=f"m{i}")
    groups = {key_group("k3", G)}
    expected = {g: a.group(g).get_counter("n") for g in groups}
    a.release(groups)
    b = store(tmp_path, client, changelog, "b", owned=set())
    stats = b.open(groups)
    assert stats.records == in_shards(changelog, groups, keys), stats
    assert changelog.shards == 1 or stats.records < len(keys) // 2, stats
    assert {g: b.group(g).get_counter("n") for g in groups} == expected


def test_a_pre_copy_reads_the_changelog_no_faster_than_its_rate(tmp_path, client, changelog):
    """preCopyMBps: the broker serves the function's records too, so a pre-copy of a large state is spread out."""
    a = store(tmp_path, client, changelog)
    t0 = time.perf_counter()
    for i in range(400):
        process(a, "k7", [("put_state", "s", b"x" * 1000)], msg_id=f"m{i}")
    written_mb_per_s = 0.4 / (time.perf_counter() - t0)
    rate = 6 * written_mb_per_s  # well over 1 + Pacer.CATCH_UP times the write rate: the rate holds
    b = store(tmp_path, client, changelog, "b", owned=set())
    copied = b.prepare({key_group("k7", G)}, client, changelog, mb_per_s=rate)
    assert copied.bytes >= 400_000, copied
    # paced every 50 records: all but the last stretch's bytes (<= 50 KB here) wait for the rate
    assert copied.seconds >= (copied.bytes - 60_000) / (rate * 1e6), (copied, rate)


class ReaderQueues:
    """The test's client, noting the receiver queue of every reader created through it."""

    def __init__(self, client: pulsar.Client):
        self.client, self.queues = client, []

    def create_reader(self, *args, receiver_queue_size: int, **kwargs):
        self.queues.append(receiver_queue_size)
        return self.client.create_reader(*args, receiver_queue_size=receiver_queue_size, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


@pytest.mark.parametrize("value_kb", [1, 50])
def test_a_pre_copy_holds_about_a_megabyte_in_its_readers_queue(tmp_path, client, changelog, value_kb):
    """The broker pushes a reader's whole queue at once: with 200 records of 50 KB in it, a pre-copy put 10 MB through
    the broker at the start of a change, beside the function's traffic. Each round starts with the smallest queue
    and, once its first record tells the records' size, reads again from its start with a queue of about
    PACED_READER_BYTES (at most PACED_READER_QUEUE records); every round reads every record (a second round starts
    from the first one's end: B16 made a reader with a queue of 1 from there read nothing)."""
    a = store(tmp_path, client, changelog)
    b = store(tmp_path, client, changelog, "b", owned=set())
    groups = {key_group(f"k{i}", G) for i in range(7)}
    for round_ in range(2):
        for i in range(40):
            process(
                a, f"k{i % 7}", [("put_state", "s", b"x" * (value_kb * 1000)), ("incr_counter", "n", 1)], msg_id=f"m{round_}-{i}"
            )
        readers = ReaderQueues(client)
        copied = b.prepare(groups, readers, changelog, mb_per_s=100)
        assert copied.records >= 80 and copied.bytes >= 40 * value_kb * 1000, copied
        assert readers.queues[0] == MIN_READER_QUEUE, readers.queues
        assert MIN_READER_QUEUE < max(readers.queues) <= PACED_READER_QUEUE, readers.queues
        assert max(readers.queues) * value_kb * 1000 <= 1.1 * PACED_READER_BYTES, readers.queues
    b.open(groups)
    keys = [f"k{i}" for i in range(7)]
    assert [b.for_key(k).get_counter("n") for k in keys] == [a.for_key(k).get_counter("n") for k in keys]


def test_a_paced_read_beside_many_shards_reads_on_from_a_position(client):
    """A pre-copy shares a receiver queue of 200 among the shards it reads side by side: beside more than 100, a
    reader's share was 1, and a pulsar-lite reader with a queue of 1 started from a position reads nothing (B16):
    the pre-copy of a function with that many changelogShards failed after 15 s with "no record"."""
    changelog = Changelog(f"persistent://public/default/__state-t{uuid.uuid4().hex[:10]}-changelog", 1, G)
    writer = ChangelogWriter(client, changelog)
    for i in range(10):
        writer.send([Record(0, COUNTER, "n", i + 1, i + 1, msg_id=f"m{i}")])
        if i == 4:
            writer.flush()
            first = ReadStats()
            assert len(list(read_changelog(client, changelog.shard_topic(0), stats=first))) == 5
    writer.flush()
    rest = list(read_changelog(client, changelog.shard_topic(0), first.end, pace=lambda *_: None, side_by_side=150))
    assert [r.value for _, r in rest] == [6, 7, 8, 9, 10]
    writer.close()


def test_effectively_once_skips_an_applied_message_also_after_a_restore(tmp_path, client, changelog):
    a = store(tmp_path, client, changelog)
    assert process(a, "k", [("incr_counter", "n", 1), ("incr_counter", "m", 2)], "(1,1,-1,-1)")
    assert not process(a, "k", [("incr_counter", "n", 1)], "(1,1,-1,-1)")  # a redelivery
    view = a.for_key("k")
    a.begin(view.group, "(1,2,-1,-1)")
    view.incr_counter("n", 5)
    a.abort()  # the function raised
    assert (view.get_counter("n"), view.get_counter("m")) == (1, 2)
    b = store(tmp_path, client, changelog, "b")
    b.open(set(range(G)))
    assert not process(b, "k", [("incr_counter", "n", 1)], "(1,1,-1,-1)")
    assert process(b, "k", [("incr_counter", "n", 1)], "(1,2,-1,-1)")
    assert b.for_key("k").get_counter("n") == 2


def test_a_message_whose_records_did_not_all_arrive_is_not_restored(tmp_path, client, changelog):
    writer = ChangelogWriter(client, changelog)
    g = key_group(NONE_KEY, G)
    writer.send(
        [Record(g, COUNTER, "n", 1, 1, msg_id="m1", part=0, parts=1), Record(g, COUNTER, "n", 2, 2, msg_id="m2", part=0, parts=2)]
    )  # m2's second record was lost
    writer.flush()
    b = store(tmp_path, client, changelog, "b")
    b.open({g})
    assert b.for_key(None).get_counter("n") == 1
    assert not process(b, None, [("incr_counter", "n", 1)], "m1") and process(b, None, [("incr_counter", "n", 1)], "m2")
    writer.close()


def test_rest_reads_find_a_key_in_whichever_group_holds_it(tmp_path, client, changelog):
    a = store(tmp_path, client, changelog)
    process(a, None, [("incr_counter", "hello", 3)])  # a message without a key: NONE_KEY's group
    assert a.get_counter("hello") == 3 and a.has_counter("hello") and a.counters() == {"hello": 3}
    a.incr_counter("hello", 1)  # REST-side writes go where the key lives
    assert a.for_key(None).get_counter("hello") == 4


def shared(tmp_path, client, changelog, name, owned) -> StateStore:
    """An instance's store on a worker whose instances share one group directory (functions/keyed/migration.py)."""
    s = store(tmp_path, client, changelog, name, owned)
    s.snapshot_dir = tmp_path / "groups"
    return s


def test_a_move_between_stores_of_one_worker_copies_nothing(tmp_path, client, changelog):
    g = key_group("k", G)
    a = shared(tmp_path, client, changelog, "a", set(range(G)))
    b = shared(tmp_path, client, changelog, "b", set())
    process(a, "k", [("incr_counter", "n", 3)])
    inode = a.group_path(g).stat().st_ino
    a.release({g})
    stats = b.open({g})
    assert stats.from_snapshot == 1 and stats.records == 0  # the same file, only its (empty) tail read
    assert b.group_path(g).stat().st_ino == inode
    process(b, "k", [("incr_counter", "n", 1)])
    assert b.for_key("k").get_counter("n") == 4


def test_a_file_in_use_when_its_worker_died_is_rebuilt_from_the_changelog(tmp_path, client, changelog):
    g = key_group("k", G)
    a = shared(tmp_path, client, changelog, "a", set(range(G)))
    process(a, "k", [("incr_counter", "n", 3)])
    a.release({g})
    a.open({g})
    a.begin(g)
    a.for_key("k").incr_counter("n", 100)  # changed here, never sent: killed before the message's end
    b = shared(tmp_path, client, changelog, "b", set())
    stats = b.open({g})  # the file was served after its release: not trusted
    assert stats.from_snapshot == 0 and b.for_key("k").get_counter("n") == 3


def test_a_group_file_deleted_with_its_function_is_not_the_next_ones_state(tmp_path, client, changelog):
    import shutil

    a = store(tmp_path, client, changelog)
    process(a, "k", [("incr_counter", "n", 3)])
    shutil.rmtree(tmp_path / "a")
    again = store(tmp_path, client, changelog)
    assert again.for_key("k").get_counter("n") == 0 and again.counters() == {}


def test_an_instance_of_a_deleted_function_never_writes_into_the_next_ones_files(tmp_path, client, changelog):
    """Deleted while its instance drains, created again at once: the old store fails on its next call instead of
    taking the new function's file at the same path (one-worker CI run: "database is locked", counts 0)."""
    old = store(tmp_path, client, changelog)
    process(old, "k", [("incr_counter", "n", 3)])
    os.replace(tmp_path / "a", tmp_path / "trash")  # the delete moves the function's files aside
    new = store(tmp_path, client, changelog)
    process(new, "k", [("incr_counter", "n", 1)])
    process(new, "j", [("incr_counter", "n", 1)])
    with pytest.raises(StateRemovedError, match="was removed"):
        process(old, "k", [("incr_counter", "n", 1)])  # a group whose file it had
    with pytest.raises(StateRemovedError, match="was removed"):
        process(old, "j", [("incr_counter", "n", 1)])  # a group it had not opened yet
    assert new.for_key("k").get_counter("n") == 1 and new.for_key("j").get_counter("n") == 1


def _close_in_a_thread(s: StateStore) -> threading.Thread:
    closer = threading.Thread(target=s.close, daemon=True)
    closer.start()
    closer.join(10)
    return closer


def test_a_deleted_functions_store_closing_late_leaves_the_next_ones_files_alone(tmp_path, client, changelog):
    """The deleted function's stores close once its instances drained, which under load is after the function
    created again under its name began a message in the same group: that message commits, and the close does
    not wait on it (CI: counts stuck at 0 behind a never-committed transaction, and the worker's stop hung)."""
    old = store(tmp_path, client, changelog)
    process(old, "k", [("incr_counter", "n", 3)])
    os.replace(tmp_path / "a", tmp_path / "trash")
    new = store(tmp_path, client, changelog)
    view = new.for_key("k")
    assert new.begin(view.group, "m1")
    view.incr_counter("n", 1)
    closer = _close_in_a_thread(old)
    assert not closer.is_alive(), "the deleted function's store waited on a group file of the new function"
    new.commit()
    assert process(new, "k", [("incr_counter", "n", 1)], "m2")
    assert new.for_key("k").get_counter("n") == 2


def test_a_message_of_a_deleted_function_in_flight_ends_and_lets_its_store_close(tmp_path, client, changelog):
    """Its instance was in the middle of a message when the function was deleted and created again: the message
    fails, and its group's lock is free again (the store's close, after the drain, would otherwise hang)."""
    old = store(tmp_path, client, changelog)
    view = old.for_key("k")
    assert old.begin(view.group, "m1")
    view.incr_counter("n", 1)
    os.replace(tmp_path / "a", tmp_path / "trash")
    new = store(tmp_path, client, changelog)
    assert process(new, "k", [("incr_counter", "n", 1)], "m1")
    with pytest.raises(Exception):
        old.commit()
    assert not _close_in_a_thread(old).is_alive(), "the deleted function's store could not close"
    assert new.for_key("k").get_counter("n") == 1
