"""How `make test` spreads the suite over its pytest-xdist processes: by module (`--dist loadfile`), except that
the Spark modules that share the session's Spark (tests/system/spark/conftest.py) go to one process as one unit
of work: each process that runs one of them pays a Spark start (13-40 s of a busy machine's time each).

The order stays xdist's (the units with the most tests first): handing out the longest modules first put the
system modules side by side, each slower for the other (docs/dev/benchmark-log.md).
"""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

SPARK = "tests/system/spark/"
# a Spark module that starts its drivers in subprocesses of its own, not the shared session
OWN_DRIVERS = ("tests/system/spark/test_cluster.py",)


class SparkTogether(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return SPARK if scope.startswith(SPARK) and scope not in OWN_DRIVERS else scope
