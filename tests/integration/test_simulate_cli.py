"""`pulsar-autoscale simulate` as a user runs it: JSON out, plots, one-line errors."""

from __future__ import annotations

import json
import subprocess

from tests.support.commands import CLI


def cli(*args):
    return subprocess.run([*CLI, "simulate", *args], capture_output=True, text=True, timeout=120)


def test_cli_json_smoke(tmp_path):
    proc = cli(
        "--app",
        "paper-image",
        "--workload",
        "burst",
        "--policy",
        "predictive",
        "--param",
        "drain_s=10",
        "--seed",
        "2",
        "--json",
        "--plot",
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in (
        "mean_rt_s",
        "p95_rt_s",
        "p99_rt_s",
        "max_rt_s",
        "slo_violation_share",
        "avg_instances",
        "instance_seconds",
        "efficiency",
        "scaling_actions",
        "lost",
    ):
        assert key in out
    assert out["lost"] == 0
    assert list(tmp_path.glob("*.png"))


def test_cli_bad_param_is_one_line_without_traceback():
    proc = cli("--policy", "queueing", "--param", "nonsense=1")
    assert proc.returncode == 2
    assert "nonsense" in proc.stderr and "Traceback" not in proc.stderr
