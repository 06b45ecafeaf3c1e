"""One local[2] SparkSession for the whole session (start-up costs ~10 s), with `pulsar` registered."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    from pyspark.sql import SparkSession

    from pulsar_autoscale.spark_bridge import register

    # Python workers must run this venv's interpreter to import the installed package
    # (spark.pyspark.python is not honoured by the data source planner workers; the env var is).
    os.environ["PYSPARK_PYTHON"] = sys.executable

    session = (
        SparkSession.builder.master("local[2]")
        .appName("pulsar-autoscale-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def pulsar_client(broker):
    import pulsar

    client = pulsar.Client(
        broker.service_url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)
    )
    yield client
    client.close()
