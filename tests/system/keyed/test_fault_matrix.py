"""The state fault matrix: {keyedState, not} x {ATLEAST_ONCE, EFFECTIVELY_ONCE} x {thread, process} x {kill -9 of the
worker assigned instance 0 and its restart, SIGTERM and restart, SIGSTOP for 15 s}, on 3 workers, 40 keys, up to
50 messages each, a scale 2 -> 3 before the fault and 3 -> 2 after it, all while the load flows
(tests/support/state_matrix.py).

Checks: EFFECTIVELY_ONCE counts exact through every worker's querystate; ATLEAST_ONCE counts at least exact and the
same on every worker (one copy, every message counted) and no output lost (as many distinct outputs per key as
messages sent to it); outputs beyond one per message counted as duplicates and printed. Under EFFECTIVELY_ONCE lost outputs are
printed, not asserted: the instance commits a message's state before it sends its output, so a message whose commit
was persisted and whose output was not when its worker died is skipped when it comes again, and its output never
comes (docs/state.md, "Guarantees"; the same on one worker and with keyedState).

By default a slice runs:
  plain-alo-thread-kill9, plain-eo-thread-kill9, plain-eo-process-sigstop, keyed-eo-process-sigterm,
  keyed-alo-thread-sigstop
("plain": without keyedState). The full matrix (all 24 cells, the slice's included; 10-11 min on 2 cores):
  pytest -s -m state_matrix tests/system/keyed/test_fault_matrix.py
Its table is in docs/reliability.md, "State fault matrix".
"""

from __future__ import annotations

import pytest

from tests.support.state_matrix import Cell, all_cells, run_cell

pytestmark = pytest.mark.slow
SLICE = (
    Cell(False, "ATLEAST_ONCE", "thread", "kill9"),
    Cell(False, "EFFECTIVELY_ONCE", "thread", "kill9"),
    Cell(False, "EFFECTIVELY_ONCE", "process", "sigstop"),
    Cell(True, "EFFECTIVELY_ONCE", "process", "sigterm"),
    Cell(True, "ATLEAST_ONCE", "thread", "sigstop"),
)


def _params():
    for cell in all_cells():
        yield pytest.param(cell, id=cell.id, marks=[pytest.mark.state_matrix])


@pytest.mark.parametrize("cell", list(_params()))
def test_state_through_faults(cell: Cell, broker, client, tmp_path, request):
    if cell not in SLICE and "state_matrix" not in (request.config.getoption("-m") or ""):
        pytest.skip("the full state fault matrix: run with -m state_matrix")
    result = run_cell(cell, broker.service_url, broker.metrics_url, client, tmp_path)
    print(f"\n{result.summary()}")
    if cell.once:
        assert result.exact_keys() == 40, f"EFFECTIVELY_ONCE counts exact on every worker: {result.summary()}"
    else:
        assert result.processed_keys() == 40, f"ATLEAST_ONCE counts >= exact, one copy: {result.summary()}"
    if not cell.once:
        assert result.lost() == 0, f"outputs lost: {result.summary()}"
