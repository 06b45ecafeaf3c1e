"""The controller on a real broker and worker: scales a loaded function out, dry run applies
nothing, and with two replicas a kill -9 of the leader hands over without double execution."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid

import pytest
import requests
import yaml

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.netutil import free_port
from tests.support.commands import CLI
from tests.support.controller import TOGGLE, config, load, make_function
from tests.support.scenario import wait_until


@pytest.mark.parametrize("dry_run", [False, True])
def test_controller_scales_out_a_loaded_function(broker, worker, tmp_path, dry_run):
    name = make_function(worker, service_ms=50)  # mu = 20/s per instance
    stop = threading.Event()
    producer = threading.Thread(target=load, args=(broker, f"{name}-in", 40.0, stop), daemon=True)  # rho = 2 at k=1
    producer.start()
    controller = Controller(config(broker, worker, tmp_path, dry_run=dry_run)).start()
    admin = FunctionsAdmin(worker.url)
    fqfn = f"public/default/{name}"
    try:

        def decided():
            return [r for r in controller.log.read() if r["function"] == fqfn and r["new"] > r["old"]]

        records = wait_until(decided, 40, f"a scale-out decision for {fqfn} in the decision log")
        first = records[0]
        assert first["epoch"] == 1 and first["inputs"]["arrival_rate"] > 20
        assert first["dry_run"] is dry_run and first["applied"] is (not dry_run)
        assert first["new"] >= 2 and "lambda" in first["reason"]
        parallelism = admin.get("public", "default", name)["parallelism"]
        if dry_run:
            assert parallelism == 1, "dry run changed the function"
        else:
            wait_until(
                lambda: admin.get("public", "default", name)["parallelism"] == decided()[-1]["new"],
                10,
                "the worker to run what the controller applied",
            )
        status = requests.get(f"http://127.0.0.1:{controller.http_port}/status", timeout=5).json()
        assert status["leader"] and status["epoch"] == 1
        metrics = requests.get(f"http://127.0.0.1:{controller.http_port}/metrics", timeout=5).text
        # decisions counts applied changes only: a dry run's recommendations are in the log, not there
        counted = f'pulsar_autoscale_decisions_total{{direction="out",function="{fqfn}"}}' in metrics
        assert counted is (not dry_run)
    finally:
        stop.set()
        controller.stop()


def test_policy_errors_are_counted_and_the_loop_goes_on(broker, worker, tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from pulsar_autoscale.policies import Policy\n"
        "class Bad(Policy):\n    name = 'bad'\n"
        "    def decide(self, graph, snapshot, current, state):\n        return {f: -1 for f in current}\n"
    )
    make_function(worker, service_ms=1)
    controller = Controller(config(broker, worker, tmp_path, policy=str(bad), period_s=0.5)).start()
    try:
        wait_until(lambda: len([i for i in controller.history if i.errors]) >= 2, 30, "two periods with a contained policy error")
        assert "returned dict, not a Proposal" in controller.history[-1].errors[-1]
        records = controller.log.read()  # every evaluation is logged, a failed one with its error
        assert records and all(r["error"] and not r["applied"] and r["new"] == r["old"] for r in records)
    finally:
        controller.stop()


def test_config_errors_name_the_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("service_url: pulsar://127.0.0.1:1\nadmin_url: http://127.0.0.1:2\nperiod: 5\n")
    with pytest.raises(ConfigError, match="unknown option\\(s\\) period; valid options: service_url"):
        ControllerConfig.from_file(path)
    proc = subprocess.run(
        [*CLI, "controller", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "unknown option(s) period" in proc.stderr and "Traceback" not in proc.stderr


def test_kill_9_of_the_leader_hands_over_without_double_execution(broker, worker, tmp_path):
    name = make_function(worker, service_ms=1)
    fqfn = f"public/default/{name}"
    policy = tmp_path / "toggle.py"
    policy.write_text(TOGGLE)
    lock = f"persistent://public/default/lock-{uuid.uuid4().hex[:6]}"
    procs, ports = {}, {}
    for ident in ("A", "B"):
        ports[ident] = free_port()
        cfg = tmp_path / f"{ident}.yaml"
        cfg.write_text(
            yaml.safe_dump(
                {
                    "service_url": broker.service_url,
                    "admin_url": worker.url,
                    "metrics_url": broker.metrics_url,
                    "policy": str(policy),
                    "period_s": 1.0,
                    "window_s": 2.0,
                    "lock_topic": lock,
                    "identity": ident,
                    "http_port": ports[ident],
                    "decision_log": str(tmp_path / f"{ident}.jsonl"),
                }
            )
        )
        procs[ident] = subprocess.Popen(
            [*CLI, "controller", "--config", str(cfg)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if ident == "A":  # A first, so A leads
            wait_until(lambda: _status(ports["A"]).get("leader"), 30, "A to lead")

    def records(ident):
        path = tmp_path / f"{ident}.jsonl"
        return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []

    try:
        wait_until(lambda: len(records("A")) >= 3, 30, "A to make 3 decisions")
        assert not _status(ports["B"]).get("leader"), "two leaders"
        os.kill(procs["A"].pid, signal.SIGKILL)
        killed = time.time()
        wait_until(lambda: _status(ports["B"]).get("leader"), 30, "B to lead after kill -9 of A", interval_s=0.05)
        takeover = time.time() - killed
        wait_until(lambda: len(records("B")) >= 3, 30, "B to make 3 decisions")
        print(f"\nstandby leads {takeover:.2f}s after kill -9 of the leader")
        a, b = records("A"), records("B")
        assert {r["epoch"] for r in a} == {1} and {r["epoch"] for r in b} == {2}
        assert max(r["time"] for r in a) < min(r["time"] for r in b), "two epochs acted in the same period"
        # no decision executed twice: every applied change starts where the previous one ended
        chain = sorted((r for r in a + b if r["function"] == fqfn and r["applied"]), key=lambda r: r["time"])
        for prev, cur in zip(chain, chain[1:]):
            assert cur["old"] == prev["new"], f"decision applied twice or lost: {prev} then {cur}"
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def _status(port: int) -> dict:
    try:
        return requests.get(f"http://127.0.0.1:{port}/status", timeout=2).json()
    except (requests.RequestException, ValueError):
        return {}
