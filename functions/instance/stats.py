"""Per-instance figures, kept the way Pulsar's python_instance keeps its stats: explicit counters
updated in the one processing loop, read by the worker for REST, /metrics and the controller."""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

MAX_LATEST_EXCEPTIONS = 10


@dataclass(frozen=True)
class ExceptionRecord:
    exceptionString: str
    timestampMs: int


@dataclass(frozen=True)
class InstanceFigures:
    """Cumulative since the instance started. Picklable, so a process instance can send it to its worker."""

    instance_id: int
    start_time_ms: int
    running: bool = False
    error: str = ""
    received: int = 0
    processed: int = 0  # successfully
    user_exceptions: int = 0
    system_exceptions: int = 0
    outputs: int = 0
    busy_s: float = 0.0
    busy_sq_s2: float = 0.0
    interarrival_n: int = 0
    interarrival_s: float = 0.0
    interarrival_sq_s2: float = 0.0
    wait_s: float = 0.0  # sum of publish-to-receive waits (the fast path's backlog, by Little's law)
    newest_publish_ms: int = 0  # newest publish time received (the fast path's arrival rate)
    in_flight: int = 0  # messages taken and not yet processed (0 or 1: one loop)
    first_processed_ms: int = 0
    last_invocation_ms: int = 0
    latest_user_exceptions: tuple[ExceptionRecord, ...] = ()
    latest_system_exceptions: tuple[ExceptionRecord, ...] = ()
    user_metrics: dict[str, tuple[float, int]] = field(default_factory=dict)  # name -> (sum, count)
    connected: bool = True  # the input consumer's connection to the broker
    stalled_since_ms: int = 0  # in-flight work (process() or unacked outputs) without progress since; 0: none
    output_error: str = ""  # the last output failed (send timeout: a hung broker) and none has succeeded since
    redelivered: int = 0  # messages received again (redelivery count > 0): ATLEAST_ONCE state may count them twice

    @property
    def avg_latency_ms(self) -> float:
        return 1000.0 * self.busy_s / self.processed if self.processed else 0.0


class InstanceStats:
    """The loop's counters: plain attributes updated on the hot path, copied into InstanceFigures on read.

    Each counter has one writer (the loop, or the producer callback for outputs), so the hot
    path takes no lock; a reader may see a figure one message behind, which is fine for stats.
    """

    def __init__(self, instance_id: int, start_time_ms: int | None = None):
        self.instance_id = instance_id
        self.start_time_ms = start_time_ms or int(time.time() * 1000)
        # Not running until the loop has its input: a status that says "running" earlier
        # invites a producer to send before the subscription exists (it starts at the latest message).
        self.running, self.error = False, ""
        self.received = self.processed = self.outputs = self.redelivered = 0
        self.user_exceptions = self.system_exceptions = 0
        self.busy_s = self.busy_sq_s2 = 0.0
        self.interarrival_n, self.interarrival_s, self.interarrival_sq_s2 = 0, 0.0, 0.0
        self.wait_s, self.in_flight = 0.0, 0
        self.first_processed_ms = self.last_invocation_ms = 0
        self._last_publish_ms: int | None = None
        self._user_exc: list[ExceptionRecord] = []
        self._system_exc: list[ExceptionRecord] = []
        self._metrics: dict[str, tuple[float, int]] = {}
        # For an honest status: the loop sets these; a status check turns long silence into "stalled".
        self.connected = True
        self.busy_since_ms = 0  # process() running since (0: not in process())
        self.last_progress_ms = self.start_time_ms  # last message processed or output persisted
        self.pending_outputs: Callable[[], int] = lambda: 0
        self.output_error = ""
        self._lock = threading.Lock()  # only for the rarely written collections

    def figures(self) -> InstanceFigures:
        with self._lock:
            return InstanceFigures(
                instance_id=self.instance_id,
                start_time_ms=self.start_time_ms,
                running=self.running,
                error=self.error,
                received=self.received,
                processed=self.processed,
                user_exceptions=self.user_exceptions,
                system_exceptions=self.system_exceptions,
                outputs=self.outputs,
                busy_s=self.busy_s,
                busy_sq_s2=self.busy_sq_s2,
                interarrival_n=self.interarrival_n,
                interarrival_s=self.interarrival_s,
                interarrival_sq_s2=self.interarrival_sq_s2,
                wait_s=self.wait_s,
                newest_publish_ms=self._last_publish_ms or 0,
                in_flight=self.in_flight,
                first_processed_ms=self.first_processed_ms,
                last_invocation_ms=self.last_invocation_ms,
                latest_user_exceptions=tuple(self._user_exc),
                latest_system_exceptions=tuple(self._system_exc),
                user_metrics=dict(self._metrics),
                connected=self.connected,
                stalled_since_ms=self._stalled_since_ms(),
                output_error=self.output_error,
                redelivered=self.redelivered,
            )

    def _stalled_since_ms(self) -> int:
        since = self.busy_since_ms
        if self.pending_outputs() > 0:
            since = min(since, self.last_progress_ms) if since else self.last_progress_ms
        return since

    def on_received(self, publish_ms: int) -> None:
        self.received += 1
        self.in_flight = 1
        self.wait_s += max(time.time() - publish_ms / 1000.0, 0.0)
        last = self._last_publish_ms
        if last is not None and publish_ms >= last:
            gap = (publish_ms - last) / 1000.0
            self.interarrival_n += 1
            self.interarrival_s += gap
            self.interarrival_sq_s2 += gap * gap
        if last is None or publish_ms > last:
            self._last_publish_ms = publish_ms

    def on_processed(self, seconds: float, ok: bool) -> None:
        now_ms = int(time.time() * 1000)
        self.in_flight = 0
        if ok:
            self.processed += 1
        self.busy_s += seconds
        self.busy_sq_s2 += seconds * seconds
        self.last_invocation_ms = self.last_progress_ms = now_ms
        if not self.first_processed_ms:
            self.first_processed_ms = now_ms

    def on_output(self) -> None:
        self.outputs += 1
        self.last_progress_ms = int(time.time() * 1000)
        if self.output_error:
            self.output_error = ""

    def on_output_failed(self, result) -> None:
        """An output the broker did not persist (its input is nacked): status says so until one succeeds.
        A broker hung with its connections open shows first this way, at the producer's send timeout."""
        self.output_error = f"outputs failing: the broker did not persist the last one ({result})"

    def on_exception(self, exc: BaseException, user: bool) -> None:
        rec = ExceptionRecord("".join(traceback.format_exception_only(type(exc), exc)).strip(), int(time.time() * 1000))
        with self._lock:
            if user:
                self.user_exceptions += 1
                self._user_exc = (self._user_exc + [rec])[-MAX_LATEST_EXCEPTIONS:]
            else:
                self.system_exceptions += 1
                self._system_exc = (self._system_exc + [rec])[-MAX_LATEST_EXCEPTIONS:]

    def record_metric(self, name: str, value: float) -> None:
        with self._lock:
            total, count = self._metrics.get(name, (0.0, 0))
            self._metrics[name] = (total + float(value), count + 1)

    def set_running(self, running: bool, error: str = "") -> None:
        with self._lock:
            self.running, self.error = running, error
