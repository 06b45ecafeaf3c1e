"""Spark bridge: the `pulsar` PySpark data source (batch and streaming source, and sink).

PySpark is imported only when a Spark feature is used, so the core package imports without
the `spark` extra installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .session import SparkSettings, SparkSetupError, check_python_workers, worker_session

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["SparkSettings", "SparkSetupError", "register", "worker_session"]


def register(spark: "SparkSession") -> None:
    """Make `format("pulsar")` available in this session; again is fine.

    Checks first (once per application) that Spark's Python workers can import this package,
    so a missing PYSPARK_PYTHON fails here with what to set (SparkSetupError), not with a
    ModuleNotFoundError inside the first query.
    """
    from .source import PulsarDataSource

    check_python_workers(spark)
    try:
        spark.dataSource.register(PulsarDataSource)
    except Exception as exc:
        if "DATA_SOURCE_ALREADY_EXISTS" not in str(exc):
            raise
