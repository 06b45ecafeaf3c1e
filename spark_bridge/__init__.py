"""Spark bridge: the `pulsar` PySpark data source (batch and streaming source, and sink).

PySpark is imported only when a Spark feature is used, so the core package imports without
the `spark` extra installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

__all__ = ["register"]


def register(spark: "SparkSession") -> None:
    """Make `format("pulsar")` available in this session (once per SparkSession)."""
    from .source import PulsarDataSource

    spark.dataSource.register(PulsarDataSource)
