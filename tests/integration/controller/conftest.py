"""The controller tests' worker: one of each test's own, since a controller scales every function it finds."""

import pytest

from pulsar_autoscale.functions.api.server import WorkerServer


@pytest.fixture
def worker(broker, tmp_path):
    with WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), metrics_url=broker.metrics_url) as w:
        yield w
