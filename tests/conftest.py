"""Shared fixtures: a real pulsar-lite broker on free ports with a temporary data dir.

Tiers by directory: tests/unit (no broker, no subprocess, no Spark), tests/integration (the session
broker and single workers), tests/system (worker clusters, faults, property tests, Spark, the quick tour).
Each test gets its tier's marker, so `-m unit` and the like select a tier.

`--broker apache` runs the broker-sensitive tests against Apache Pulsar standalone (fetched through Maven,
started once per session on free ports) instead of the embedded pulsar-lite. pulsar-lite's known defects
are fenced here, in one place: a test marked `lite_defect` is a strict xfail on pulsar-lite and must pass
on Apache Pulsar (or it is not a defect of pulsar-lite).
"""

from __future__ import annotations

import os
import uuid

import pytest

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.embedded import EmbeddedBroker

# Every Apache Pulsar standalone the tests start (and the commands they run start) compiles with C1 only: a start
# costs about half the CPU, on 2 cores that two test processes share (docs/dev/benchmark-log.md). The other two
# options are conf/pulsar_env.sh's defaults, which a set PULSAR_EXTRA_OPTS replaces. Benchmarks start theirs
# without it.
os.environ.setdefault(
    "PULSAR_EXTRA_OPTS",
    "-Dpulsar.allocator.exit_on_oom=true -Dio.netty.recycler.maxCapacityPerThread=4096 -XX:TieredStopAtLevel=1",
)
TIERS = ("unit", "integration", "system")
BROKERS = ("lite", "apache")
# What runs against Apache Pulsar with --broker apache (paths under tests/, test modules, or one test as
# module::name): the tests whose claims are about the broker and our use of it. Everything else is
# broker-independent or pulsar-lite's own.
ON_APACHE = (
    "integration/broker_conformance/",
    "integration/controller/test_leader.py::test_a_replica_that_cannot_record_its_term_lets_the_lock_go",
    "integration/worker/test_runtime_scaling.py",
    "integration/worker/test_worker_api.py",
    "integration/worker/test_function_semantics.py",
    "integration/keyed/",
    "integration/state/",
    "integration/stock/",
    "integration/planning/",
    "integration/worker/test_warm_pool.py",
    "integration/controller/test_fast_live.py",
    "system/test_apache_security.py",
    "system/test_apache_standalone.py",
    "system/test_stock_apache.py",
    "system/test_quick_tour.py::test_quick_tour_on_apache_pulsar",
    # worker clusters and faults on a real broker (not here, for time, though they pass on Apache too:
    # cluster/test_join.py, faults/test_broker_down_at_start.py and the burst drain of cluster/test_cluster.py)
    "system/cluster/test_cluster.py::test_members_leader_and_assignments_are_real",
    "system/cluster/test_cluster.py::test_create_anywhere_scale_anywhere_no_restarts",
    "system/cluster/test_cluster.py::test_controller_admin_fails_over_and_reads_the_clusters_capacity",
    "system/cluster/test_failover.py",
    "system/cluster/test_instance_control.py",
    "system/cluster/test_metadata_sync.py",
    "system/cluster/test_zero_parallelism.py",
    "system/faults/test_broker_hung_status.py",
    "system/faults/test_broker_stop.py",
    "system/faults/test_broker_wrapper.py",
    "system/faults/test_leader_stop.py",
    "system/faults/test_worker_crash.py",
    "system/spark/test_source_sink.py",
    "system/spark/test_native_reader.py",
    "system/spark/test_ranges.py",
    "system/spark/test_burst.py",
    "system/keyed/test_cluster.py::test_kill9_in_the_middle_of_live_migrations_loses_and_doubles_nothing",
    "system/keyed/test_cluster_controls.py::test_an_update_of_the_retries_reaches_the_keyed_input",
    "system/spark/test_stateful.py",
)


def pytest_addoption(parser):
    parser.addoption(
        "--broker",
        choices=BROKERS,
        default=os.environ.get("PULSAR_AUTOSCALE_TEST_BROKER", "lite"),
        help="the broker the broker-sensitive tests run on: the embedded pulsar-lite (default) or "
        "Apache Pulsar standalone (only the tests listed in tests/conftest.py ON_APACHE run)",
    )


def pytest_collection_modifyitems(config, items):
    kind = config.getoption("--broker")
    kept, dropped = [], []
    for item in items:
        rel = item.path.relative_to(config.rootpath / "tests").as_posix()
        tier = rel.split("/")[0]
        if tier in TIERS:
            item.add_marker(tier)
        test_id = rel + item.nodeid[len(item.nodeid.split("::", 1)[0]) :]  # path::name[params]
        if kind == "apache" and not test_id.startswith(ON_APACHE):
            dropped.append(item)
            continue
        kept.append(item)
        for mark in item.iter_markers("lite_defect"):
            if kind == "lite":
                item.add_marker(
                    pytest.mark.xfail(
                        strict=mark.kwargs.get("strict", True), reason=mark.kwargs["reason"], raises=mark.kwargs.get("raises")
                    )
                )
        for mark in item.iter_markers("lite_only"):
            if kind != "lite":
                item.add_marker(pytest.mark.skip(reason=f"pulsar-lite only: {mark.args[0]}"))
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (make test): the Spark modules in one process (tests/support/scheduling.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.support.scheduling import SparkTogether

    return SparkTogether(config, log)


@pytest.fixture(scope="session")
def broker_kind(request) -> str:
    return request.config.getoption("--broker")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that ran a worker cluster (a `cluster` fixture) reports its workers' log tails."""
    report = (yield).get_result()
    cluster = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None
    if report.when == "call" and report.failed and hasattr(cluster, "log_tails"):
        report.sections.append(("worker logs", cluster.log_tails()))


@pytest.fixture(scope="session")
def session_broker(tmp_path_factory, broker_kind):
    """One broker per test process: pulsar-lite, or Apache Pulsar standalone (a JVM of about 1 GB, 30-60 s to start)."""
    if broker_kind == "apache":
        from pulsar_autoscale.broker.apache import ApacheStandalone

        with ApacheStandalone(data_dir=str(tmp_path_factory.mktemp("apache"))) as b:
            yield b
        return
    with EmbeddedBroker(data_dir=str(tmp_path_factory.mktemp("broker"))) as b:
        yield b


@pytest.fixture(scope="session")
def broker(session_broker):
    """The broker the tests talk to: the session's (tests/system/ gives each of its modules a pulsar-lite of its own)."""
    return session_broker


@pytest.fixture
def topic():
    """A fresh topic name per test, so tests sharing the session broker never see each other's data."""
    return f"persistent://public/default/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def worker(broker, tmp_path_factory):
    """A worker of the test module's own (its functions and state are the module's), on the session broker.
    Modules that need other worker options define their own `worker`."""
    from pulsar_autoscale.functions.api.server import WorkerServer

    with WorkerServer(broker.service_url, data_dir=str(tmp_path_factory.mktemp("worker")), metrics_url=broker.metrics_url) as w:
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
