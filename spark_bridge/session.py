"""The SparkSession a worker runs stateful stages and burst drains on, and the check that Spark's
Python workers can import this package.

`local[*]` by default; a Spark cluster (`spark://`, `k8s://`, `yarn`) when the worker is given
`--spark-master`. Our code runs inside Spark's Python workers (the `pulsar` source's reads and
the sink's writes, the drain's process()), so they must import `pulsar_autoscale` and its
dependencies. On a cluster the session ships the package itself (a zip of the installed
package, added with `addPyFile`, so the executors run the driver's version); the
dependencies (pulsar-client, pyarrow, pandas) must be on the executors' interpreter.
`check_python_workers` runs one small task per executor core at session start and fails with
what to set, instead of a ModuleNotFoundError deep inside the first query.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, cast

from pulsar_autoscale.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
_MASTER_RE = re.compile(r"^(local(\[(\*|\d+)(,\d+)?\])?|spark://\S+|k8s://\S+|yarn)$")
# What a Python worker imports to run our tasks.
REQUIRED_MODULES = ("pulsar_autoscale.spark_bridge.source", "pulsar", "pyarrow", "pandas")
# pyproject's package-dir: in an editable install these live outside pulsar_autoscale/.
_MAPPED_SUBPACKAGES = ("functions", "policies", "spark_bridge")
_CHECKED: set[str] = set()  # applicationIds whose Python workers passed the check


class SparkSetupError(ConfigError):
    """Spark's Python workers cannot run our code; the message says what to set."""


@dataclass(frozen=True)
class SparkSettings:
    """Where a worker's stages and drains run: `master` is Spark's master URL; `conf` extra
    Spark settings (executor memory, spark.driver.host on a multi-homed machine, ...)."""

    master: str = DEFAULT_MASTER
    conf: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _MASTER_RE.match(self.master or ""):
            raise ConfigError(
                f"spark master {self.master!r}: use local[*], local[N], spark://HOST:PORT, k8s://https://HOST:PORT or yarn"
            )

    @property
    def local(self) -> bool:
        return self.master.startswith("local")

    @classmethod
    def from_args(cls, master: str | None, conf: list[str] | None) -> "SparkSettings":
        """From the worker's `--spark-master` and `--spark-conf KEY=VALUE` flags."""
        pairs = {}
        for item in conf or []:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--spark-conf {item!r}: expected KEY=VALUE, e.g. spark.executor.memory=2g")
            pairs[key.strip()] = value
        return cls(master or DEFAULT_MASTER, pairs)


def package_zip(dest_dir: str | Path) -> Path:
    """A zip of the installed pulsar_autoscale package (every .py, in its import layout)."""
    import importlib.util

    import pulsar_autoscale

    roots = {"pulsar_autoscale": Path(pulsar_autoscale.__path__[0])}
    for name in _MAPPED_SUBPACKAGES:
        spec = importlib.util.find_spec(f"pulsar_autoscale.{name}")
        if spec is not None and spec.submodule_search_locations:
            roots[f"pulsar_autoscale/{name}"] = Path(list(spec.submodule_search_locations)[0])
    path = Path(dest_dir) / "pulsar_autoscale.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for prefix, root in roots.items():
            for src in sorted(root.rglob("*.py")):
                arcname = f"{prefix}/{src.relative_to(root).as_posix()}"
                if "__pycache__" not in arcname:
                    zf.write(src, arcname)
    return path


def _probe(_: Iterable[int]) -> Iterator[tuple[str, list[str]]]:
    """Runs in a Spark Python worker: its interpreter and the required modules it cannot import."""
    import importlib

    missing = []
    for name in REQUIRED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
    yield sys.executable, missing


def _advice(python: str) -> str:
    return (
        f"Spark runs its Python workers with {python!r}: set PYSPARK_PYTHON (before the SparkSession "
        "starts) to an interpreter that has pulsar-autoscale[spark] installed, on every Spark host, e.g. "
        "`export PYSPARK_PYTHON=$(which python)` (docs/spark.md); on a cluster ship an environment with "
        "spark.archives, or install pulsar-client, pyarrow and pandas on the executors"
    )


def check_python_workers(spark: "SparkSession") -> None:
    """Fail with SparkSetupError unless Spark's Python workers import what our tasks need.

    One small job (a task per default-parallelism slot), once per application.
    """
    sc = spark.sparkContext
    if sc.applicationId in _CHECKED:
        return
    python = sc.pythonExec
    slots = max(1, sc.defaultParallelism)
    sc.setJobDescription("pulsar-autoscale: can the Python workers import pulsar_autoscale?")
    try:
        answers = sc.parallelize(range(slots), slots).mapPartitions(_probe).collect()
    except Exception as exc:  # unpickling our probe already failed: the package is not there at all
        found = re.search(r"ModuleNotFoundError: No module named '([^']+)'", str(exc))
        if found is None:
            raise
        raise SparkSetupError(f"Spark's Python workers cannot import {found.group(1)!r}. {_advice(python)}") from None
    finally:
        # pyspark annotates `value: str`, but None (a Java null) is what clears the description.
        sc.setJobDescription(None)  # type: ignore[arg-type]
    missing = sorted({m for _, names in answers for m in names})
    if missing:
        pythons = sorted({p for p, _ in answers})
        raise SparkSetupError(f"Spark's Python workers ({', '.join(pythons)}) cannot import {missing}. {_advice(python)}")
    _CHECKED.add(sc.applicationId)


def worker_session(settings: SparkSettings | None = None, app_name: str = "pulsar-autoscale") -> "SparkSession":
    """The process's SparkSession (a test's, a Spark driver's), or a new one on `settings.master`,
    with this package shipped to a cluster's executors, checked and `pulsar` registered."""
    from pyspark.sql import SparkSession

    from . import register

    settings = settings or SparkSettings()
    # Spark's Python workers must import this package: run them on this interpreter (on a
    # cluster, the same path must exist on the executors' hosts; the check says so otherwise).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(settings.master).appName(app_name).config("spark.ui.enabled", "false")
    for key, value in settings.conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not settings.local and not getattr(spark.sparkContext, "_pulsar_autoscale_shipped", False):
        # Before register(): a Python data source takes the session's py-files when registered.
        spark.sparkContext.addPyFile(str(package_zip(tempfile.mkdtemp(prefix="pa-spark-"))))
        # Our own marker, not an attribute SparkContext declares.
        cast(Any, spark.sparkContext)._pulsar_autoscale_shipped = True
        log.info("Spark session on %s: pulsar_autoscale shipped to the executors", settings.master)
    register(spark)
    return spark
