"""A plugin is checked when it is loaded, with messages that point at its own file and line; `simulate`
fails (exit 1, how often, the last error) when the policy failed in any period."""

from __future__ import annotations

import subprocess

import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.policies import load_policy
from tests.support.commands import CLI
from tests.support.doc_blocks import policy_example

HEAD = "from pulsar_autoscale.policies import Policy, Proposal\n\n"
GOOD_DECIDE = "    def decide(self, graph, snapshot, current, state):\n        return Proposal(dict(current))\n"


@pytest.mark.parametrize(
    "body, line, needle",
    [
        ("class P(Policy):\n" + GOOD_DECIDE, 3, "class P needs a class attribute name"),
        (
            "class P(Policy):\n    name = 'p'\n\n    def decide(self, snapshot, current):\n        return None\n",
            6,
            "P.decide(self, snapshot, current) cannot be called as decide(self, graph, snapshot, current, state)",
        ),
        (
            "class P(Policy):\n    name = 'p'\n\n    @staticmethod\n    def decide(graph, snapshot, current, state):\n"
            "        return None\n",
            6,
            "P.decide must be a plain method",
        ),
        (
            "class C:\n    k = 1\n\nclass P(Policy):\n    name = 'p'\n    Config = C\n" + GOOD_DECIDE,
            6,
            "P.Config must be a @dataclass of the policy's parameters (or left out), got C",
        ),
        (
            "class P(Policy):\n    name = 'p'\n\n    def decid(self, graph, snapshot, current, state):\n        return None\n",
            3,
            "class P does not define decide(self, graph, snapshot, current, state)",
        ),
        (
            "class P(Policy):\n    name = 'p'\n    def decide(self, graph, snapshot, current, state)\n        return None\n",
            5,
            "raised on import: SyntaxError",
        ),
        ("import no_such_module_xyz\n", 3, "raised on import: ModuleNotFoundError"),
    ],
)
def test_a_broken_plugin_is_reported_at_its_line(tmp_path, body, line, needle):
    path = tmp_path / "mine.py"
    path.write_text(HEAD + body)
    with pytest.raises(ConfigError) as exc:
        load_policy(str(path))
    assert needle in str(exc.value) and f"{path}:{line}" in str(exc.value), str(exc.value)


def test_simulate_fails_when_the_policy_failed(tmp_path):
    path = tmp_path / "zero.py"
    path.write_text(
        HEAD + "class Z(Policy):\n    name = 'z'\n\n    def decide(self, graph, snapshot, current, state):\n"
        "        return Proposal({fn: 1 // 0 for fn in current})\n"
    )
    proc = subprocess.run(
        [*CLI, "simulate", "--policy", str(path), "--workload", "demo", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert (
        "failed" in proc.stderr
        and f"ZeroDivisionError: integer division or modulo by zero at {path}:7" in proc.stderr
        and "Traceback" not in proc.stderr
    )
    assert '"policy_errors"' in proc.stdout  # the results are still printed, for whoever wants them


def test_the_docs_example_runs_in_simulate(tmp_path):
    proc = subprocess.run(
        [
            *CLI,
            "simulate",
            "--policy",
            policy_example(tmp_path),
            "--workload",
            "demo",
            "--param",
            "patience=3",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = __import__("json").loads(proc.stdout)
    assert out["policy_errors"] == 0 and out["scaling_actions"] > 0 and out["lost"] == 0
