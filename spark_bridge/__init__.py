"""Spark bridge: the `pulsar` PySpark data source (batch and streaming source, and sink).

PySpark is imported only when a Spark feature is used, so the core package imports without
the `spark` extra installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["local_session", "register"]


def register(spark: "SparkSession") -> None:
    """Make `format("pulsar")` available in this session; again is fine."""
    from .source import PulsarDataSource

    try:
        spark.dataSource.register(PulsarDataSource)
    except Exception as exc:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise


def local_session(app_name: str = "pulsar-autoscale") -> "SparkSession":
    """The process's SparkSession (a test's, a Spark driver's), or a new local one, with `pulsar`
    registered: what the worker uses for burst drains and stateful stages."""
    import os
    import sys

    from pyspark.sql import SparkSession

    # Spark's Python workers must import this package: run them on this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[*]").appName(app_name)
             .config("spark.ui.enabled", "false").getOrCreate())
    register(spark)
    return spark
