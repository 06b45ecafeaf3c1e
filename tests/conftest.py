"""Shared fixtures: a real pulsar-lite broker on free ports with a temporary data dir.

Tiers by directory: tests/unit (no broker, no subprocess, no Spark), tests/integration (the session
broker and single workers), tests/system (worker clusters, faults, property tests, Spark, the quick tour).
Each test gets its tier's marker, so `-m unit` and the like select a tier.
"""

from __future__ import annotations

import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.embedded import EmbeddedBroker

TIERS = ("unit", "integration", "system")


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = item.path.relative_to(config.rootpath).parts
        if len(parts) > 1 and parts[0] == "tests" and parts[1] in TIERS:
            item.add_marker(parts[1])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that ran a worker cluster (a `cluster` fixture) reports its workers' log tails."""
    report = (yield).get_result()
    cluster = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None
    if report.when == "call" and report.failed and hasattr(cluster, "log_tails"):
        report.sections.append(("worker logs", cluster.log_tails()))


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    with EmbeddedBroker(data_dir=str(tmp_path_factory.mktemp("broker"))) as b:
        yield b


@pytest.fixture
def topic():
    """A fresh topic name per test, so tests sharing the session broker never see each other's data."""
    return f"persistent://public/default/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def worker(broker, tmp_path_factory):
    """A worker of the test module's own (its functions and state are the module's), on the session broker.
    Modules that need other worker options define their own `worker`."""
    from pulsar_autoscale.functions.api.server import WorkerServer
    with WorkerServer(broker.service_url, data_dir=str(tmp_path_factory.mktemp("worker")),
                      metrics_url=broker.metrics_url) as w:
        yield w


@pytest.fixture
def admin(worker):
    return FunctionsAdmin(worker.url)


@pytest.fixture(scope="module")
def client(broker):
    import pulsar
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()
