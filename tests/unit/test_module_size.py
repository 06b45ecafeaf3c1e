"""No product module over 500 lines (as `ruff format` lays it out): a module that grows past that holds more than
one concept, and the next reader should find each in a module named for it."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("pulsar_autoscale", "functions", "policies", "spark_bridge")
MAX_LINES = 500


def test_no_product_module_is_over_500_lines():
    sizes = {
        path.relative_to(ROOT).as_posix(): len(path.read_text().splitlines())
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
    }
    assert len(sizes) > 100, f"found only {len(sizes)} modules under {PRODUCT}"
    over = {name: n for name, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split each by concept): {over}"
