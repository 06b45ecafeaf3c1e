"""The calls of instances on other workers to the owner of a non-keyed function's state (functions/state/owner_calls.py),
in one process: the owner's sessions on a local StateStore, and a transport that fails as a failover does."""

from __future__ import annotations

import threading

import pytest

from pulsar_autoscale.functions.state.groups import one_group
from pulsar_autoscale.functions.state.owner_calls import OwnedState, OwnerSessions, OwnerUnavailable, decode, encode
from pulsar_autoscale.functions.state.store import StateStore

G = one_group(128)


def _owner(tmp_path, name="a"):
    return OwnerSessions(StateStore(tmp_path / name / "state.sqlite", 128, keyed=False))


def test_values_cross_as_json():
    assert decode(encode([b"\x00\xff", "s", 3, None])) == [b"\x00\xff", "s", 3, None]


def test_counts_from_many_threads_land_in_one_store(tmp_path):
    owner = _owner(tmp_path)
    state = OwnedState(owner.run)

    def work(t):
        for i in range(50):
            assert state.begin(G, f"{t}:{i}")
            state.group(G).incr_counter("k", 1)
            state.commit()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert owner.store.get_counter("k") == 200
    state.group(G).put_state("v", b"bytes")
    assert state.group(G).get_state("v") == b"bytes"


def test_effectively_once_skips_an_applied_id_and_rolls_back_an_abort(tmp_path):
    owner = _owner(tmp_path)
    state = OwnedState(owner.run)
    assert state.begin(G, "m1")
    state.group(G).incr_counter("k", 1)
    state.commit()
    assert state.begin(G, "m1") is False
    assert state.begin(G, "m2")
    state.group(G).incr_counter("k", 5)
    state.abort()
    assert state.begin(G, "m3")
    assert state.group(G).get_counter("k") == 1
    state.commit()


def test_a_lost_owner_gets_the_message_again_whole(tmp_path):
    """The owner goes away in the middle of a message: the caller sends the message's calls again to the next
    owner, which applies them once (an EFFECTIVELY_ONCE message the old owner had committed is not applied again)."""
    old, new = _owner(tmp_path, "a"), _owner(tmp_path, "b")
    owners = [old]
    fail_next = []

    def transport(session, fresh, calls):
        if fail_next:
            fail_next.pop()
            owners[:] = [new]
            raise OwnerUnavailable("gone")
        return owners[0].run(session, fresh, calls)

    state = OwnedState(transport, replay_s=5)
    assert state.begin(G, "m1")
    assert state.group(G).incr_counter("k", 1) == 1
    fail_next.append(1)
    state.commit()  # replayed on `new`: begin, incr, commit
    assert new.store.get_counter("k") == 1
    # the owner committed m2 and went away before it answered: the next owner has m2 (from the changelog)
    lose_answer = []

    def losing(session, fresh, calls):
        answers = new.run(session, fresh, calls)
        if lose_answer:
            lose_answer.pop()
            raise OwnerUnavailable("answer lost")
        return answers

    state = OwnedState(losing, replay_s=5)
    assert state.begin(G, "m2")
    state.group(G).incr_counter("k", 1)
    lose_answer.append(1)
    state.commit()  # replayed: begin answers False, nothing applied again
    assert new.store.get_counter("k") == 2


def test_a_session_the_owner_lost_is_refused(tmp_path):
    owner = _owner(tmp_path)
    with pytest.raises(OwnerUnavailable):
        owner.run("nosuch", False, [["get_counter", G, ["k"]]])


def test_a_commit_persisted_after_the_owners_lease_lapsed_is_sent_again(tmp_path):
    """The owner's worker froze in the middle of a message past its membership lease: its commit persists when it
    wakes, but it answers 'send it again' instead of success, so the caller does not ack a message whose changes the
    next owner (restored meanwhile) never saw. The calls go again, whole, to the next owner."""
    lease = [True]
    old = OwnerSessions(StateStore(tmp_path / "a" / "state.sqlite", 128, keyed=False), lambda: lease[0])
    new = _owner(tmp_path, "b")
    owners = [old]

    def transport(session, fresh, calls):
        answers = owners[0].run(session, fresh, calls)
        if not lease[0]:
            owners[:] = [new]  # the caller's next try reaches the worker that owns the state now
        return answers

    state = OwnedState(transport, replay_s=5)
    assert state.begin(G, "m1")
    state.group(G).incr_counter("k", 1)
    lease[0] = False  # frozen here, past the heartbeat timeout
    state.commit()
    assert new.store.get_counter("k") == 1, "the message was not sent again to the next owner"
    assert state.begin(G, "m1") is False
