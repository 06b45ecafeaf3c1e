"""A keyed process instance's state calls over a real pipe to a real store (functions/runtimes/remote_state.py): the
answers, EFFECTIVELY_ONCE, errors that cross, a process that dies between begin and commit, and the input on
the same pipe (a real consumer): what crosses per record, and acks that follow their commits."""

from __future__ import annotations

import multiprocessing as mp
import threading

import pulsar
import pytest

from pulsar_autoscale.functions.runtimes.remote_state import KeyedParts, KeyedServer, RemoteStateStore
from pulsar_autoscale.functions.state.groups import state_group
from pulsar_autoscale.functions.state.store import NotOwnedError, StateStore

OWNED = {0, 1, 2}


@pytest.fixture
def served(tmp_path):
    """(the process side, the worker's store, the serving thread)."""
    store = StateStore(tmp_path / "instance-0.sqlite", 8, owned=OWNED)
    worker_end, process_end = mp.Pipe()
    parts = KeyedParts(lambda: None, store, lambda: None, 8, once=True)
    thread = threading.Thread(target=KeyedServer(worker_end, parts).serve, daemon=True)
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
    assert store.group(1).get_counter("a") == 5  # the worker's store holds it
    remote.group(1).del_counter("a")
    assert remote.group(1).get_counter("a") == 0
    assert remote.group(1).group == 1


def test_effectively_once_skips_a_message_id_applied_already(served):
    remote, store, *_ = served
    assert remote.begin(1, "m-1") is True
    remote.group(1).incr_counter("k", 1)
    remote.commit()
    assert remote.begin(1, "m-1") is False  # redelivered: skipped
    assert store.group(1).get_counter("k") == 1


def test_the_stores_errors_are_raised_in_the_process(served):
    remote, *_ = served
    with pytest.raises(NotOwnedError, match="key group 5"):
        remote.begin(5, None)
    with pytest.raises(AttributeError):
        remote.group(1).drop_everything
    with pytest.raises(ValueError, match="unknown state call 'drop'"):
        remote.call("drop", None)


def test_a_process_gone_between_begin_and_commit_leaves_nothing_and_frees_its_group(served):
    remote, store, thread, process_end = served
    remote.begin(1, "m-1")
    remote.group(1).incr_counter("k", 1)
    remote.commit()
    remote.begin(1, "m-2")
    remote.group(1).incr_counter("k", 1)  # the process dies here: no commit
    process_end.close()
    thread.join(5)
    assert not thread.is_alive(), "the serving thread did not end with the pipe"
    took = []

    def again():  # the record comes again, to the instance started in its place
        took.append(store.begin(1, "m-2"))
        store.commit()

    other = threading.Thread(target=again)
    other.start()
    other.join(5)
    assert took == [True], "group 1 still held by the dead process's transaction"
    assert store.group(1).get_counter("k") == 1, "the dead process's change was not rolled back"


class Counted:
    """The process's end of the pipe, counting what crosses it: each crossing wakes a worker thread."""

    def __init__(self, conn):
        self._conn, self.sent = conn, 0

    def send(self, obj):
        self.sent += 1
        self._conn.send(obj)

    def recv(self):
        return self._conn.recv()


@pytest.fixture
def served_input(tmp_path, client, topic):
    """(process side, pipe counter, the worker's store, the serving thread, a producer on the input topic):
    the instance's input a real consumer on a real broker."""
    store = StateStore(tmp_path / "instance-0.sqlite", 8)
    worker_end, process_end = mp.Pipe()
    parts = KeyedParts(lambda: subscribe(client, topic), store, lambda: client, 8, once=True)
    thread = threading.Thread(target=KeyedServer(worker_end, parts).serve, daemon=True)
    thread.start()
    counted = Counted(process_end)
    yield RemoteStateStore(counted), counted, store, thread, client.create_producer(topic)
    process_end.close()
    thread.join(5)
    store.close()


def subscribe(client, topic):
    return client.subscribe(
        topic, "fn", consumer_type=pulsar.ConsumerType.Shared, initial_position=pulsar.InitialPosition.Earliest
    )


def redelivered(client, topic) -> list[bytes]:
    """What the function's subscription still holds, unacked, once its consumer is gone."""
    again = subscribe(client, topic)
    out = []
    try:
        while True:
            out.append(again.receive(timeout_millis=1000).data())
    except pulsar.Timeout:
        return out
    finally:
        again.close()


def test_a_record_crosses_the_pipe_twice_and_its_ack_follows_its_commit(served_input, client, topic):
    """The receive begins the record's scope in the worker; commit and ack go with the next receive."""
    remote, counted, store, thread, producer = served_input
    for data in (b"one", b"two"):
        producer.send(data, partition_key="k")
    keyed_input = remote.input()
    counted.sent = 0
    msg = keyed_input.receive(5000)
    group = state_group(msg, 8, True)
    assert remote.begin(group, msg.message_id()) is True and counted.sent == 1, "begin crossed the pipe"
    assert remote.group(group).incr_counter("k", 1) == 1 and counted.sent == 2
    remote.commit()
    keyed_input.acknowledge(msg)
    assert counted.sent == 2, "commit and ack waited for no answer"
    second = keyed_input.receive(5000)
    assert counted.sent == 3 and second.data() == b"two"
    assert remote.group(group).get_counter("k") == 1, "the commit did not go with the receive"
    remote.abort()
    keyed_input.close()  # the second record is taken, not acked: redelivered; the first is acked
    assert redelivered(client, topic) == [b"two"]


def test_a_failed_one_way_call_is_raised_by_the_next_call_and_drops_later_acks(served_input, client, topic):
    remote, counted, store, thread, producer = served_input
    producer.send(b"one", partition_key="k")
    keyed_input = remote.input()
    msg = keyed_input.receive(5000)
    remote.begin(state_group(msg, 8, True), msg.message_id())
    remote.commit()
    remote.send("nack", None, 999)  # no such message: this one-way call fails in the worker
    keyed_input.acknowledge(msg)
    with pytest.raises(KeyError, match="999"):
        remote.group(0).get_counter("k")
    with pytest.raises(KeyError, match="999"):  # every later call: the instance must fail
        keyed_input.receive(100)
    keyed_input.close()
    assert redelivered(client, topic) == [b"one"], "an ack after a failure was applied"
