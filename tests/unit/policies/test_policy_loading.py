"""load_policy: by entry-point name, by file path (the examples/ policy), and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.graph import AppGraph, FunctionNode
from pulsar_autoscale.policies import Policy, available_policies, load_policy
from pulsar_autoscale.policies.ds2 import DS2Policy
from pulsar_autoscale.policies.queueing import QueueingPolicy
from pulsar_autoscale.policies.threshold import ThresholdPolicy
from pulsar_autoscale.snapshot import FunctionSnapshot, Snapshot

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "policy_backlog_per_instance.py"
GRAPH = AppGraph.build([FunctionNode("t/n/f", ("src",), None), FunctionNode("t/n/g", ("src",), None)])
SNAP = Snapshot(time=0.0, window_s=30.0, functions={"t/n/f": FunctionSnapshot("t/n/f", 2, backlog=450.0)})

POLICY_SRC = (
    "from pulsar_autoscale.policies import Policy, Proposal\n"
    "class {name}(Policy):\n    name = '{name}'\n"
    "    def decide(self, graph, snapshot, current, state):\n"
    "        return Proposal(dict(current), {{}}, state)\n"
)


def write(tmp_path: Path, filename: str, text: str) -> str:
    path = tmp_path / filename
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("name, cls", [("threshold", ThresholdPolicy), ("queueing", QueueingPolicy), ("ds2", DS2Policy)])
def test_builtins_load_by_entry_point_name(name, cls):
    assert name in available_policies()
    policy = load_policy(name)
    assert type(policy) is cls and policy.name == name and policy.config == cls.Config()


def test_parameters_build_the_config():
    policy = load_policy("queueing", {"level": "path", "r_max_s": 2, "max-parallelism": 8})
    assert (policy.config.level, policy.config.r_max_s, policy.config.max_parallelism) == ("path", 2, 8)
    assert load_policy("threshold", {"t_out": 300}).config.t_out == 300


def test_example_policy_loads_by_path_and_decides():
    policy = load_policy(str(EXAMPLE), {"per_instance": 200})
    assert isinstance(policy, Policy) and policy.name == "backlog-per-instance"
    p = policy.decide(GRAPH, SNAP, {"t/n/f": 2, "t/n/g": 3}, None)
    # f: ceil(450 / 200) = 3; g: no figures -> keep 3
    assert p.targets == {"t/n/f": 3, "t/n/g": 3} and p.reasons["t/n/g"] == "backlog unknown: keep"
    # default 100 per instance: ceil(450 / 100) = 5
    assert load_policy(str(EXAMPLE)).decide(GRAPH, SNAP, {"t/n/f": 2}, None).targets == {"t/n/f": 5}


def test_two_files_with_the_same_name_stay_apart(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = load_policy(write(tmp_path / "one", "p.py", POLICY_SRC.format(name="First")))
    second = load_policy(write(tmp_path / "two", "p.py", POLICY_SRC.format(name="Second")))
    assert (first.name, second.name) == ("First", "Second")


def test_a_policy_attribute_chooses_among_several(tmp_path):
    text = POLICY_SRC.format(name="A") + POLICY_SRC.format(name="B") + "POLICY = B\n"
    assert load_policy(write(tmp_path, "two.py", text)).name == "B"


def test_a_plugin_that_fails_to_import_breaks_only_its_own_name(tmp_path, monkeypatch):
    """Registered exactly as an installed package registers a plugin: a dist-info with entry_points.txt."""
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pulsar_autoscale.policies]\nbroken = no_such_module_xyz:Policy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "broken" in available_policies()
    with pytest.raises(
        ConfigError,
        match=r"policy 'broken' \(no_such_module_xyz:Policy\) failed to load: "
        r"ModuleNotFoundError",
    ):
        load_policy("broken")
    assert isinstance(load_policy("threshold"), ThresholdPolicy)


@pytest.mark.parametrize(
    "spec, params, needle",
    [
        ("nope", None, "unknown policy 'nope': available ds2, "),
        ("/no/such/policy.py", None, "policy file /no/such/policy.py does not exist"),
        ("queueing", {"r_max": 1}, "unknown option(s) r_max; valid options: level, r_max_s, alpha"),
        ("queueing", {"r_max_s": "fast"}, "option r_max_s = 'fast' has the wrong type"),
        ("threshold", {"step": 1.5}, "option step = 1.5 has the wrong type"),
        ("queueing", {"level": "galaxy"}, "queueing level 'galaxy' is unknown"),
    ],
)
def test_bad_specs_name_the_problem(spec, params, needle):
    with pytest.raises(ConfigError) as err:
        load_policy(spec, params)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "text, needle",
    [
        ("raise RuntimeError('boom')\n", "raised on import: RuntimeError: boom"),
        ("def broken(:\n", "raised on import: SyntaxError"),
        ("X = 1\n", "must define exactly one Policy subclass, or set POLICY = TheClass; found 0 (none)"),
        (POLICY_SRC.format(name="A") + POLICY_SRC.format(name="B"), "found 2 (A, B)"),
        ("POLICY = 42\n", "resolves to 42, not a subclass of pulsar_autoscale.policies.Policy"),
    ],
)
def test_bad_policy_files_name_the_file_and_the_problem(tmp_path, text, needle):
    path = write(tmp_path, "user_policy.py", text)
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert needle in str(err.value) and "user_policy.py" in str(err.value)
