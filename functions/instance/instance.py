"""One function instance: one loop that receives, processes, produces and acks, with explicit stats.

Modelled on Pulsar's python_instance.py. Draining (`stop()`): the loop stops receiving,
finishes the message in hand, waits until every output it produced is persisted and acked,
then closes the consumer, so messages prefetched but not processed go back to the broker
and are redelivered to the surviving instances.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import pulsar

from pulsar_autoscale.broker.lite.nack_redelivery import fence_nacks
from pulsar_autoscale.broker.profile import BrokerProfile
from pulsar_autoscale.functions.instance.context import InstanceContext, identity_deserialize, source_event_time
from pulsar_autoscale.functions.instance.loader import load_callable, load_serde
from pulsar_autoscale.functions.instance.stats import InstanceStats
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.state.backend import StateBackend
from pulsar_autoscale.functions.state.changelog import changelog_of

SUBSCRIPTION_TYPES = {
    "SHARED": pulsar.ConsumerType.Shared,
    "KEY_SHARED": pulsar.ConsumerType.KeyShared,
    "FAILOVER": pulsar.ConsumerType.Failover,
}
RECEIVE_TIMEOUT_MS = 100
DRAIN_TIMEOUT_S = 30.0
BATCH_REST_TIMEOUT_MS = 10  # a drain's wait for the rest of a batch, already in the receiver queue
# A failed message comes back after this long; with maxMessageRetries it goes to the dead-letter topic
# after that many redeliveries (the Pulsar client's DeadLetterPolicy counts them).
NACK_REDELIVERY_DELAY_MS = 1000
COMPRESSION = {
    "NONE": pulsar.CompressionType.NONE,
    "LZ4": pulsar.CompressionType.LZ4,
    "ZLIB": pulsar.CompressionType.ZLib,
    "ZSTD": pulsar.CompressionType.ZSTD,
    "SNAPPY": pulsar.CompressionType.SNAPPY,
}

log = logging.getLogger(__name__)


def subscribe(
    client: pulsar.Client,
    cfg: FunctionConfig,
    consumer_name: str,
    subscription_type: str | None = None,
    receiver_queue_size: int | None = None,
) -> pulsar.Consumer:
    """The function's consumer with Pulsar's semantics for its config: subscription type and receiver queue
    (unless given) and position, dead-letter policy (maxMessageRetries, deadLetterTopic), ack timeout
    (timeoutMs), topicsPattern."""
    kwargs: dict = {}
    if cfg.maxMessageRetries is not None:
        kwargs["dead_letter_policy"] = pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=cfg.maxMessageRetries, dead_letter_topic=cfg.deadLetterTopic
        )
    if cfg.timeoutMs is not None:
        kwargs["unacked_messages_timeout_ms"] = cfg.timeoutMs
    return client.subscribe(
        re.compile(cfg.topicsPattern) if cfg.topicsPattern else list(cfg.inputs),
        cfg.subscription_name,
        consumer_type=SUBSCRIPTION_TYPES[subscription_type or cfg.subscription_type],
        receiver_queue_size=receiver_queue_size or cfg.receiverQueueSize,
        consumer_name=consumer_name,
        negative_ack_redelivery_delay_ms=NACK_REDELIVERY_DELAY_MS,
        initial_position=getattr(pulsar.InitialPosition, cfg.subscriptionPosition),
        **kwargs,
    )


def subscribe_fenced(client: pulsar.Client, cfg: FunctionConfig, consumer_name: str, broker: BrokerProfile):
    """The function's consumer as `broker`'s profile fences it: a FAILOVER input's receiver queue (B1) and its nacks
    counted by the input itself where the broker does not count them (broker/lite/nack_redelivery.py)."""
    consumer = subscribe(client, cfg, consumer_name, receiver_queue_size=broker.input_receiver_queue(cfg))
    return fence_nacks(consumer, cfg, client, broker, NACK_REDELIVERY_DELAY_MS / 1000)


class InstanceInput(Protocol):
    """What an instance receives from: its own pulsar.Consumer, or anything with the consumer's methods the loop
    calls (pulsar-lite's shared-input lease, a keyed mailbox or route topic, a process instance's pipe)."""

    def receive(self, timeout_millis: int) -> Any: ...

    def acknowledge(self, msg: Any) -> None: ...

    def negative_acknowledge(self, msg: Any) -> None: ...

    def close(self) -> None: ...


class _Closable(Protocol):
    def close(self) -> None: ...


def is_connected(consumer) -> bool:
    """Whether the input's connection to the broker is up (inputs without the notion count as connected)."""
    check = getattr(consumer, "is_connected", None)
    return bool(check()) if check is not None else True


def create_output_producer(client: pulsar.Client, cfg: FunctionConfig) -> pulsar.Producer:
    """The output producer, with producerConfig and batchBuilder as Pulsar applies them."""
    kwargs: dict = {}
    pc = cfg.producerConfig
    if pc is not None:
        if pc.maxPendingMessages is not None:
            kwargs["max_pending_messages"] = pc.maxPendingMessages
        if pc.maxPendingMessagesAcrossPartitions is not None:
            kwargs["max_pending_messages_across_partitions"] = pc.maxPendingMessagesAcrossPartitions
        if pc.compressionType is not None:
            kwargs["compression_type"] = COMPRESSION[pc.compressionType]
    if cfg.batchBuilder == "KEY_BASED":
        kwargs["batching_type"] = pulsar.BatchingType.KeyBased
    return client.create_producer(
        cfg.output, block_if_queue_full=True, batching_enabled=True, batching_max_publish_delay_ms=1, **kwargs
    )


def _batch_entry(msg) -> tuple[str, int, int, int] | None:
    """The broker entry of a message that came in a batch; None for one that came alone."""
    mid = msg.message_id()
    return (msg.topic_name(), mid.partition(), mid.ledger_id(), mid.entry_id()) if mid.batch_index() >= 0 else None


def _rest_of_batch(consumer: InstanceInput, last) -> Any:
    """A drain's next message while it is the rest of the batch `last` came in, else None.

    The broker acknowledges a batch as a whole, so a drain that stopped in the middle of one would have the
    batch's processed messages redelivered with the rest: duplicates on every scale-in. The rest is already in
    the receiver queue (a batch arrives as one entry). A message of the next entry is left unprocessed and
    unacknowledged: the input closes after the loop, and the broker redelivers it to the instances that stay."""
    entry = _batch_entry(last) if last is not None else None
    if entry is None:
        return None
    try:
        msg = consumer.receive(timeout_millis=BATCH_REST_TIMEOUT_MS)
    except pulsar.PulsarException:  # none came, or the input was closed under the loop (an abandoned drain)
        return None
    return msg if _batch_entry(msg) == entry else None


INPUT_TOPIC_PROPERTY = "__pfn_input_topic__"
INPUT_MSG_ID_PROPERTY = "__pfn_input_msg_id__"


def input_properties(msg) -> dict[str, str]:
    """Pulsar's properties on an output: its input's topic and message id (the id as text, not Pulsar's
    base64 of the serialized id, so process instances behind a pipe on pulsar-lite give the same)."""
    return {INPUT_TOPIC_PROPERTY: msg.topic_name(), INPUT_MSG_ID_PROPERTY: str(msg.message_id())}


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


@dataclass
class Prepared:
    """What a warm standby makes before it knows its instance id (runtime._standby_main), so an activated
    instance starts its loop without importing the code again or waiting on the broker for a producer."""

    process: Callable[[Any, Any], Any]
    producer: pulsar.Producer | None


def prepare(client: pulsar.Client, cfg: FunctionConfig, code_path: str | None) -> Prepared:
    return Prepared(load_callable(cfg.className, code_path), create_output_producer(client, cfg) if cfg.output else None)


class Instance:
    def __init__(
        self,
        config: FunctionConfig,
        instance_id: int,
        client: pulsar.Client,
        code_path: str | None,
        state: StateBackend,
        num_instances: Callable[[], int],
        stats: InstanceStats | None = None,
        open_input: Callable[[], InstanceInput] | None = None,
        prepared: Prepared | None = None,
    ):
        self.config = config
        self.instance_id = instance_id
        self.stats = stats or InstanceStats(instance_id)
        self._client = client
        self._code_path = code_path
        self._state = state
        self._num_instances = num_instances
        # Where messages come from: the instance's own consumer (Apache Pulsar), or on pulsar-lite
        # a lease on the function's one shared consumer (broker/lite/shared_input.py) with the same methods.
        self._open_input = open_input or self._subscribe
        self._prepared = prepared
        self._stop = threading.Event()
        self._input: InstanceInput | None = None  # what abandon() closes
        # Outputs in flight = sent - completed; each counter has a single writer, so no lock on the hot path.
        self._sent = 0
        self._completed = 0
        # autoAck false / MANUAL: messages the function has not acked yet, by message id (Context.ack).
        self._unacked: dict[str, object] = {}
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
        consumer: InstanceInput | None = None
        producer: pulsar.Producer | None = None
        ctx: InstanceContext | None = None
        log_handler: TopicLogHandler | None = None
        try:
            if cfg.logTopic:
                log_handler = TopicLogHandler(self._client.create_producer(cfg.logTopic, block_if_queue_full=True))
                self.logger.addHandler(log_handler)
                self.logger.setLevel(logging.INFO)  # what a function logs at INFO must reach its topic
            prepared = self._prepared or prepare(self._client, cfg, self._code_path)
            process, producer = prepared.process, prepared.producer
            consumer = self._input = self._open_input()
            self.stats.pending_outputs = lambda: self._sent - self._completed
            self._state.attach_changelog(self._client, changelog_of(cfg))
            ctx = InstanceContext(
                cfg,
                self.instance_id,
                self._num_instances,
                self._client,
                self.stats,
                self._state,
                self.logger,
                track_pending=self._track_pending,
                ack=self._user_ack,
            )
            self.stats.set_running(True)
            self._loop(consumer, producer, ctx, process)
            self._wait_pending(DRAIN_TIMEOUT_S)
            self._state.flush(everything=True)  # the acks waiting for state changes go out before the close
            self.stats.set_running(False)
        except Exception as exc:  # a system failure: record it where status shows it
            self.logger.exception("instance failed")
            self.stats.on_exception(exc, user=False)
            self.stats.set_running(False, error=f"{type(exc).__name__}: {exc}")
        finally:
            if log_handler is not None:
                self.logger.removeHandler(log_handler)
            closable: _Closable | None
            for closable in (ctx, producer, consumer, log_handler):
                if closable is not None:
                    try:
                        closable.close()
                    except Exception:  # closing after a broker failure must not hide the original error
                        pass

    def _user_ack(self, msgid, _topic) -> None:
        msg = self._unacked.pop(str(msgid), None)
        if msg is None:
            raise ValueError(f"message {msgid} was not delivered to this instance or is acked already")
        assert self._input is not None  # only the loop puts messages in _unacked, after run() opened the input
        self._input.acknowledge(msg)

    def _loop(self, consumer, producer, ctx: InstanceContext, process) -> None:
        cfg = self.config
        at_most_once = cfg.processingGuarantees == "ATMOST_ONCE"
        auto_ack = cfg.auto_ack and not at_most_once  # ATMOST_ONCE acks on receipt instead
        output_serde = load_serde(cfg.outputSerdeClassName, self._code_path)
        input_serdes = {t: load_serde(c, self._code_path) for t, c in cfg.customSerdeInputs.items()}
        stats = self.stats
        # Only the instance's own consumer (or a fence's wrapper of one) closes with the loop, so only there may a
        # drain take a message it leaves unprocessed (the broker redelivers it); a mailbox or a pipe would strand it.
        finishes_batches = isinstance(consumer, pulsar.Consumer) or getattr(consumer, "is_consumer", False)
        last = None
        while True:
            if self._stop.is_set():
                msg = _rest_of_batch(consumer, last) if finishes_batches else None
                if msg is None:
                    break
            else:
                try:
                    msg = consumer.receive(timeout_millis=RECEIVE_TIMEOUT_MS)
                except pulsar.Timeout:
                    stats.connected = is_connected(consumer)
                    continue
            last = msg
            if not stats.connected:  # only while it was seen down: no broker call on the hot path
                stats.connected = is_connected(consumer)
            stats.on_received(msg.publish_timestamp())
            if at_most_once:
                consumer.acknowledge(msg)
            elif not auto_ack:
                self._unacked[str(msg.message_id())] = msg
            if not ctx.begin_message(msg):  # EFFECTIVELY_ONCE: applied before, only its ack was lost
                self._unacked.pop(str(msg.message_id()), None)
                consumer.acknowledge(msg)
                continue
            start = time.perf_counter()
            stats.busy_since_ms = int(time.time() * 1000)
            ok = False
            try:
                serde = input_serdes.get(msg.topic_name()) if input_serdes else None
                result = process(serde.deserialize(msg.data()) if serde else identity_deserialize(msg.data()), ctx)
                # A result the serde cannot serialize is the function's fault: a user exception, retried
                # and dead-lettered like one, never an instance crash.
                payload = None if result is None or producer is None else output_serde.serialize(result)
                ok = True
            except Exception as exc:
                stats.on_processed(time.perf_counter() - start, ok=False)
                stats.on_exception(exc, user=True)
                self.logger.warning("user exception: %s: %s", type(exc).__name__, exc)
                if not at_most_once:
                    self._unacked.pop(str(msg.message_id()), None)
                    consumer.negative_acknowledge(msg)
                continue
            finally:
                ctx.end_message(ok)
                stats.busy_since_ms = 0
            stats.on_processed(time.perf_counter() - start, ok=True)
            if payload is None:
                if auto_ack:  # once the message's state changes are in the changelog
                    ctx.when_state_persisted(lambda m=msg: consumer.acknowledge(m))
                continue
            self._produce(consumer, producer, msg, payload, auto_ack, not at_most_once)

    def _produce(self, consumer, producer, msg, payload: bytes, ack: bool, nack_on_failure: bool) -> None:
        """ATLEAST_ONCE: the input is acked only once the output and its state changes are persisted."""
        self._sent += 1

        def done(result, _msg_id):
            try:
                if result == pulsar.Result.Ok:
                    self.stats.on_output()
                    if ack:  # and once the message's state changes are in the changelog
                        self._state.when_persisted(lambda: consumer.acknowledge(msg))
                else:
                    self.stats.on_output_failed(result)
                    if nack_on_failure:
                        consumer.negative_acknowledge(msg)
            finally:
                self._completed += 1

        # The source's event time travels with every output, so response time is measured end to end;
        # forwardSourceMessageProperty (Pulsar's default) copies the input's properties; as Pulsar's
        # instance does, every output names its input (what `trigger` waits for).
        props = (
            {**msg.properties(), **input_properties(msg)} if self.config.forwardSourceMessageProperty else input_properties(msg)
        )
        kwargs: dict = {"event_timestamp": source_event_time(msg), "properties": props}
        key = msg.partition_key()
        if key:
            kwargs["partition_key"] = key
        producer.send_async(payload, done, **kwargs)
