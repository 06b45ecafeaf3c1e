"""The embedded broker's start when a port is taken: one it picked is picked again (free_port only proposes a
port, and another process may bind it first: a CI run failed on that); one the caller chose is an error."""

from __future__ import annotations

import socket

import pulsar
import pytest
import requests

from pulsar_autoscale.broker import embedded
from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.errors import BrokerError
from pulsar_autoscale.netutil import free_port


@pytest.fixture
def taken():
    """A port some other process holds (listening)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["client-port", "metrics-port", "pulsar-lite-port"])
def test_a_picked_port_taken_meanwhile_is_picked_again(tmp_path, monkeypatch, taken, which):
    proposals = iter([None] * which + [taken])  # that proposal is taken before the broker binds it
    monkeypatch.setattr(embedded, "free_port", lambda: next(proposals, None) or free_port())
    with EmbeddedBroker(data_dir=str(tmp_path)) as broker:
        assert taken not in (broker.port, broker.metrics_port)
        assert "pulsar_" in requests.get(broker.metrics_url, timeout=5).text
        client = pulsar.Client(broker.service_url)
        try:
            consumer = client.subscribe("persistent://public/default/ports", "s")
            client.create_producer("persistent://public/default/ports").send(b"hello")
            assert consumer.receive(timeout_millis=10_000).data() == b"hello"
        finally:
            client.close()


@pytest.mark.parametrize("which", ["port", "metrics_port"])
def test_a_port_the_caller_chose_that_is_taken_is_an_error_at_once(tmp_path, monkeypatch, taken, which, caplog):
    """One try, and no "picked for it" warning: the ports picked for it are not the problem."""
    starts = []
    real = EmbeddedBroker._start

    def counted(self):
        starts.append(1)
        return real(self)

    monkeypatch.setattr(EmbeddedBroker, "_start", counted)
    with caplog.at_level("WARNING", logger=embedded.__name__):
        with pytest.raises(BrokerError, match=f"in use|{taken}"):
            EmbeddedBroker(data_dir=str(tmp_path), **{which: taken}).start()
    assert len(starts) == 1, f"{len(starts)} starts for a port the caller chose"
    assert "picked for it" not in caplog.text
