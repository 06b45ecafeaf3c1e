"""Read a coordination topic from its first message, forever, on a thread of its own."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Callable

import pulsar

log = logging.getLogger(__name__)
READ_TIMEOUT_MS = 100
MARKER = "pulsar-autoscale-marker"


class TopicTailer:
    """Calls `handle(msg)` for every message of `topic` in order; `caught_up` is set once the
    reader has reached the end it found (its first read timeout), so a caller can wait until its
    view covers everything written before it started, and `sync()` waits until it covers everything
    written before the call. A Reader, not seek: seek fails on pulsar-lite (B5), Readers work on both
    brokers."""

    def __init__(
        self, client: pulsar.Client, topic: str, handle: Callable[[pulsar.Message], None], name: str, producer: pulsar.Producer
    ):
        # pulsar-lite: a Reader opened on a topic without messages can stop receiving (docs/dev/pulsar-lite-defects.md),
        # so every reader's worker first writes a marker, which readers skip.
        producer.send(b"", properties={MARKER: "1"})
        self._producer = producer
        self._syncs: dict[str, threading.Event] = {}
        self._reader = client.create_reader(topic, pulsar.MessageId.earliest, reader_name=name)
        self._handle = handle
        self.caught_up = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tail-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closing.is_set():
            try:
                msg = self._reader.read_next(timeout_millis=READ_TIMEOUT_MS)
            except pulsar.Timeout:
                self.caught_up.set()
                continue
            except pulsar.AlreadyClosed:  # its client closed (a join that failed): nothing more to read
                return
            except pulsar.PulsarException as exc:
                if self._closing.is_set():
                    return
                log.warning("reading %s failed (%s); retrying", self._thread.name, exc)
                self._closing.wait(0.2)
                continue
            token = msg.properties().get(MARKER)
            if token:
                self._synced(token)
                continue
            try:
                self._handle(msg)
            except Exception:  # one bad record must not stop the cluster view
                log.exception("cannot apply a record from %s", self._thread.name)

    def sync(self, timeout_s: float) -> bool:
        """ZooKeeper's sync: True once every message written before this call has been handled here.
        A marker of our own goes through the topic; being read back, it proves the reader passed every
        message before it. Another worker's answered write is therefore visible after a sync."""
        token = uuid.uuid4().hex
        done = self._syncs[token] = threading.Event()
        try:
            self._producer.send_async(
                b"",
                lambda res, _id: (
                    None if res == pulsar.Result.Ok else log.warning("sync marker on %s not written: %s", self._thread.name, res)
                ),
                properties={MARKER: token},
            )
            return done.wait(timeout_s)
        finally:
            self._syncs.pop(token, None)

    def _synced(self, token: str) -> None:
        done = self._syncs.get(token)
        if done is not None:
            done.set()

    def close(self) -> None:
        self._closing.set()
        self._thread.join(2)
        try:
            self._reader.close()
        except pulsar.PulsarException:
            pass
