"""A process instance's input through its worker: messages cross a pipe, acks come back.

Used where the worker, not the instance process, holds what the instance receives from: on
pulsar-lite every process instance (B2: lite.shared_input.SharedInput), and everywhere a keyedState
function's process instance (its key groups' mailbox or route topic, functions/keyed/routing.py and
functions/keyed/cluster.py).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pulsar


@dataclass(frozen=True)
class PipedMessage:
    """The parts of a pulsar.Message that an instance and its Context read, picklable."""

    key: int
    _data: bytes
    _properties: dict
    _publish_ms: int
    _event_ms: int
    _partition_key: str
    _topic: str
    _message_id: str
    _ordering_key: str = ""
    _redeliveries: int = 0

    @classmethod
    def of(cls, key: int, msg: pulsar.Message) -> "PipedMessage":
        """Every part that reaches the function or picks the message's key group (its ordering key, as the
        worker's router reads it)."""
        return cls(
            key,
            msg.data(),
            msg.properties(),
            msg.publish_timestamp(),
            msg.event_timestamp(),
            msg.partition_key(),
            msg.topic_name(),
            str(msg.message_id()),
            msg.ordering_key() or "",
            msg.redelivery_count(),
        )

    def data(self) -> bytes:
        return self._data

    def properties(self) -> dict:
        return self._properties

    def publish_timestamp(self) -> int:
        return self._publish_ms

    def event_timestamp(self) -> int:
        return self._event_ms

    def partition_key(self) -> str:
        return self._partition_key

    def topic_name(self) -> str:
        return self._topic

    def message_id(self) -> str:
        return self._message_id

    def ordering_key(self) -> str:
        return self._ordering_key

    def redelivery_count(self) -> int:
        return self._redeliveries


class Taken:
    """Worker side: the messages a process instance received through its worker and has not acked or nacked,
    by the key its PipedMessage carries. Whatever it still holds when the process goes is negative-acked, so
    it is redelivered to the surviving instances."""

    def __init__(self):
        self._messages: dict[int, pulsar.Message] = {}
        self._next_key = 0

    def take(self, msg: pulsar.Message) -> PipedMessage:
        self._next_key += 1
        self._messages[self._next_key] = msg
        return PipedMessage.of(self._next_key, msg)

    def pop(self, key: int) -> pulsar.Message:
        return self._messages.pop(key)

    def give_back(self, consumer) -> None:
        """Negative-ack every message still taken, then close the consumer."""
        for msg in self._messages.values():
            consumer.negative_acknowledge(msg)
        self._messages.clear()
        consumer.close()


def serve_pipe(conn, lease) -> None:
    """Worker side, one thread per process instance: receive on its behalf, ack what it acks. `lease`:
    anything with a consumer's receive/acknowledge/negative_acknowledge/close."""
    taken = Taken()
    try:
        while True:
            try:
                op, arg = conn.recv()
            except (EOFError, OSError):
                return
            if op == "recv":
                try:
                    msg = lease.receive(arg)
                except pulsar.Timeout:
                    conn.send(None)
                    continue
                conn.send(taken.take(msg))
            elif op == "ack":
                lease.acknowledge(taken.pop(arg))
            elif op == "nack":
                lease.negative_acknowledge(taken.pop(arg))
            elif op == "close":
                return
    finally:
        taken.give_back(lease)


class PipeConsumer:
    """Process side: the consumer interface the instance loop uses, served by serve_pipe."""

    def __init__(self, conn):
        self._conn = conn
        self._lock = threading.Lock()  # acks come from producer callbacks on other threads

    def receive(self, timeout_millis: int):
        with self._lock:
            self._conn.send(("recv", timeout_millis))
            msg = self._conn.recv()
        if msg is None:
            raise pulsar.Timeout()
        return msg

    def acknowledge(self, msg: PipedMessage) -> None:
        with self._lock:
            self._conn.send(("ack", msg.key))

    def negative_acknowledge(self, msg: PipedMessage) -> None:
        with self._lock:
            self._conn.send(("nack", msg.key))

    def close(self) -> None:
        with self._lock:
            try:
                self._conn.send(("close", None))
            except OSError:
                pass
