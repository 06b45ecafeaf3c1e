"""Shared fixtures: a real pulsar-lite broker on free ports with a temporary data dir."""

from __future__ import annotations

import uuid

import pytest

from pulsar_autoscale.broker.embedded import EmbeddedBroker


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    with EmbeddedBroker(data_dir=str(tmp_path_factory.mktemp("broker"))) as b:
        yield b


@pytest.fixture
def topic():
    """A fresh topic name per test, so tests sharing the session broker never see each other's data."""
    return f"persistent://public/default/t-{uuid.uuid4().hex[:12]}"
