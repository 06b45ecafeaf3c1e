"""The app graph: nodes, edges through topics, sources, sinks, paths, order, cycles."""

from __future__ import annotations

import pytest

from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.graph import AppGraph, FunctionNode, GraphError


def diamond() -> AppGraph:
    # src -> a -> x -> {b, c}; b -> y, c -> z; d reads y and z (fan-out at a, fan-in at d)
    return AppGraph.build(
        [
            FunctionNode("d", ("y", "z"), None),
            FunctionNode("c", ("x",), "z"),
            FunctionNode("b", ("x",), "y"),
            FunctionNode("a", ("src",), "x"),
        ]
    )


def test_fan_out_fan_in():
    g = diamond()
    assert g.source_topics == frozenset({"src"})
    assert g.sinks == ("d",)
    assert g.downstream("a") == ("b", "c") and g.upstream("d") == ("b", "c")
    assert g.upstream("a") == () and g.downstream("d") == ()
    assert set(g.paths) == {("a", "b", "d"), ("a", "c", "d")} and len(g.paths) == 2


def test_topological_order_puts_every_function_after_its_upstream():
    g = diamond()
    order = g.topological_order()
    assert sorted(order) == ["a", "b", "c", "d"]
    for f in order:
        assert all(order.index(u) < order.index(f) for u in g.upstream(f))
    assert order == ("a", "b", "c", "d")  # ties in name order: reproducible


def test_the_papers_application_has_two_paths():
    # images -> resize1 -> store (sink, no output); images -> resize2 -> recognize
    g = AppGraph.build(
        [
            FunctionNode("resize1", ("images",), "small"),
            FunctionNode("store", ("small",)),
            FunctionNode("resize2", ("images",), "medium"),
            FunctionNode("recognize", ("medium",), "labels"),
        ]
    )
    assert g.source_topics == {"images"}
    # a function whose output nobody consumes is a sink, as is one without an output
    assert set(g.sinks) == {"store", "recognize"}
    assert set(g.paths) == {("resize1", "store"), ("resize2", "recognize")}


def test_a_function_fed_by_a_source_and_a_function_starts_paths_too():
    g = AppGraph.build([FunctionNode("a", ("s1",), "x"), FunctionNode("b", ("x", "s2"), None)])
    assert g.source_topics == {"s1", "s2"}
    assert g.is_source("b") and g.is_source("a")
    assert set(g.paths) == {("a", "b"), ("b",)}


def test_topics_are_compared_as_given():
    g = AppGraph.build([FunctionNode("a", ("src",), "persistent://t/n/x"), FunctionNode("b", ("t/n/x",), None)])
    assert g.downstream("a") == () and g.source_topics == {"src", "t/n/x"}


@pytest.mark.parametrize(
    "nodes, message",
    [
        ([FunctionNode("a", ("x",), "y"), FunctionNode("b", ("y",), "x")], "cycle: a -> b -> a"),
        ([FunctionNode("a", ("x",), "x")], "cycle: a -> a"),
        # a cycle b -> c -> d -> b behind a source function, with a sink e hanging off it
        (
            [
                FunctionNode("a", ("src",), "t1"),
                FunctionNode("b", ("t1", "t4"), "t2"),
                FunctionNode("c", ("t2",), "t3"),
                FunctionNode("d", ("t3",), "t4"),
                FunctionNode("e", ("t3",), None),
            ],
            "cycle: b -> c -> d -> b",
        ),
    ],
)
def test_a_cycle_is_rejected_and_named(nodes, message):
    with pytest.raises(GraphError) as err:
        AppGraph.build(nodes)
    assert str(err.value) == message
    assert isinstance(err.value, PulsarAutoscaleError)


def test_a_duplicated_function_is_rejected():
    with pytest.raises(GraphError, match="function a appears twice"):
        AppGraph.build([FunctionNode("a", ("x",), None), FunctionNode("a", ("y",), None)])


def test_large_layered_graph_builds_without_enumerating_paths():
    # 100 layers of 2 functions, each reading both of the layer before: 2^99 paths, but
    # build() and topological order must not enumerate them
    nodes = [
        FunctionNode(f"f{layer}.{i}", ("src",) if layer == 0 else (f"t{layer - 1}.0", f"t{layer - 1}.1"), f"t{layer}.{i}")
        for layer in range(100)
        for i in range(2)
    ]
    g = AppGraph.build(nodes)
    assert len(g) == 200 and g.sinks == ("f99.0", "f99.1")
    assert g.topological_order()[:2] == ("f0.0", "f0.1")
