"""A keyed process instance's state calls over a real pipe to a real store (functions/remote_state.py): the
answers, EFFECTIVELY_ONCE, errors that cross, and a process that dies between begin and commit."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pytest

from functions.remote_state import RemoteStateStore, serve_state
from functions.state import NotOwnedError, StateStore

OWNED = {0, 1, 2}


@pytest.fixture
def served(tmp_path):
    """(the process side, the worker's store, the serving thread)."""
    store = StateStore(tmp_path / "instance-0.sqlite", 8, owned=OWNED)
    worker_end, process_end = mp.Pipe()
    thread = threading.Thread(target=serve_state, args=(worker_end, store, lambda: None), daemon=True)
    thread.start()
    yield RemoteStateStore(process_end), store, thread, process_end
    process_end.close()
    thread.join(5)
    store.close()


def test_state_calls_answer_as_the_store_does(served):
    remote, store, *_ = served
    assert remote.group(1).incr_counter("a", 2) == 2
    assert remote.group(1).incr_counter("a", 3) == 5
    remote.group(2).put_state("b", b"\x00bytes")
    assert remote.group(2).get_state("b") == b"\x00bytes"
    assert store.group(1).get_counter("a") == 5          # the worker's store holds it
    remote.group(1).del_counter("a")
    assert remote.group(1).get_counter("a") == 0
    assert remote.group(1).group == 1


def test_effectively_once_skips_a_message_id_applied_already(served):
    remote, store, *_ = served
    assert remote.begin(1, "m-1") is True
    remote.group(1).incr_counter("k", 1)
    remote.commit()
    assert remote.begin(1, "m-1") is False                # redelivered: skipped
    assert store.group(1).get_counter("k") == 1


def test_the_stores_errors_are_raised_in_the_process(served):
    remote, *_ = served
    with pytest.raises(NotOwnedError, match="key group 5"):
        remote.begin(5, None)
    with pytest.raises(AttributeError):
        remote.group(1).drop_everything
    with pytest.raises(ValueError, match="unknown state call 'close'"):
        remote.call("close", None)


def test_a_process_gone_between_begin_and_commit_leaves_nothing_and_frees_its_group(served):
    remote, store, thread, process_end = served
    remote.begin(1, "m-1")
    remote.group(1).incr_counter("k", 1)
    remote.commit()
    remote.begin(1, "m-2")
    remote.group(1).incr_counter("k", 1)                   # the process dies here: no commit
    process_end.close()
    thread.join(5)
    assert not thread.is_alive(), "the serving thread did not end with the pipe"
    took = []

    def again():   # the record comes again, to the instance started in its place
        took.append(store.begin(1, "m-2"))
        store.commit()

    other = threading.Thread(target=again)
    other.start()
    other.join(5)
    assert took == [True], "group 1 still held by the dead process's transaction"
    assert store.group(1).get_counter("k") == 1, "the dead process's change was not rolled back"
