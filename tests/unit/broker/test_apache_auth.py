"""ApacheStandalone's token authentication settings, written into a private conf/ (no JVM: a stand-in
distribution with the two files the standalone reads)."""

from __future__ import annotations

import pytest
import yaml

from pulsar_autoscale.broker.apache import ApacheStandalone
from pulsar_autoscale.broker.token_auth import TOKEN_CLIENT_PLUGIN, TOKEN_PROVIDER, TokenAuth
from pulsar_autoscale.errors import BrokerError
from pulsar_autoscale.security import tokens


def conf_of(tmp_path, auth: TokenAuth | None):
    home = tmp_path / "dist"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "standalone.conf").write_text("authenticationEnabled=false\nsuperUserRoles=\n")
    (home / "conf" / "functions_worker.yml").write_text("authenticationEnabled: false\n")
    b = ApacheStandalone(port=6650, web_port=8080, auth=auth)
    b.home = home
    conf = b._write_conf(tmp_path / "data", 3181)
    props = dict(line.split("=", 1) for line in (conf / "standalone.conf").read_text().splitlines() if "=" in line)
    return props, yaml.safe_load((conf / "functions_worker.yml").read_text())


def test_a_secret_key_turns_token_auth_and_authorization_on_for_broker_and_functions_worker(tmp_path):
    key = tmp_path / "secret.key"
    key.write_bytes(tokens.create_secret_key())
    token = tokens.create_token("admin", secret_key=key.read_bytes())
    auth = TokenAuth(broker_token=token, superusers=("admin", "ops"), secret_key=f"file://{key}")
    props, fw = conf_of(tmp_path, auth)
    assert props["authenticationEnabled"] == "true" and props["authorizationEnabled"] == "true"
    assert props["authenticationProviders"] == TOKEN_PROVIDER
    assert props["tokenSecretKey"] == f"file://{key}" and props["superUserRoles"] == "admin,ops"
    assert props["brokerClientAuthenticationPlugin"] == TOKEN_CLIENT_PLUGIN
    assert props["brokerClientAuthenticationParameters"] == f"token:{auth.broker_token}"
    assert fw["authenticationEnabled"] is True and fw["superUserRoles"] == ["admin", "ops"]
    assert fw["brokerClientAuthenticationParameters"] == f"token:{auth.broker_token}"
    assert fw["properties"] == {"tokenSecretKey": f"file://{key}"}


def test_without_auth_the_distributions_settings_stay(tmp_path):
    props, fw = conf_of(tmp_path, None)
    assert props["authenticationEnabled"] == "false" and "tokenSecretKey" not in props
    assert fw["authenticationEnabled"] is False


def test_token_auth_needs_one_key_and_a_superuser_and_never_shows_its_token():
    with pytest.raises(BrokerError, match="exactly one"):
        TokenAuth(broker_token="t", superusers=("admin",))
    with pytest.raises(BrokerError, match="superuser"):
        TokenAuth(broker_token="t", superusers=(), secret_key="data:;base64,AAAA")
    auth = TokenAuth(broker_token="sekrit", superusers=("admin",), secret_key="data:;base64,AAAA")
    assert "sekrit" not in repr(auth) and "sekrit" not in repr(ApacheStandalone(auth=auth))
