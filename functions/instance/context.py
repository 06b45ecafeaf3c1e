"""The Pulsar Python SDK's Context, backed by our instance, its producers and the state store.

State calls for a message go to its key group's store (docs/state.md); begin_message/end_message
bracket a message's state calls (EFFECTIVELY_ONCE makes them one transaction with its id)."""

from __future__ import annotations

import logging
from typing import Callable, Protocol, cast

import pulsar
from pulsar.functions.context import Context as PulsarContext

from pulsar_autoscale.functions.instance.loader import load_serde
from pulsar_autoscale.functions.instance.stats import InstanceStats
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.state.backend import GroupState, StateBackend
from pulsar_autoscale.functions.state.groups import state_group
from pulsar_autoscale.topics import normalize_topic

_NUMBER_STARTS = frozenset("+-.(iInN")


class _KeyGroup(GroupState, Protocol):
    """A key group's state as every StateBackend's group() gives it: it knows its group's number."""

    group: int


def identity_deserialize(data: bytes):
    """Pulsar's IdentitySerDe.deserialize (int, float, complex, str, else bytes), without raising
    three exceptions for every text that cannot be a number: that cost 6 us a message."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    first = text.lstrip()[:1]
    if first and (first in _NUMBER_STARTS or first.isdigit()):
        for typ in (int, float, complex):
            try:
                return typ(text)
            except ValueError:
                pass
    return text


class InstanceContext(PulsarContext):
    def __init__(
        self,
        config: FunctionConfig,
        instance_id: int,
        num_instances: Callable[[], int],
        client: pulsar.Client,
        stats: InstanceStats,
        state: StateBackend,
        logger: logging.Logger,
        track_pending: Callable[[int], None] | None = None,
        ack: Callable[[object, str | None], None] | None = None,
    ):
        self._cfg = config
        self._instance_id = instance_id
        self._num_instances = num_instances
        self._client = client
        self._stats = stats
        self._state = state
        self._logger = logger
        self._producers: dict[str, pulsar.Producer] = {}
        self._message: pulsar.Message | None = None
        # the current message's key group in `state`, or `state` between messages
        self._group_state: StateBackend | GroupState = state
        self._once = config.processingGuarantees == "EFFECTIVELY_ONCE"
        # Publishes are asynchronous: the instance counts them so that a drain waits for them.
        self._track_pending = track_pending or (lambda _n: None)
        self._ack = ack

    def set_message(self, message: pulsar.Message | None) -> None:
        self._message = message
        self._group_state = (
            self._state
            if message is None
            else self._state.group(state_group(message, self._cfg.numKeyGroups, self._cfg.keyedState))
        )

    def begin_message(self, message) -> bool:
        """Take a message; False under EFFECTIVELY_ONCE when its id is applied in its group already (its
        ack was lost): the caller acks it without processing. A redelivery is counted (the instance's
        `redeliveredTotal` in function stats): under ATLEAST_ONCE its state changes may apply twice."""
        self.set_message(message)
        redeliveries = getattr(message, "redelivery_count", None)
        if redeliveries is not None and redeliveries() > 0:
            self._stats.redelivered += 1
        group = cast(_KeyGroup, self._group_state).group  # set_message(message) set the message's group
        if self._state.begin(group, str(message.message_id()) if self._once else None):
            return True
        self.set_message(None)
        return False

    def end_message(self, ok: bool) -> None:
        """The function returned (ok) or raised: commit or abort the message's state changes; they go to the
        changelog; the input is acked through when_state_persisted()."""
        if ok:
            self._state.commit()
        else:
            self._state.abort()
        self.set_message(None)

    def when_state_persisted(self, callback) -> None:
        """Ack through this: the message's state changes reach the changelog before its ack."""
        self._state.when_persisted(callback)

    # ---- current message -------------------------------------------------------------------
    def get_message_id(self):
        return self._message.message_id() if self._message else None

    def get_message_key(self):
        return self._message.partition_key() if self._message else None

    def get_message_eventtime(self):
        return self._message.event_timestamp() if self._message else None

    def get_message_properties(self):
        return self._message.properties() if self._message else {}

    def get_current_message_topic_name(self):
        return self._message.topic_name() if self._message else None

    def get_partition_key(self):
        return self.get_message_key()

    def get_ordering_key(self):
        return self._message.ordering_key() if self._message and hasattr(self._message, "ordering_key") else None

    # ---- function identity -----------------------------------------------------------------
    def get_function_tenant(self):
        return self._cfg.tenant

    def get_function_namespace(self):
        return self._cfg.namespace

    def get_function_name(self):
        return self._cfg.name

    def get_function_id(self):
        return self._cfg.fqfn

    def get_instance_id(self):
        return self._instance_id

    def get_num_instances(self):
        return self._num_instances()

    def get_function_version(self):
        return "0"

    def get_logger(self):
        return self._logger

    def get_input_topics(self):
        return list(self._cfg.inputs)

    def get_output_topic(self):
        return self._cfg.output

    def get_output_serde_class_name(self):
        return self._cfg.outputSerdeClassName or "serde.IdentitySerDe"

    # ---- configuration -----------------------------------------------------------------------
    def get_user_config_value(self, key):
        return self._cfg.userConfig.get(key)

    def get_user_config_map(self):
        return dict(self._cfg.userConfig)

    def get_secret(self, secret_name):
        return self._cfg.secrets.get(secret_name)

    # ---- side effects ------------------------------------------------------------------------
    def record_metric(self, metric_name, metric_value):
        self._stats.record_metric(metric_name, metric_value)

    def publish(
        self,
        topic_name,
        message,
        serde_class_name="serde.IdentitySerDe",
        properties=None,
        compression_type=None,
        callback=None,
        message_conf=None,
    ):
        topic = normalize_topic(topic_name, self._cfg.tenant, self._cfg.namespace)
        producer = self._producers.get(topic)
        if producer is None:
            producer = self._client.create_producer(
                topic, block_if_queue_full=True, batching_enabled=True, batching_max_publish_delay_ms=1
            )
            self._producers[topic] = producer
        conf = dict(message_conf or {})
        if properties:
            conf["properties"] = properties
        if self._message is not None and "event_timestamp" not in conf:
            conf["event_timestamp"] = source_event_time(self._message)
        track = self._track_pending

        def _cb(result, msg_id):
            try:
                if callback:
                    callback(result, msg_id)
            finally:
                track(-1)

        track(1)
        producer.send_async(load_serde(serde_class_name).serialize(message), _cb, **conf)

    def ack(self, msgid, topic):
        """With autoAck false or MANUAL guarantees the function acks its messages (Pulsar's Python SDK)."""
        if self._ack is None:
            raise NotImplementedError("this context has no consumer to acknowledge on")
        self._state.flush_before_ack()
        self._ack(msgid, topic)

    def incr_counter(self, key, amount):
        return self._group_state.incr_counter(key, amount)

    def get_counter(self, key):
        return self._group_state.get_counter(key)

    def del_counter(self, key):
        return self._group_state.del_counter(key)

    def put_state(self, key, value):
        return self._group_state.put_state(key, value)

    def get_state(self, key):
        return self._group_state.get_state(key)

    def flush(self) -> None:
        for producer in self._producers.values():
            producer.flush()

    def close(self) -> None:
        for producer in self._producers.values():
            try:
                producer.close()
            except pulsar.PulsarException:
                pass
        self._producers.clear()


def source_event_time(message: pulsar.Message) -> int:
    """The source message's time: its event time when a producer set one, else its publish time."""
    return message.event_timestamp() or message.publish_timestamp()
