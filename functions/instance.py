"""One function instance: one loop that receives, processes, produces and acks, with explicit stats.

Modelled on Pulsar's python_instance.py. Draining (`stop()`): the loop stops receiving,
finishes the message in hand, waits until every output it produced is persisted and acked,
then closes the consumer, so messages prefetched but not processed go back to the broker
and are redelivered to the surviving instances.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import pulsar

from .config import FunctionConfig
from .context import InstanceContext, identity_deserialize, load_serde, source_event_time
from .loader import load_callable
from .state import StateStore
from .stats import InstanceStats

SUBSCRIPTION_TYPES = {
    "SHARED": pulsar.ConsumerType.Shared,
    "KEY_SHARED": pulsar.ConsumerType.KeyShared,
    "FAILOVER": pulsar.ConsumerType.Failover,
}
RECEIVE_TIMEOUT_MS = 100
DRAIN_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)


def subscribe(client: pulsar.Client, cfg: FunctionConfig, consumer_name: str) -> pulsar.Consumer:
    return client.subscribe(
        list(cfg.inputs), cfg.subscription_name,
        consumer_type=SUBSCRIPTION_TYPES[cfg.subscription_type],
        receiver_queue_size=cfg.receiverQueueSize,
        consumer_name=consumer_name,
        negative_ack_redelivery_delay_ms=1000,
    )


def is_connected(consumer) -> bool:
    """Whether the input's connection to the broker is up (inputs without the notion count as connected)."""
    check = getattr(consumer, "is_connected", None)
    return bool(check()) if check is not None else True


class TopicLogHandler(logging.Handler):
    """Pulsar's logTopic: what the function logs through context.get_logger() is published there."""

    def __init__(self, producer):
        super().__init__(logging.INFO)
        self.producer = producer
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.producer.send_async(self.format(record).encode(), None)
        except Exception:  # logging must never break the function
            self.handleError(record)

    def close(self) -> None:
        try:
            self.producer.flush()
            self.producer.close()
        finally:
            super().close()


class Instance:
    def __init__(self, config: FunctionConfig, instance_id: int, client: pulsar.Client, code_path: str | None,
                 state: StateStore, num_instances: Callable[[], int], stats: InstanceStats | None = None,
                 open_input: Callable[[], object] | None = None):
        self.config = config
        self.instance_id = instance_id
        self.stats = stats or InstanceStats(instance_id)
        self._client = client
        self._code_path = code_path
        self._state = state
        self._num_instances = num_instances
        # Where messages come from: the instance's own consumer (Apache Pulsar), or on pulsar-lite
        # a lease on the function's one shared consumer (lite_quirks) with the same methods.
        self._open_input = open_input or self._subscribe
        self._stop = threading.Event()
        self._input = None  # what abandon() closes
        # Outputs in flight = sent - completed; each counter has a single writer, so no lock on the hot path.
        self._sent = 0
        self._completed = 0
        self.logger = logging.getLogger(f"function.{config.fqfn}.{instance_id}")

    def stop(self) -> None:
        self._stop.set()

    def abandon(self) -> None:
        """A drain that did not finish in time: close the input under the loop (a thread cannot be killed), so
        the broker redelivers its unacknowledged messages; the loop fails at its next call on it."""
        self._stop.set()
        self.stats.set_running(False, error="abandoned: still busy when its drain timed out")
        if self._input is not None:
            try:
                self._input.close()
            except Exception:  # already closed
                pass

    # ---- outputs in flight: acks happen in the producer's callback ------------------------------
    def _track_pending(self, n: int) -> None:
        if n > 0:
            self._sent += n
        else:
            self._completed -= n

    def _wait_pending(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._completed < self._sent:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _subscribe(self) -> pulsar.Consumer:
        return subscribe(self._client, self.config, f"{self.config.fqfn}:{self.instance_id}")

    def run(self) -> None:
        """The instance's one loop; returns after a drain or a fatal error (recorded in stats)."""
        cfg = self.config
        consumer = producer = ctx = log_handler = None
        try:
            if cfg.logTopic:
                log_handler = TopicLogHandler(self._client.create_producer(cfg.logTopic, block_if_queue_full=True))
                self.logger.addHandler(log_handler)
                self.logger.setLevel(logging.INFO)  # what a function logs at INFO must reach its topic
            process = load_callable(cfg.className, self._code_path)
            consumer = self._input = self._open_input()
            self.stats.pending_outputs = lambda: self._sent - self._completed
            if cfg.output:
                producer = self._client.create_producer(
                    cfg.output, block_if_queue_full=True, batching_enabled=True, batching_max_publish_delay_ms=1)
            ctx = InstanceContext(cfg, self.instance_id, self._num_instances, self._client, self.stats, self._state,
                                  self.logger, track_pending=self._track_pending)
            self.stats.set_running(True)
            self._loop(consumer, producer, ctx, process)
            self._wait_pending(DRAIN_TIMEOUT_S)
            self.stats.set_running(False)
        except Exception as exc:  # a system failure: record it where status shows it
            self.logger.exception("instance failed")
            self.stats.on_exception(exc, user=False)
            self.stats.set_running(False, error=f"{type(exc).__name__}: {exc}")
        finally:
            if log_handler is not None:
                self.logger.removeHandler(log_handler)
            for closable in (ctx, producer, consumer, log_handler):
                if closable is not None:
                    try:
                        closable.close()
                    except Exception:  # closing after a broker failure must not hide the original error
                        pass

    def _loop(self, consumer, producer, ctx: InstanceContext, process) -> None:
        at_most_once = self.config.processingGuarantees == "ATMOST_ONCE"
        output_serde = load_serde(self.config.extra.get("outputSerdeClassName"))
        stats = self.stats
        while not self._stop.is_set():
            try:
                msg = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
            except pulsar.Timeout:
                stats.connected = is_connected(consumer)
                continue
            if not stats.connected:  # only while it was seen down: no broker call on the hot path
                stats.connected = is_connected(consumer)
            stats.on_received(msg.publish_timestamp())
            if at_most_once:
                consumer.acknowledge(msg)
            ctx.set_message(msg)
            start = time.perf_counter()
            stats.busy_since_ms = int(time.time() * 1000)
            try:
                result = process(identity_deserialize(msg.data()), ctx)
            except Exception as exc:
                stats.on_processed(time.perf_counter() - start, ok=False)
                stats.on_exception(exc, user=True)
                self.logger.warning("user exception: %s", exc)
                if not at_most_once:
                    consumer.negative_acknowledge(msg)
                continue
            finally:
                ctx.set_message(None)
                stats.busy_since_ms = 0
            stats.on_processed(time.perf_counter() - start, ok=True)
            if result is None or producer is None:
                if not at_most_once:
                    consumer.acknowledge(msg)
                continue
            self._produce(consumer, producer, msg, output_serde.serialize(result), at_most_once)

    def _produce(self, consumer, producer, msg, payload: bytes, at_most_once: bool) -> None:
        """ATLEAST_ONCE: the input is acked only once the output is persisted."""
        self._sent += 1

        def done(result, _msg_id):
            try:
                if result == pulsar.Result.Ok:
                    self.stats.on_output()
                    if not at_most_once:
                        consumer.acknowledge(msg)
                elif not at_most_once:
                    consumer.negative_acknowledge(msg)
            finally:
                self._completed += 1

        # The source's event time travels with every output, so response time is measured end to end.
        key = msg.partition_key()
        if key:
            producer.send_async(payload, done, event_timestamp=source_event_time(msg), partition_key=key)
        else:
            producer.send_async(payload, done, event_timestamp=source_event_time(msg))
