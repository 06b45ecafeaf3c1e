"""What the runtime must do differently on each broker it runs on, chosen once.

The project is written for Apache Pulsar's documented behaviour. pulsar-lite has defects
(docs/dev/pulsar-lite-defects.md, B1-B18) that the modules of `broker/lite/` fence; a BrokerProfile says which of
those fences apply, so that no other code compares broker names. On APACHE every fence is off.
A worker or a burst drain turns its `broker_kind` ("auto", "apache", "pulsar-lite") into a profile
with `resolve`; "auto" reads the broker's /metrics (`detect`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import requests

from pulsar_autoscale.errors import ConfigError

log = logging.getLogger(__name__)

LITE_MARKER = 'cluster="pulsar-lite"'  # the label pulsar-lite puts on every series of its /metrics


@dataclass(frozen=True)
class BrokerProfile:
    """One broker's behaviour as the runtime needs it; each field names the defect it answers."""

    name: str  # the --broker-kind that selects it
    consumer_id_floors: bool  # B2 between clients: each client's consumer ids start at a floor of its own
    shared_process_input: bool  # B2 in a worker: process instances receive through the worker's one consumer
    failover_receiver_queue: int | None  # B1: a FAILOVER input's receiver queue (None: the function's setting)
    nack_redelivery: bool  # a FAILOVER input redelivers its nacked messages itself (B13; see APACHE)
    stall_fence: bool  # B12: inputs are reopened when the broker stops dispatching to them
    keyed_subscription: str | None  # B4, B11: a keyedState worker consumer's type (None: the function's)
    route_subscription: str  # B1, B13: a route topic's subscription (functions/keyed/route_input.py)
    function_limits: bool  # B5, B9: refuses topicsPattern and skipToLatest
    large_batches_may_stall: bool  # docs/dev/pulsar-lite-defects.md "Observed": batches over a receiver queue stall Shared

    def input_receiver_queue(self, cfg) -> int | None:
        """B1: a FAILOVER input (retainOrdering, EFFECTIVELY_ONCE) fetches `failover_receiver_queue` messages at
        a time, whatever receiverQueueSize says; None: the function's own setting."""
        return self.failover_receiver_queue if cfg.subscription_type == "FAILOVER" else None

    def keyed_subscription_type(self, subscription_type: str) -> str:
        """The subscription type of a keyedState function's worker consumer (routing.keyed_subscription_type).

        On pulsar-lite it is SHARED, never KEY_SHARED: Key_Shared leaves a closed consumer's unacked
        messages stuck (B4: a worker that leaves would strand them), and sticky hash ranges aligned to
        key groups lose messages of pipelined producers (B11: 183-253 of 400). Shared redelivers a
        closed consumer's messages (tests/integration/broker_conformance/test_shared.py), and the worker's
        router keeps each key's records in receive order on the worker. On Apache Pulsar it is unchanged.
        """
        return self.keyed_subscription or subscription_type


APACHE = BrokerProfile(
    name="apache",
    consumer_id_floors=False,
    shared_process_input=False,
    failover_receiver_queue=None,
    # Apache Pulsar does redeliver a nacked Failover message, but with redelivery count 0 (its single-active-
    # consumer dispatchers keep no redelivery tracker), so the client's DeadLetterPolicy never fires: the input
    # counts and redelivers its nacks itself here too, or a poison message under retainOrdering is retried forever.
    nack_redelivery=True,
    stall_fence=False,
    keyed_subscription=None,
    # one consumer at a time, in order: a dead consumer's unacked messages go to the next one, in order
    route_subscription="Failover",
    function_limits=False,
    large_batches_may_stall=False,
)

LITE = BrokerProfile(
    name="pulsar-lite",
    consumer_id_floors=True,
    shared_process_input=True,
    failover_receiver_queue=1,  # B1: duplicates at 10 or more (0-11 of 2,000 at 10), none seen at 1
    nack_redelivery=True,
    stall_fence=True,
    keyed_subscription="SHARED",
    # Failover delivers twice (B1) and never redelivers a nack (B13); Shared with its one consumer redelivers
    # both a nacked message and a closed consumer's unacked ones. Break before make keeps one consumer per topic.
    route_subscription="Shared",
    function_limits=True,
    large_batches_may_stall=True,
)

PROFILES = {p.name: p for p in (APACHE, LITE)}
KINDS = ("auto", *PROFILES)  # what --broker-kind accepts


def named(kind: str) -> BrokerProfile | None:
    """The profile a `broker_kind` names; None for "auto" (known once `detect` has asked the broker)."""
    if kind not in KINDS:
        raise ConfigError(f"broker kind {kind!r}: use {', '.join(KINDS)}")
    return PROFILES.get(kind)


def resolve(kind: BrokerProfile | str, metrics_url: str | None) -> BrokerProfile:
    """The profile a `broker_kind` names, "auto" asking the broker now; a profile is taken as it is."""
    if isinstance(kind, BrokerProfile):
        return kind
    return named(kind) or detect(metrics_url)


def detect(metrics_url: str | None, timeout_s: float = 2.0, stop: threading.Event | None = None) -> BrokerProfile:
    """LITE when the broker's /metrics says so, else APACHE (no metrics URL: a real cluster).

    Metrics that do not answer say nothing: with `stop` (a worker) it retries every second until
    they answer or stop is set, and never guesses; without it, it assumes Apache Pulsar and warns.
    """
    if not metrics_url:
        return APACHE
    attempt = 0
    while True:
        try:
            text = requests.get(metrics_url, timeout=timeout_s).text
            return LITE if LITE_MARKER in text else APACHE
        except requests.RequestException as exc:
            if stop is None:
                log.warning("cannot read broker metrics at %s (%s); assuming Apache Pulsar", metrics_url, exc)
                return APACHE
            if attempt % 30 == 0:
                log.warning(
                    "cannot read broker metrics at %s (%s); retrying until it answers (or give --broker-kind)", metrics_url, exc
                )
            attempt += 1
            if stop.wait(1.0):
                return APACHE
