"""Every benchmark under bench/ imports and answers --help: a move of the modules it uses breaks it here,
not on the day someone needs its figure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.read_text().count('__name__ == "__main__"'))


def test_the_benchmarks_are_found():
    assert len(SCRIPTS) >= 20, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_script_help(script):
    out = subprocess.run([sys.executable, str(script), "--help"], cwd=BENCH.parent, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage:" in out.stdout, f"{script.name} --help:\n{out.stdout}\n{out.stderr[-2000:]}"
