"""Attacks a tenant admin or an unauthenticated caller could try, each retried as the attack and asserted to
obtain nothing: a forged log line, a YAML alias bomb, a state number past 64 bits, a key file left readable."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess

import pytest
import requests

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.config_parse import parse_text
from tests.support.commands import CLI
from tests.support.scenario import EXAMPLES
from tests.support.secured_worker import ACME_ADMIN, FNS, SUPERUSER, call, function, token


def test_a_cr_lf_in_a_refused_path_writes_no_forged_log_line(worker, keys, caplog):
    forged = "2026-01-01 00:00:00 INFO pulsar_autoscale: superuser login accepted"
    with caplog.at_level(logging.INFO, logger="pulsar_autoscale.security.guard"):
        r = requests.get(
            worker.url + "/admin/v3/functions/public/default/x%0A" + forged.replace(" ", "%20"),
            headers={"Authorization": "Bearer not-a-jwt"},
            verify=keys["ca"],
            timeout=30,
        )
    assert r.status_code == 401
    lines = [line for record in caplog.records for line in record.getMessage().splitlines()]
    assert any("401 on GET" in line for line in lines), lines
    assert not any(line.startswith(forged) for line in lines), lines


def test_a_yaml_alias_bomb_is_refused_before_it_expands():
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"] + [
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)
    ]
    bomb = "\n".join(levels) + "\ntenant: public\n"
    assert len(bomb) < 1000
    with pytest.raises(ConfigError, match="aliases"):
        parse_text(bomb, "functionConfig")


def test_a_yaml_alias_bomb_sent_to_the_worker_gets_a_400_and_creates_nothing(worker, keys):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\ntenant: public\n"
    r = call(
        worker,
        keys,
        "POST",
        f"{FNS}/public/default/bomb",
        role=SUPERUSER,
        files={"functionConfig": (None, bomb, "application/yaml")},
    )
    assert r.status_code == 400 and "aliases" in r.text, (r.status_code, r.text)
    assert call(worker, keys, "GET", f"{FNS}/public/default/bomb", role=SUPERUSER).status_code == 404


def test_putstate_past_int64_is_a_400_not_a_500(worker, keys):
    cfg = function("public", "counter")
    cfg["namespace"] = "default"
    cfg["inputs"] = ["persistent://public/default/counter-in"]
    exclaim = b"from pulsar import Function\nclass Exclaim(Function):\n    def process(self, i, c):\n        return i + '!'\n"
    r = call(
        worker,
        keys,
        "POST",
        f"{FNS}/public/default/counter",
        role=SUPERUSER,
        files={"functionConfig": (None, json.dumps(cfg), "application/json"), "data": ("exclaim.py", exclaim)},
    )
    assert r.status_code in (200, 204), r.text
    try:
        for value in (2**63, -(2**63) - 1, 10**30):
            r = call(
                worker,
                keys,
                "POST",
                f"{FNS}/public/default/counter/state/n",
                role=SUPERUSER,
                files={"state": (None, json.dumps({"key": "n", "numberValue": value}), "application/json")},
            )
            assert r.status_code == 400 and "64-bit" in r.text, (value, r.status_code, r.text)
        r = call(
            worker,
            keys,
            "POST",
            f"{FNS}/public/default/counter/state/n",
            role=SUPERUSER,
            files={"state": (None, json.dumps({"key": "n", "numberValue": 2**63 - 1}), "application/json")},
        )
        assert r.status_code in (200, 204), r.text
    finally:
        call(worker, keys, "DELETE", f"{FNS}/public/default/counter", role=SUPERUSER)


def test_a_secret_key_written_over_a_readable_file_becomes_owner_only(tmp_path):
    path = tmp_path / "secret.key"
    path.write_bytes(b"old")
    os.chmod(path, 0o644)
    proc = subprocess.run(
        [*CLI, "tokens", "create-secret-key", "--output", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes() != b"old"


def test_the_token_helpers_are_the_suite_s(keys):
    """The attacks above use real tokens: a superuser token is accepted where none is refused."""
    assert token(keys, SUPERUSER)


def test_an_upload_onto_an_uploaded_file_or_directory_is_a_400_that_names_no_server_path(worker, keys):
    def upload(path: str):
        return call(
            worker,
            keys,
            "POST",
            "/admin/v3/functions/upload",
            role=SUPERUSER,
            files={"data": ("f.py", b"x = 1\n"), "path": (None, path)},
        )

    assert upload("clash/a.py").status_code in (200, 204)
    for path in ("clash/a.py/b.py", "clash"):  # a file where a directory goes; a directory where a file goes
        r = upload(path)
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert "clashes" in r.text and str(worker.worker.data_dir) not in r.text, r.text
    leftovers = [p.name for p in (worker.worker.data_dir / "packages").rglob(".*")]
    assert leftovers == [], f"half-written uploads left behind: {leftovers}"


def test_a_path_with_cr_lf_is_a_400_not_a_500(worker, keys):
    r = call(worker, keys, "GET", "/admin/v3/functions/download", role=SUPERUSER, params={"path": "a\r\nb.py"})
    assert r.status_code == 400, (r.status_code, r.text)


@pytest.mark.parametrize("field", ["inputs", "output", "logTopic", "deadLetterTopic"])
def test_a_function_may_not_read_or_write_the_internal_topics(worker, keys, field):
    cfg = function("public", f"spy-{field.lower()}")
    cfg["namespace"] = "default"
    cfg["inputs"] = ["persistent://public/default/spy-in"]
    internal = "persistent://public/default/__pulsar_autoscale_leader-controls"
    cfg[field] = [internal] if field == "inputs" else internal
    if field == "deadLetterTopic":
        cfg["maxMessageRetries"] = 3
    r = call(
        worker,
        keys,
        "POST",
        f"{FNS}/public/default/{cfg['name']}",
        role=SUPERUSER,
        files={
            "functionConfig": (None, json.dumps(cfg), "application/json"),
            "data": ("exclaim.py", b"def process(i):\n    return i\n"),
        },
    )
    assert r.status_code == 400 and "coordination topics" in r.text, (r.status_code, r.text)


def test_a_config_sent_as_a_file_part_is_held_to_the_form_field_limit(broker, tmp_path):
    """A worker whose request limit (64 MiB by default) is far above the form-field limit: a 3 MiB functionConfig
    is refused the same whether it comes as a form field or as a file part."""
    from pulsar_autoscale.functions.api.server import WorkerServer
    from pulsar_autoscale.security.serving import ServerSecurity

    cfg = {
        "tenant": "public",
        "namespace": "default",
        "name": "big",
        "className": "exclaim.Exclaim",
        "inputs": ["persistent://public/default/big-in"],
        "userConfig": {"padding": "x" * (3 << 20)},
    }
    with WorkerServer(broker.service_url, data_dir=str(tmp_path / "w"), security=ServerSecurity()) as w:
        for part in ((None, json.dumps(cfg), "application/json"), ("config.json", json.dumps(cfg), "application/json")):
            r = requests.post(f"{w.url}{FNS}/public/default/big", files={"functionConfig": part}, timeout=30)
            assert r.status_code == 413, (part[0], r.status_code, r.text[:200])
        assert requests.get(f"{w.url}{FNS}/public/default/big", timeout=30).status_code == 404


@pytest.mark.parametrize("field", ["inputs", "output", "logTopic", "deadLetterTopic", "topicsPattern", "short"])
def test_a_tenant_admin_s_function_may_not_read_or_write_another_tenant_s_topics(worker, keys, field):
    """acme's admin names a topic of tenant `other` (or a short name, which Pulsar resolves to public/default):
    403 naming the topic, nothing created; its own tenant's topics are accepted."""
    cfg = function("acme", f"reach-{field.lower()}", instanceRuntime="process")
    outside = "persistent://other/ns/secrets"
    if field == "short":
        cfg["inputs"] = ["secrets"]
    elif field == "topicsPattern":
        cfg.pop("inputs")
        cfg["topicsPattern"] = "persistent://other/ns/.*"
    else:
        cfg[field] = [outside] if field == "inputs" else outside
    if field == "deadLetterTopic":
        cfg["maxMessageRetries"] = 3
    path = f"{FNS}/acme/ns/{cfg['name']}"
    r = call(
        worker,
        keys,
        "POST",
        path,
        role=ACME_ADMIN,
        files={
            "functionConfig": (None, json.dumps(cfg), "application/json"),
            "data": ("exclaim.py", b"def process(i):\n    return i\n"),
        },
    )
    assert r.status_code == 403 and "outside tenant 'acme'" in r.text, (r.status_code, r.text)
    assert call(worker, keys, "GET", path, role=SUPERUSER).status_code == 404


def test_a_tenant_admin_may_not_move_its_function_s_output_to_another_tenant(worker, keys):
    cfg = function("acme", "moves", instanceRuntime="process", output="persistent://acme/ns/moves-out")
    path = f"{FNS}/acme/ns/moves"
    files = {
        "functionConfig": (None, json.dumps(cfg), "application/json"),
        "data": ("exclaim.py", (EXAMPLES / "exclaim.py").read_bytes()),
    }
    r = call(worker, keys, "POST", path, role=ACME_ADMIN, files=files)
    assert r.status_code == 204, (r.status_code, r.text)
    try:
        r = call(
            worker,
            keys,
            "PUT",
            path,
            role=ACME_ADMIN,
            files={"functionConfig": (None, json.dumps({"output": "persistent://other/ns/x"}), "application/json")},
        )
        assert r.status_code == 403, (r.status_code, r.text)
        assert call(worker, keys, "GET", path, role=SUPERUSER).json()["output"] == "persistent://acme/ns/moves-out"
        r = call(
            worker,
            keys,
            "PUT",
            path,
            role=ACME_ADMIN,
            files={"functionConfig": (None, json.dumps({"parallelism": 2}), "application/json")},
        )
        assert r.status_code == 204, (r.status_code, r.text)
    finally:
        call(worker, keys, "DELETE", path, role=SUPERUSER)
