"""The package layers, enforced: each package imports only those below it, and no two packages import each
other in a circle. Imports inside functions count too (they load the module all the same); only
`if TYPE_CHECKING:` imports are free, since they never run.

A layer may import any layer below it; packages in one layer are independent of each other.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Where each part of the pulsar_autoscale namespace lives (pyproject's package-dir).
SOURCES = {
    "pulsar_autoscale": "pulsar_autoscale",
    "pulsar_autoscale.functions": "functions",
    "pulsar_autoscale.policies": "policies",
    "pulsar_autoscale.spark_bridge": "spark_bridge",
}
# Highest first. The model (the top package's own modules: errors, graph, snapshot, topics, ...) is below all.
PACKAGE_LAYERS = [
    {"pulsar_autoscale.cli"},
    {"pulsar_autoscale.planning"},
    {"pulsar_autoscale.sim", "pulsar_autoscale.functions"},
    {"pulsar_autoscale.controller"},
    {"pulsar_autoscale.policies", "pulsar_autoscale.spark_bridge", "pulsar_autoscale.admin"},
    {"pulsar_autoscale.security"},
    {"pulsar_autoscale.broker"},
]
FUNCTIONS_LAYERS = ["cli", "api", "cluster", "worker", "spark", "keyed", "runtimes", "instance", "state", "model"]


def _module_files():
    for package, directory in SOURCES.items():
        base = ROOT / directory
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            name = ".".join((package, *rel))
            if package == "pulsar_autoscale" and rel and rel[0] in ("functions", "policies", "spark_bridge"):
                continue  # a symlinked checkout: counted under its own directory
            yield name, path, path.name == "__init__.py"


def _imports(name: str, path: Path, is_package: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("pulsar_autoscale")}


def _graph(depth: int) -> dict[str, dict[str, set[str]]]:
    """package -> imported package -> the modules that import it."""

    def cut(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for name, path, is_package in _module_files():
        for target in _imports(name, path, is_package):
            if cut(name) != cut(target):
                edges[cut(name)][cut(target)].add(name)
    return edges


def _rank(layers: list[set[str]], package: str) -> int | None:
    return next((i for i, layer in enumerate(layers) if package in layer), None)


def _violations(edges, layers) -> list[str]:
    out = []
    for source, targets in edges.items():
        i = _rank(layers, source)
        for target, via in targets.items():
            j = _rank(layers, target)
            if i is not None and j is not None and j <= i:
                out.append(
                    f"{source} imports {target} ({', '.join(sorted(via))}): {'same layer' if i == j else 'a higher layer'}"
                )
    return sorted(out)


def _is_package(name: str) -> bool:
    for package, directory in sorted(SOURCES.items(), key=lambda kv: -len(kv[0])):
        if name == package or name.startswith(package + "."):
            rest = name[len(package) :].lstrip(".")
            return (ROOT / directory / rest.replace(".", "/") / "__init__.py").exists()
    return False


def test_every_wing_is_in_a_layer():
    wings = {n for n, _, _ in _module_files() if n.count(".") == 1 and _is_package(n)}
    assert sorted(w for w in wings if _rank(PACKAGE_LAYERS, w) is None) == [], "add the package to PACKAGE_LAYERS"


def test_packages_import_only_layers_below():
    assert _violations(_graph(2), PACKAGE_LAYERS) == []


def test_the_model_imports_no_wing():
    model = {n for n, _, _ in _module_files() if n.count(".") == 1 and not _is_package(n)}
    bad = []
    for name, path, is_package in _module_files():
        if name in model:
            bad += [
                f"{name} imports {t}"
                for t in _imports(name, path, is_package)
                if _rank(PACKAGE_LAYERS, ".".join(t.split(".")[:2])) is not None
            ]
    assert bad == []


@pytest.mark.parametrize("depth", [2, 3])
def test_no_cycles(depth):
    """Between packages (at depth 3: the wings' sub-packages, such as functions.worker and functions.keyed)."""
    edges = {s: {t: v for t, v in ts.items() if _is_package(t)} for s, ts in _graph(depth).items() if _is_package(s)}
    seen: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for nxt in edges.get(node, {}):
            if seen.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in seen:
                visit(nxt, stack + [nxt])
        seen[node] = 2

    for node in list(edges):
        if node not in seen:
            visit(node, [node])
    assert cycles == []


def test_functions_layers():
    edges = {s: t for s, t in _graph(3).items() if s.startswith("pulsar_autoscale.functions.")}
    layers = [{f"pulsar_autoscale.functions.{n}"} for n in FUNCTIONS_LAYERS]
    assert _violations(edges, layers) == []
