"""Pulsar's `functions trigger`: send a value to a function's input and wait for the output it causes.

As Pulsar's worker does it: listen on the output topic from now, publish the value to the input
topic, and return the first output whose `__pfn_input_topic__`/`__pfn_input_msg_id__` properties
name that message. The listener is a throwaway Shared subscription (not a Reader: a Reader opened
on a topic without messages can stall on pulsar-lite, docs/dev/pulsar-lite-defects.md), removed afterwards.
"""

from __future__ import annotations

import time
import uuid

import pulsar

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.functions.instance.instance import INPUT_MSG_ID_PROPERTY, INPUT_TOPIC_PROPERTY
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.topics import normalize_topic

TRIGGER_TIMEOUT_S = 10.0


class TriggerTimeout(PulsarAutoscaleError):
    """No output for the triggered message in time (REST: 408, as Pulsar answers)."""

    http_status = 408


def trigger_topic(cfg: FunctionConfig, topic: str | None) -> str:
    """The input to send to: the one named (it must be an input), else the function's only input."""
    if topic:
        t = normalize_topic(topic, cfg.tenant, cfg.namespace)
        if t not in cfg.inputs:
            raise ConfigError(f"Function {cfg.name} does not consume from topic {t} (inputs: {', '.join(cfg.inputs)})")
        return t
    if len(cfg.inputs) != 1:
        raise ConfigError(f"Function {cfg.name} has {len(cfg.inputs)} input topics: name one with the topic part (--topic)")
    return cfg.inputs[0]


def trigger(
    client: pulsar.Client, cfg: FunctionConfig, value: bytes, topic: str | None = None, timeout_s: float = TRIGGER_TIMEOUT_S
) -> bytes | None:
    """The function's output for `value` (None when it has no output topic: the value is only sent)."""
    input_topic = trigger_topic(cfg, topic)
    listener = None
    if cfg.output:
        listener = client.subscribe(
            cfg.output,
            f"__trigger-{uuid.uuid4().hex[:12]}",
            consumer_type=pulsar.ConsumerType.Shared,
            initial_position=pulsar.InitialPosition.Latest,
        )
    try:
        producer = client.create_producer(input_topic)
        try:
            msg_id = str(producer.send(value))
        finally:
            producer.close()
        if listener is None:
            return None
        deadline = time.monotonic() + timeout_s
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            try:
                out = listener.receive(timeout_millis=left_ms)
            except pulsar.Timeout:
                break
            listener.acknowledge(out)
            props = out.properties()
            if props.get(INPUT_TOPIC_PROPERTY) == input_topic and props.get(INPUT_MSG_ID_PROPERTY) == msg_id:
                return out.data()
        raise TriggerTimeout(
            f"Request Timed Out: no output of {cfg.fqfn} on {cfg.output} for the triggered "
            f"message {msg_id} within {timeout_s:.0f} s (did the function raise or return None?)"
        )
    finally:
        if listener is not None:
            try:
                listener.unsubscribe()
            except pulsar.PulsarException:
                listener.close()
