"""Leader election among controller replicas through the broker alone.

The lock is an Exclusive subscription on a coordination topic: the broker admits one
consumer, frees it the moment the holder's connection drops (kill -9: under 10 ms on
pulsar-lite) or its keep-alive lapses (a hung holder: about 40 s). Producer access modes
would be the textbook lock, but pulsar-lite ignores them (B6); an Exclusive subscription
works on both brokers. A refused subscribe drops that client's whole connection on
pulsar-lite (B3), so the lock has a client of its own with a short operation timeout.

Each term gets an epoch, one more than the highest recorded on the epoch topic. Every
action carries it, and the worker refuses an action whose epoch is older than one it has
seen: a deposed leader that wakes up late cannot act.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass

import pulsar

from pulsar_autoscale.pulsar_client import ClientSettings, open_client

log = logging.getLogger(__name__)

EPOCH_READ_TIMEOUT_MS = 300
DEFAULT_LOCK_TOPIC = "persistent://public/default/__pulsar_autoscale_leader"


@dataclass(frozen=True)
class Term:
    epoch: int
    holder: str
    url: str | None = None  # the holder's REST API, as it advertised it: other replicas point there


class LeaderElector:
    def __init__(
        self,
        service_url: ClientSettings | str,
        lock_topic: str = DEFAULT_LOCK_TOPIC,
        identity: str | None = None,
        operation_timeout_s: int = 1,
    ):
        self.client_settings = ClientSettings.of(service_url)  # the broker, with its auth and TLS
        self.lock_topic = lock_topic
        self.epoch_topic = lock_topic + "-epochs"
        self.identity = identity or f"controller-{uuid.uuid4().hex[:8]}"
        self._timeout = operation_timeout_s
        self._client: pulsar.Client | None = None
        self._lock_consumer = None
        self._term: Term | None = None
        self._mutex = threading.Lock()
        self.url: str | None = None  # this replica's REST API, advertised with each term it wins

    @property
    def term(self) -> Term | None:
        return self._term

    def is_leader(self) -> bool:
        return self._term is not None

    def try_acquire(self) -> Term | None:
        """One attempt; returns the new term when this replica becomes leader, the current one if it is."""
        with self._mutex:
            if self._term is not None:
                return self._term
            client = self._fresh_client()
            try:
                consumer = client.subscribe(
                    self.lock_topic, "leader-lock", consumer_type=pulsar.ConsumerType.Exclusive, consumer_name=self.identity
                )
            except pulsar.PulsarException as exc:
                log.debug("%s: leader lock held elsewhere (%s)", self.identity, type(exc).__name__)
                self._drop_client()
                return None
            self._lock_consumer = consumer
            try:
                last = self._latest(client)
                term = Term((last.epoch if last else 0) + 1, self.identity, self.url)
                producer = client.create_producer(self.epoch_topic)
                producer.send(" ".join(str(f) for f in (term.epoch, term.holder, term.url) if f).encode())
                producer.close()
            except pulsar.PulsarException as exc:
                # the lock without a recorded term leads nothing and keeps every other replica out: let it go
                log.warning(
                    "%s took the leader lock but could not record a term (%s: %s); released it to try again",
                    self.identity,
                    type(exc).__name__,
                    exc,
                )
                self._drop_client()
                return None
            self._term = term
            log.info("%s is leader with epoch %d", self.identity, term.epoch)
            return term

    def check(self) -> bool:
        """Still leader? The lock consumer must be connected; a lost connection ends the term."""
        with self._mutex:
            if self._term is None:
                return False
            if self._lock_consumer is not None and self._lock_consumer.is_connected():
                return True
            log.warning("%s lost the leader lock (epoch %d)", self.identity, self._term.epoch)
            self._term = None
            self._drop_client()
            return False

    def release(self) -> None:
        with self._mutex:
            self._term = None
            self._drop_client()

    def latest(self) -> Term | None:
        """The newest term on the epoch topic, whoever holds it (None before the first election)."""
        client = open_client(self.client_settings, operation_timeout_seconds=self._timeout)
        try:
            return self._latest(client)
        finally:
            client.close()

    def _latest(self, client: pulsar.Client) -> Term | None:
        # Read to the end with a short timeout: has_message_available() fails on an empty topic on pulsar-lite.
        reader = client.create_reader(self.epoch_topic, pulsar.MessageId.earliest)
        last: Term | None = None
        try:
            while True:
                fields = reader.read_next(timeout_millis=EPOCH_READ_TIMEOUT_MS).data().decode().split()
                if last is None or int(fields[0]) > last.epoch:
                    last = Term(int(fields[0]), fields[1], fields[2] if len(fields) > 2 else None)
        except pulsar.Timeout:
            pass
        finally:
            reader.close()
        return last

    def _fresh_client(self) -> pulsar.Client:
        if self._client is None:
            self._client = open_client(self.client_settings, operation_timeout_seconds=self._timeout)
        return self._client

    def _drop_client(self) -> None:
        self._lock_consumer = None
        if self._client is not None:
            try:
                self._client.close()
            except pulsar.PulsarException:
                pass
            self._client = None
