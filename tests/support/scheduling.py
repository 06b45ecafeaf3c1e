"""How `make test` spreads the suite over its pytest-xdist processes: by module (`--dist loadfile`), the
longest-running modules first, so that the pass does not end with one process on a long cluster or Spark
module while the other has nothing left to do.

xdist's own order puts the modules with the most tests first: the unit modules, whose hundreds of tests take
seconds, and last the system modules, whose few tests take minutes each. Here the order is the tiers' (system,
integration, unit), and the Spark modules go first as one unit of work: they share one Spark session per
process (tests/system/spark/conftest.py), and each process that runs one of them pays a Spark start.
"""

from __future__ import annotations

from collections import OrderedDict

from xdist.scheduler import LoadFileScheduling

SPARK = "tests/system/spark/"
# a Spark module that starts its drivers in subprocesses of its own, not the shared session
OWN_DRIVERS = ("tests/system/spark/test_cluster.py",)
TIER_ORDER = ("tests/system/", "tests/integration/", "tests/unit/")


def _rank(scope: str) -> int:
    if scope == SPARK:
        return -1
    return next((i for i, prefix in enumerate(TIER_ORDER) if scope.startswith(prefix)), len(TIER_ORDER))


class LongestFirst(LoadFileScheduling):
    def _split_scope(self, nodeid: str) -> str:
        scope = super()._split_scope(nodeid)
        return SPARK if scope.startswith(SPARK) and scope not in OWN_DRIVERS else scope

    def _assign_work_unit(self, node) -> None:
        if not getattr(self, "_ordered", False):  # the work queue is complete once the first unit is handed out
            self.workqueue = OrderedDict(sorted(self.workqueue.items(), key=lambda item: _rank(item[0])))
            self._ordered = True
        super()._assign_work_unit(node)
