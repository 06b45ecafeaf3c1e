"""`plan` subcommands end to end on the simulated testbed (no broker)."""

from __future__ import annotations

import argparse
import json

import yaml

from pulsar_autoscale.planning import cli


def run(*argv) -> int:
    p = argparse.ArgumentParser()
    cli.configure_parser(p)
    return cli.run(p.parse_args(list(argv)))


def test_mst_json(capsys):
    assert run("mst", "--app", "zipf", "--parallelism", "count=3", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parallelism"] == {"parse": 1, "count": 3}
    assert out["mst"] > 0 and out["runs"] == len(out["steps"])


def test_bad_parallelism_is_a_clear_error(capsys):
    assert run("mst", "--app", "zipf", "--parallelism", "nope=3") == 2
    assert "nope=3" in capsys.readouterr().err


def test_make_writes_plan_controller_and_report(tmp_path, capsys):
    rc = run(
        "make",
        "--app",
        "linear",
        "--target-rate",
        "4000",
        "--max-parallelism",
        "4",
        "--largest-budget",
        "12",
        "--out",
        str(tmp_path),
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "predicted" in text and "parallelism" in text
    plan = json.loads((tmp_path / "plan.json").read_text())["plan"]
    assert plan["predicted_mst"] >= 4400 and plan["band"]["trusted"]
    assert yaml.safe_load((tmp_path / "controller.yaml").read_text())["plan"]["bounds"]
    assert (tmp_path / "model.png").stat().st_size > 0 and (tmp_path / "bisections.png").stat().st_size > 0
    assert "MST against budget" in (tmp_path / "report.md").read_text()


def test_make_for_a_p99_sizes_the_function_a_window_bursts_into(capsys):
    # the plan is made from throughput capacities (an SLO capacity of the windowed app is bound by the burst's
    # drain in every profile run, so it cannot tell the functions apart), then sized for the p99
    assert run("make", "--app", "windowed", "--target-rate", "6000", "--slo-p99", "2", "--json") == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["refused"] is None and set(plan["drains"]) == {"alert"}
    assert plan["parallelism"]["alert"] > 3 * plan["parallelism"]["aggregate"]
    assert plan["budget"] == sum(plan["parallelism"].values())
