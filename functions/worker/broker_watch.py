"""Is the broker answering? A worker-side probe, so `status` turns honest within seconds of a hung broker.

A broker that hangs with its connections open (SIGSTOP, a stuck JVM) looks healthy to a consumer:
its socket stays up, nothing arrives, and the client's keep-alive notices only after 30 s or more
(measured: status said `running` for the first ~30 s of a SIGSTOP). An idle consumer on a healthy
broker also receives nothing, so silence on the input proves nothing; a request does. Every
PROBE_INTERVAL_S this thread asks the broker for a topic's partition metadata (a lookup the client
sends every time, answered in about a millisecond); while the last answer is older than
SILENT_AFTER_S, every instance of the worker reports `running: false` with the reason. The probe
blocks on a hung broker (up to the client's operation timeout): the age of the last answer grows
meanwhile, which is what is read.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import pulsar

log = logging.getLogger(__name__)
PROBE_INTERVAL_S = 1.0
SILENT_AFTER_S = 4.0  # a loaded 2-core machine answers a lookup in well under a second
# errors that are the broker's answer (it is alive); a timeout or a refused connection is not
ANSWERS = (pulsar.TopicNotFound, pulsar.AuthorizationError, pulsar.AuthenticationError, pulsar.NotAllowedError)


class BrokerWatch:
    def __init__(
        self,
        probe: Callable[[str], object],
        topic: Callable[[], str | None],
        stop: threading.Event,
        silent_after_s: float = SILENT_AFTER_S,
    ):
        """`probe(topic)` asks the broker something about `topic`; `topic()` names one of the worker's input
        topics (None: no function, nothing to probe)."""
        self._probe, self._topic, self._stop = probe, topic, stop
        self.silent_after_s = silent_after_s
        self._last_answer = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="broker-watch", daemon=True)

    def start(self) -> "BrokerWatch":
        self._last_answer = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            topic = self._topic()
            if topic is None:
                self._last_answer = time.monotonic()
            else:
                try:
                    self._probe(topic)
                    self._last_answer = time.monotonic()
                except ANSWERS:
                    self._last_answer = time.monotonic()
                except Exception as exc:  # no answer (timeout, connection refused): the silence goes on
                    log.debug("broker probe on %s got no answer: %s", topic, exc)
            self._stop.wait(PROBE_INTERVAL_S)

    def problem(self) -> str:
        """Why no instance can be running ("" while the broker answers)."""
        silent = time.monotonic() - self._last_answer
        if silent <= self.silent_after_s:
            return ""
        return f"the broker has not answered for {silent:.0f} s (hung or unreachable): nothing is received"
