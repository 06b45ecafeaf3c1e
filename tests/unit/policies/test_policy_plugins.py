"""A user's policy registered the way an installed plugin package registers it (the loading
errors and contained failures are in test_policy_loading.py and test_autoscaler.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies import available_policies, load_policy
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "policy_backlog_per_instance.py"
GRAPH = AppGraph.build([FunctionNode("t/n/f", ("src",), None)])
SNAP = Snapshot(time=0.0, window_s=30.0, functions={"t/n/f": FunctionSnapshot("t/n/f", 2, backlog=450.0)})


def test_example_policy_by_entry_point(tmp_path, monkeypatch):
    """Registered exactly as an installed plugin package registers it: a dist-info with entry_points.txt."""
    dist = tmp_path / "backlog_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: backlog-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[pulsar_autoscale.policies]\nbacklog-per-instance = policy_backlog_per_instance:BacklogPerInstance\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    assert "backlog-per-instance" in available_policies()
    policy = load_policy("backlog-per-instance")
    assert policy.decide(GRAPH, SNAP, {"t/n/f": 2}, None).targets == {"t/n/f": 5}  # default 100 per instance
    sys.modules.pop("policy_backlog_per_instance", None)
