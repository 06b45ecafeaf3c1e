"""Test modules import shared helpers from tests/support/ only, never from another test module: a helper found by
importing a test module drags that module's fixtures and tests along, and ties one tier to another's files."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("tests.unit", "tests.integration", "tests.system")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_no_test_module_imports_another_test_module():
    modules = sorted((ROOT / "tests").rglob("*.py"))
    assert len(modules) > 150, f"found only {len(modules)} test files"
    crossing = {path.relative_to(ROOT).as_posix(): name for path in modules for name in _imports(path) if name.startswith(TIERS)}
    assert not crossing, f"move what these share into tests/support/: {crossing}"
