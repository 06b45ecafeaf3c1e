"""The system tier's broker: on pulsar-lite, one per test module. A pulsar-lite that has seen many topics and
subscriptions subscribes ever more slowly (B14, docs/dev/pulsar-lite-defects.md); late in a pass the session
broker's subscribes timed out in a worker cluster's migration. A fresh one starts in about a second. On Apache
Pulsar the session's standalone serves every module (it does not slow down so, and a start costs 30-60 s)."""

from __future__ import annotations

import pytest

from pulsar_autoscale.broker.embedded import EmbeddedBroker


@pytest.fixture(scope="module")
def broker(request, broker_kind, tmp_path_factory):
    if broker_kind == "apache":
        yield request.getfixturevalue("session_broker")
        return
    with EmbeddedBroker(data_dir=str(tmp_path_factory.mktemp("broker"))) as b:
        yield b
