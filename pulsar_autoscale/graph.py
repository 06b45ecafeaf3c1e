"""The application DAG: functions are nodes, topics are edges (f -> g when f's output is an input of g).

Pulsar has no notion of an application; the Monitor rebuilds it every period from the function
configs, and the policies walk it (DS2 in topological order, path-level queueing along paths).
Topic names are compared exactly as given: callers normalize them first.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

from pulsar_autoscale.errors import PulsarAutoscaleError


class GraphError(PulsarAutoscaleError):
    """The functions do not form a DAG, or a function name appears twice."""


@dataclass(frozen=True)
class FunctionNode:
    name: str  # tenant/namespace/name
    inputs: tuple[str, ...]
    output: str | None = None


@dataclass(frozen=True)
class AppGraph:
    nodes: dict[str, FunctionNode]
    downstream_of: dict[str, tuple[str, ...]]
    upstream_of: dict[str, tuple[str, ...]]
    order: tuple[str, ...]  # topological
    source_topics: frozenset[str]  # consumed, produced by no function
    sinks: tuple[str, ...]  # no function consumes their output (or they have none)

    @classmethod
    def build(cls, nodes: Iterable[FunctionNode]) -> AppGraph:
        by_name: dict[str, FunctionNode] = {}
        for n in nodes:
            if n.name in by_name:
                raise GraphError(f"function {n.name} appears twice")
            by_name[n.name] = n
        consumers: dict[str, list[str]] = {}
        for n in by_name.values():
            for t in n.inputs:
                consumers.setdefault(t, []).append(n.name)
        produced = {n.output for n in by_name.values() if n.output is not None}
        down = {
            name: tuple(sorted(set(consumers.get(n.output, ())))) if n.output is not None else () for name, n in by_name.items()
        }
        up: dict[str, list[str]] = {name: [] for name in by_name}
        for f, gs in down.items():
            for g in gs:
                up[g].append(f)
        order = _topological(down)
        return cls(
            nodes=by_name,
            downstream_of=down,
            upstream_of={k: tuple(sorted(v)) for k, v in up.items()},
            order=order,
            source_topics=frozenset(t for t in consumers if t not in produced),
            sinks=tuple(name for name in order if not down[name]),
        )

    @cached_property
    def paths(self) -> tuple[tuple[str, ...], ...]:
        """Every source-to-sink path. Computed on first use: their number grows exponentially with
        fan-in, so policies that scale to large DAGs work on `upstream`/`downstream` instead."""
        out: list[tuple[str, ...]] = []

        def walk(node: str, prefix: tuple[str, ...]) -> None:
            path = prefix + (node,)
            if not self.downstream_of[node]:
                out.append(path)
            for g in self.downstream_of[node]:
                walk(g, path)

        for start in self.order:
            if self.is_source(start) or not self.upstream_of[start]:
                walk(start, ())
        return tuple(out)

    def topological_order(self) -> tuple[str, ...]:
        return self.order

    def upstream(self, name: str) -> tuple[str, ...]:
        return self.upstream_of[name]

    def downstream(self, name: str) -> tuple[str, ...]:
        return self.downstream_of[name]

    def is_source(self, name: str) -> bool:
        """Fed (at least partly) by a source topic rather than only by other functions."""
        return any(t in self.source_topics for t in self.nodes[name].inputs)

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)


def _topological(down: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Kahn's algorithm (ties in name order, so the order is reproducible); on a cycle, name it."""
    indegree = dict.fromkeys(down, 0)
    for gs in down.values():
        for g in gs:
            indegree[g] += 1
    ready = deque(sorted(n for n, d in indegree.items() if d == 0))
    order: list[str] = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for g in down[n]:
            indegree[g] -= 1
            if indegree[g] == 0:
                ready.append(g)
    if len(order) < len(down):
        raise GraphError(f"cycle: {' -> '.join(_find_cycle(set(down) - set(order), down))}")
    return tuple(order)


def _find_cycle(remaining: set[str], down: dict[str, tuple[str, ...]]) -> list[str]:
    """Every function Kahn could not order still has a predecessor left over (functions merely
    downstream of a cycle may have no successor left), so walk backwards until a function repeats."""
    up: dict[str, list[str]] = {n: [] for n in remaining}
    for f in remaining:
        for g in down[f]:
            if g in remaining:
                up[g].append(f)
    node = min(remaining)
    seen: list[str] = [node]
    while True:
        node = min(up[node])
        if node in seen:
            cycle = seen[seen.index(node) :] + [node]
            return cycle[::-1]
        seen.append(node)
