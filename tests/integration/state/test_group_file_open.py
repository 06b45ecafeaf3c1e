"""Processes that open the same new group file at once (an instance process and a warm standby of one function)
all get it: SQLite answers "database is locked" at once, without its busy wait, to a switch to WAL mode while
another connection opens the file, and the open tries again."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from pulsar_autoscale.functions.state.group_files import shared

PROCESSES, FILES = 3, 60


def _open(path: str, barrier, answers) -> None:
    barrier.wait()
    try:
        shared(Path(path))
        answers.put("ok")
    except Exception as exc:
        answers.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_one_new_group_file_at_once_all_get_it(tmp_path):
    ctx = multiprocessing.get_context("fork")
    answers = ctx.Queue()
    for i in range(FILES):
        barrier = ctx.Barrier(PROCESSES)
        procs = [ctx.Process(target=_open, args=(str(tmp_path / f"kg-{i}.sqlite"), barrier, answers)) for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
    got = [answers.get(timeout=10) for _ in range(PROCESSES * FILES)]
    failed = [a for a in got if a != "ok"]
    assert not failed, f"{len(failed)} of {len(got)} opens failed: {sorted(set(failed))}"
