"""The worker's link to the broker: its profile, this incarnation's client, and the inputs it opens.

The broker is reached in the background, so the API serves (and status tells) at once. An "auto"
worker first learns the broker's kind from its /metrics (broker/profile.py), retrying while they do
not answer and never guessing; until then no pulsar-lite fence is on, as on Apache Pulsar. Every input
the worker opens goes through here, fenced as the broker's profile says (broker/lite/).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

import pulsar

from pulsar_autoscale.broker.lite.incarnation import LiteJoinError, incarnation_client
from pulsar_autoscale.broker.lite.shared_input import SharedInput
from pulsar_autoscale.broker.lite.stalls import StallFence, fence_stalls
from pulsar_autoscale.broker.profile import APACHE, BrokerProfile, detect, named
from pulsar_autoscale.functions.instance.instance import subscribe, subscribe_fenced
from pulsar_autoscale.functions.keyed.routing import keyed_subscription_type
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.model.errors import BrokerUnavailable
from pulsar_autoscale.functions.worker.broker_watch import BrokerWatch
from pulsar_autoscale.functions.worker.hosted import HostedFunction
from pulsar_autoscale.pulsar_client import ClientSettings, open_client

log = logging.getLogger(__name__)


class BrokerLink:
    def __init__(self, settings: ClientSettings, broker_kind: str, metrics_url: str | None, closing: threading.Event):
        known = named(broker_kind)
        self.settings = settings
        self.kind = broker_kind  # as asked; what "auto" found once connect() has learnt it
        self.profile: BrokerProfile = known or APACHE  # no fence until "auto" has learnt the broker's kind
        self._metrics_url = metrics_url  # read for "auto", and by the B12 fence
        self._closing = closing
        self.stall_fence: StallFence | None = None  # set by connect() once the broker's profile is known
        self.client: pulsar.Client | None = None  # this incarnation's, set once the broker answers
        self.connected = threading.Event()
        self.waiting_for = "the broker"
        self._watch: BrokerWatch | None = None

    def connect(self, probe_topic: Callable[[], str | None]) -> pulsar.Client | None:
        """Learn the broker's profile, then open this incarnation's client (where the profile says so with
        consumer ids of its own: lite/incarnation.py) and watch the broker; None once the worker closes.
        The caller sets `client` and `connected` when it has started what waited for them."""
        if self.kind == "auto":
            self.waiting_for = f"the broker's metrics at {self._metrics_url} (to tell pulsar-lite from Apache Pulsar)"
            self.profile = detect(self._metrics_url, stop=self._closing)
            self.kind = self.profile.name
        self.stall_fence = StallFence.for_broker(self.profile, self._metrics_url)
        self.waiting_for = f"the broker at {self.settings.service_url}"
        client = None
        while client is None and not self._closing.is_set():
            try:
                client = incarnation_client(
                    self.settings, self.profile, operation_timeout_seconds=30, log_level=pulsar.LoggerLevel.Warn
                )
            except (pulsar.PulsarException, LiteJoinError) as exc:
                log.warning("cannot reach the broker at %s yet (%s); retrying", self.settings.service_url, exc)
                self._closing.wait(1.0)
        if client is not None:
            self._watch = BrokerWatch(client.get_topic_partitions, probe_topic, self._closing).start()
        return client

    def problem(self) -> str:
        """Why no instance can be running now ("" while the broker answers its probe)."""
        return self._watch.problem() if self._watch is not None else ""

    def require(self, timeout_s: float = 30.0) -> None:
        if not self.connected.wait(timeout_s):
            raise BrokerUnavailable(f"the worker is still waiting for {self.waiting_for}")

    # ---- inputs, fenced as the profile says ----------------------------------------------------------
    def subscribe(self, cfg: FunctionConfig, consumer_name: str):
        """The function's input consumer, fenced against the broker's defects: Failover's (B1, B13), and a
        broker that stops dispatching to it (B12)."""
        return fence_stalls(
            lambda: subscribe_fenced(self.client, cfg, consumer_name, self.profile),
            cfg.inputs,
            cfg.subscription_name,
            self.stall_fence,
        )

    def keyed_input(self, cfg: FunctionConfig):
        """A keyedState function's one worker consumer (its router's input), of the type the profile allows
        (B4, B11) and watched for stalls (B12)."""
        return fence_stalls(
            lambda: subscribe(self.client, cfg, cfg.fqfn, self.profile.keyed_subscription_type(keyed_subscription_type(cfg))),
            cfg.inputs,
            cfg.subscription_name,
            self.stall_fence,
        )

    def share_input(self, fn: HostedFunction) -> None:
        """Where the profile says so (B2), process instances receive through the worker's one consumer."""
        if self.profile.shared_process_input and fn.shared_input is None and fn.keyed is None:
            fn.shared_input = SharedInput(lambda: self.subscribe(fn.config, fn.config.fqfn))

    def skip_to_latest(self, cfg: FunctionConfig) -> None:
        """Pulsar's skipToLatest: a function (re)started by a create or a worker restart skips its backlog.
        Not on a scale-out: a new instance must share the backlog, not discard it."""
        consumer = subscribe(self.client, cfg, f"{cfg.fqfn}:skip")
        try:
            consumer.seek(pulsar.MessageId.latest)
        finally:
            consumer.close()

    def remove_subscription(self, cfg: FunctionConfig) -> None:
        """Pulsar's cleanupSubscription (default true): a deleted function's subscription goes with it."""
        # A client of its own and one plain consumer per topic: a refused unsubscribe closes the whole
        # connection on pulsar-lite (B3), and unsubscribing a multi-topic consumer on the worker's busy
        # client crashed the process (SIGSEGV in the C++ client) in 1 of 2 test runs.
        client = open_client(self.settings, operation_timeout_seconds=10)
        try:
            for topic in cfg.inputs:
                client.subscribe(
                    topic, cfg.subscription_name, consumer_type=pulsar.ConsumerType.Shared, consumer_name=f"{cfg.fqfn}:cleanup"
                ).unsubscribe()
        except pulsar.PulsarException as exc:
            log.warning("could not remove the subscription %s of deleted function %s: %s", cfg.subscription_name, cfg.fqfn, exc)
        finally:
            client.close()
