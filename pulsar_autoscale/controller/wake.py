"""Wake-up of functions scaled to zero: a Reader on each input of a sleeping function.

A Reader is non-durable: it creates no subscription, holds no backlog and acknowledges nothing,
so the function's own subscription keeps every message for the instances that wake. The first
message seen calls `on_message(function)` at once (measured: about 1 ms from send), instead of
waiting up to a period for the broker's backlog gauge. A message that arrives while the function
is being put to sleep, before its Reader exists (it starts at the latest message), is seen by the
next period's backlog instead.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Mapping

import pulsar

from pulsar_autoscale.pulsar_client import open_client

log = logging.getLogger(__name__)
POLL_MS = 100  # how often a watcher looks at its stop flag (each input in turn)


class WakeWatcher:
    def __init__(self, service_url, on_message: Callable[[str], None]):
        self._service_url = service_url
        self._on_message = on_message
        self._client: pulsar.Client | None = None
        self._watching: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    @property
    def watching(self) -> set[str]:
        return set(self._watching)

    def watch(self, sleeping: Mapping[str, tuple[str, ...]]) -> None:
        """Watch exactly these functions (function -> its input topics)."""
        with self._lock:
            for fn in set(self._watching) - set(sleeping):
                self._watching.pop(fn).set()
            for fn, inputs in sleeping.items():
                if fn not in self._watching and inputs:
                    if self._client is None:
                        self._client = open_client(self._service_url, operation_timeout_seconds=5)
                    stop = threading.Event()
                    readers = [self._client.create_reader(t, pulsar.MessageId.latest) for t in inputs]
                    self._watching[fn] = stop
                    threading.Thread(target=self._run, args=(fn, readers, stop), name=f"wake-{fn}", daemon=True).start()

    def _run(self, fn: str, readers: list, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                for reader in readers:
                    try:
                        reader.read_next(timeout_millis=POLL_MS)
                    except pulsar.Timeout:
                        continue
                    if not stop.is_set():
                        with self._lock:
                            if self._watching.get(fn) is stop:
                                del self._watching[fn]
                        self._on_message(fn)
                    return
        except Exception:  # a lost connection: the next period's backlog still wakes the function
            log.exception("wake watcher of %s stopped", fn)
        finally:
            for reader in readers:
                try:
                    reader.close()
                except pulsar.PulsarException:
                    pass

    def close(self) -> None:
        with self._lock:
            for stop in self._watching.values():
                stop.set()
            self._watching.clear()
            client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except pulsar.PulsarException:
                pass
