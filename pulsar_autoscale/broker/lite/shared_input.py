"""B2 within a worker: process instances on pulsar-lite open no consumer of their own.

A second client (process) joining a Shared subscription times out (consumer ids are tracked per
subscription, not per connection). The published workaround (the process of instance i first opens
throwaway consumers so its consumer id is i) joins, but in our 5,000-message scaling runs with 4-8
process instances 4.7-7% of the messages never reached any instance (cause not isolated; docs/dev/pulsar-lite-defects.md).
So the worker holds one consumer per function (SharedInput) and serves each process over a pipe
(functions/runtimes/piped_input.py); acks travel back the same way, and whatever a process held when it
exits is negative-acked, so survivors get it.

Tests: tests/integration/broker_conformance/test_processes.py (the defect),
tests/integration/worker/test_runtime_scaling.py (0 lost through this input).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Callable

import pulsar

log = logging.getLogger(__name__)


class SharedInput:
    """One consumer for all instances of a function on this worker, opened on first use, closed after the last.

    One pump thread receives for all of them and hands each message to the longest-waiting receive,
    except that an instance that has had no message yet goes first: a just-started instance serves at
    once instead of queueing behind the idle ones (with every instance's thread blocked in the client's
    receive, 8 waiters on 200 msg/s, a new instance's first message came 100-180 ms after it was ready).
    """

    def __init__(self, open_consumer: Callable[[], pulsar.Consumer]):
        self._open = open_consumer
        self._consumer: pulsar.Consumer | None = None
        self._users = 0
        self._lock = threading.Lock()
        self._wanted = threading.Condition(self._lock)  # the pump waits here until someone receives
        self._receivers: list[_Receiver] = []  # waiting receives, oldest first
        self._held: deque = deque()  # received after its receiver had timed out
        self._pump_stop = threading.Event()

    def lease(self) -> "InputLease":
        with self._lock:
            if self._consumer is None:
                self._consumer = self._open()
                self._pump_stop = threading.Event()
                threading.Thread(
                    target=self._pump, args=(self._consumer, self._pump_stop), daemon=True, name="shared-input"
                ).start()
            self._users += 1
            return InputLease(self, self._consumer)

    def _release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._consumer is not None:
                self._pump_stop.set()
                self._wanted.notify_all()
                self._held.clear()  # unacknowledged: the broker redelivers them once the consumer closes
                self._consumer.close()
                self._consumer = None

    def receive(self, timeout_millis: int, first: bool = False):
        """`first`: the lease has had no message yet (it is served before the others)."""
        receiver = _Receiver(first)
        with self._lock:
            if self._held:
                return self._held.popleft()
            self._receivers.append(receiver)
            self._wanted.notify()
        if not receiver.served.wait(timeout_millis / 1000.0):
            with self._lock:
                if receiver.msg is None:
                    self._receivers.remove(receiver)
                    raise pulsar.Timeout()
        return receiver.msg

    def _pump(self, consumer: pulsar.Consumer, stop: threading.Event) -> None:
        while True:
            with self._lock:
                while not self._receivers and not stop.is_set():
                    self._wanted.wait()
            if stop.is_set():
                return
            try:
                msg = consumer.receive(timeout_millis=100)
            except pulsar.Timeout:
                continue
            except Exception as exc:  # closed under the pump (the last lease released)
                if stop.is_set():
                    return
                log.warning("shared input: receive failed (%s); retrying", exc)
                stop.wait(0.1)
                continue
            with self._lock:
                if self._receivers:
                    receiver = next((r for r in self._receivers if r.first), self._receivers[0])
                    self._receivers.remove(receiver)
                    receiver.msg = msg
                    receiver.served.set()
                elif not stop.is_set():
                    self._held.append(msg)


class _Receiver:
    __slots__ = ("served", "msg", "first")

    def __init__(self, first: bool):
        self.served, self.msg, self.first = threading.Event(), None, first


class InputLease:
    """What an instance holds instead of its own consumer: same methods, close() only releases."""

    def __init__(self, shared: SharedInput, consumer: pulsar.Consumer):
        self._shared = shared
        self._consumer = consumer
        self._closed = False
        self._received = False

    def receive(self, timeout_millis: int):
        msg = self._shared.receive(timeout_millis, first=not self._received)
        self._received = True
        return msg

    def acknowledge(self, msg) -> None:
        self._consumer.acknowledge(msg)

    def negative_acknowledge(self, msg) -> None:
        self._consumer.negative_acknowledge(msg)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._shared._release()
