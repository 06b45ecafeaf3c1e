"""Security of the worker and the controller: Pulsar tokens (HS256, RS256), tenant authorization,
TLS (trustme), the refused unauthenticated non-loopback bind, the epoch header, redaction, size limits.

One secured worker (HTTPS, HS256 tokens) on the session's pulsar-lite broker serves most cases.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import logging
import ssl
import subprocess
import time
import uuid

import jwt
import pulsar
import pytest
import requests
import trustme

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.leader import LeaderElector
from pulsar_autoscale.pulsar_client import ClientSettings, open_client
from pulsar_autoscale.security import tokens
from pulsar_autoscale.security.guard import AccessPolicy
from pulsar_autoscale.security.serving import ServerSecurity
from tests.support.commands import CLI
from tests.support.scenario import EXAMPLES, lead, wait_until
from tests.support.secured_worker import (
    ACME_ADMIN,
    CONTROLLER,
    FNS,
    STRANGER,
    SUPERUSER,
    admin_as,
    call,
    function,
    token,
)


def pulsar_style_hs256(subject: str, key: bytes) -> str:
    """A token built byte by byte as Pulsar's AuthTokenUtils.createToken (JJWT) builds it, without PyJWT:
    header {"alg":"HS256"}, claims {"sub":...}, base64url without padding, HMAC-SHA256."""

    def b64(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    signing_input = b64(b'{"alg":"HS256"}') + "." + b64(json.dumps({"sub": subject}, separators=(",", ":")).encode())
    return signing_input + "." + b64(hmac.new(key, signing_input.encode(), hashlib.sha256).digest())


# ---- authentication and authorization ---------------------------------------------------------------------
def test_without_or_with_a_bad_token_every_endpoint_answers_401(worker, keys):
    other_key = tokens.create_secret_key()
    bad = {
        "none": None,
        "garbage": "not-a-jwt",
        "other key": tokens.create_token(SUPERUSER, secret_key=other_key),
        "expired": token(keys, SUPERUSER, expires_in_s=1, now=time.time() - 3600),
        "no role": jwt.encode({"name": "x"}, keys["secret"], algorithm="HS256"),
    }
    for path in (
        f"{FNS}/public/default",
        f"{FNS}/public/default/f/status",
        "/admin/v2/worker/cluster",
        "/admin/v3/stages/public/default",
        "/metrics",
        "/no/such/path",
    ):
        for what, bearer in bad.items():
            r = call(worker, keys, "GET", path, bearer=bearer)
            assert r.status_code == 401, (path, what, r.status_code, r.text)
            assert "reason" in r.json() and r.headers["WWW-Authenticate"].startswith("Bearer")
    assert call(worker, keys, "GET", "/healthz").status_code == 200  # the one open path (liveness probes)


def test_tenant_admin_gets_403_outside_its_tenant_and_superuser_works(worker, keys):
    assert call(worker, keys, "GET", f"{FNS}/acme/ns", ACME_ADMIN).status_code == 200
    for path in (f"{FNS}/public/default", f"{FNS}/public/default/x/status", "/admin/v2/worker/cluster"):
        r = call(worker, keys, "GET", path, ACME_ADMIN)
        assert r.status_code == 403 and ACME_ADMIN in r.json()["reason"], (path, r.text)
    assert call(worker, keys, "GET", f"{FNS}/acme/ns", STRANGER).status_code == 403
    r = call(
        worker,
        keys,
        "POST",
        f"{FNS}/public/default/evil",
        STRANGER,
        files={"functionConfig": (None, json.dumps(function("public", "evil", className="os.system")))},
    )
    assert r.status_code == 403
    for path in (f"{FNS}/public/default", f"{FNS}/acme/ns", "/admin/v2/worker/cluster"):
        assert call(worker, keys, "GET", path, SUPERUSER).status_code == 200, path
    assert call(worker, keys, "GET", "/metrics", STRANGER).status_code == 200  # any authenticated role


def test_a_token_made_as_pulsar_makes_it_authenticates(worker, keys):
    made = pulsar_style_hs256(SUPERUSER, keys["secret"])
    assert made == token(keys, SUPERUSER)  # ours are byte-identical to Pulsar's
    assert call(worker, keys, "GET", f"{FNS}/public/default", bearer=made).status_code == 200
    # Pulsar's other spellings of the same key: data:;base64,... and the base64 text itself
    b64 = base64.b64encode(keys["secret"]).decode()
    for spec in (f"data:;base64,{b64}", b64, str(keys["dir"] / "secret.key"), f"file:{keys['dir'] / 'secret.key'}"):
        assert tokens.TokenValidator.from_settings(secret_key=spec).role(made) == SUPERUSER


def test_rs256_with_a_public_key_der_or_pem_and_a_custom_role_claim(keys, tmp_path):
    signed = tokens.create_token("bob", private_key=keys["private"])
    assert tokens.decode_unverified(signed)[0] == {"alg": "RS256"}
    assert tokens.TokenValidator.from_settings(public_key=keys["public_spec"]).role(signed) == "bob"
    pem = tokens.load_public_key((keys["dir"] / "public.key").read_bytes()).public_bytes(
        tokens.serialization.Encoding.PEM, tokens.serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "public.pem").write_bytes(pem)
    validator = tokens.TokenValidator.from_settings(public_key=str(tmp_path / "public.pem"))
    assert validator.role(signed) == "bob"
    with pytest.raises(tokens.InvalidToken, match="not signed with"):  # no HS256 with the public key as secret
        validator.role(pulsar_style_hs256("bob", pem))  # the algorithm-confusion attack
    custom = tokens.TokenValidator.from_settings(public_key=keys["public_spec"], role_claim="role", audience="pulsar")
    other = jwt.encode(
        {"sub": "x", "role": "carol", "aud": "pulsar"}, tokens.load_private_key(keys["private"]), algorithm="RS256"
    )
    assert custom.role(other) == "carol"
    with pytest.raises(tokens.InvalidToken, match="audience"):
        custom.role(
            jwt.encode({"role": "carol", "aud": "elsewhere"}, tokens.load_private_key(keys["private"]), algorithm="RS256")
        )


def test_controller_endpoints_need_a_token_and_a_superuser(broker, keys):
    policy = AccessPolicy(
        tokens.TokenValidator.from_settings(public_key=keys["public_spec"]),
        superuser_roles=frozenset({SUPERUSER}),
        tenant_admins={"acme": frozenset({ACME_ADMIN})},
    )
    config = ControllerConfig(
        service_url=broker.service_url,
        admin_url="http://127.0.0.1:9",
        http_port=0,
        decision_log=None,
        lock_topic=f"persistent://public/default/lock-{uuid.uuid4().hex[:6]}",
    )
    controller = Controller(config, security=ServerSecurity(policy)).start()
    try:
        url = f"http://127.0.0.1:{controller.http_port}"
        rs = {role: f"Bearer {tokens.create_token(role, private_key=keys['private'])}" for role in (SUPERUSER, ACME_ADMIN)}
        assert requests.get(url + "/status", timeout=10).status_code == 401
        assert requests.get(url + "/metrics", timeout=10).status_code == 401
        hs = f"Bearer {token(keys, SUPERUSER)}"  # an HS256 token where RS256 is expected
        assert requests.get(url + "/status", headers={"Authorization": hs}, timeout=10).status_code == 401
        assert requests.get(url + "/status", headers={"Authorization": rs[ACME_ADMIN]}, timeout=10).status_code == 403
        assert requests.get(url + "/status", headers={"Authorization": rs[SUPERUSER]}, timeout=10).status_code == 200
        assert requests.get(url + "/metrics", headers={"Authorization": rs[ACME_ADMIN]}, timeout=10).status_code == 200
    finally:
        controller.stop()


# ---- epoch header, secrets, size limits -------------------------------------------------------------------
def test_epoch_header_is_honoured_only_from_a_controller_role_and_secrets_are_masked(worker, keys):
    name = f"sec-{uuid.uuid4().hex[:6]}"
    acme = admin_as(worker, keys, ACME_ADMIN)
    acme.create(function("acme", name, secrets={"db": "hunter2"}, instanceRuntime="process"), str(EXAMPLES / "exclaim.py"))
    wait_until(lambda: acme.status("acme", "ns", name)["numRunning"] == 1, 30, "1 running instance")
    # a tenant admin sends a huge epoch: ignored (its update still applies), the controller is not locked out
    acme.set_parallelism("acme", "ns", name, 2, epoch=10**18)
    controller = admin_as(worker, keys, CONTROLLER)
    controller.set_parallelism("acme", "ns", name, 1, epoch=7)
    with pytest.raises(AdminError) as stale:  # the controller's own epochs still fence
        controller.set_parallelism("acme", "ns", name, 2, epoch=6)
    assert stale.value.status == 409
    # secrets: masked in GET; a GET-modify-PUT round trip keeps the stored value
    shown = acme.get("acme", "ns", name)
    assert shown["secrets"] == {"db": "***"} and "hunter2" not in json.dumps(shown)
    acme.update({**shown, "parallelism": 2})
    assert worker.worker.get(f"acme/ns/{name}").secrets == {"db": "hunter2"}
    acme.delete("acme", "ns", name)


def test_oversize_requests_get_413_before_the_body_is_read(worker, keys):
    big = 400 << 20
    ctx = ssl.create_default_context(cafile=keys["ca"])
    for role, expected in ((SUPERUSER, 413), (None, 401)):
        conn = http.client.HTTPSConnection("127.0.0.1", worker.port, timeout=10, context=ctx)
        conn.putrequest("POST", f"{FNS}/public/default/huge")
        conn.putheader("Content-Type", "multipart/form-data; boundary=x")
        conn.putheader("Content-Length", str(big))
        if role:
            conn.putheader("Authorization", f"Bearer {token(keys, role)}")
        conn.endheaders(b"--x\r\n")  # 4 bytes of the announced 400 MB: the answer must not wait for the rest
        resp = conn.getresponse()
        assert resp.status == expected, resp.read()
        conn.close()
    cfg = function("public", "bigconfig")
    files = {"functionConfig": (None, json.dumps({**cfg, "userConfig": {"x": "y" * (2 << 20)}}))}
    r = call(worker, keys, "POST", f"{FNS}/public/ns/bigconfig", SUPERUSER, files=files)
    assert r.status_code == 413 and "reason" in r.json()


# ---- TLS -------------------------------------------------------------------------------------------------
def test_tls_serves_https_with_the_given_certificate(worker, keys):
    assert worker.url.startswith("https://")
    with pytest.raises(requests.exceptions.SSLError):  # the system trust store does not know trustme's CA
        requests.get(worker.url + "/healthz", timeout=10)
    with pytest.raises(requests.ConnectionError):  # plain HTTP on the TLS port
        requests.get(worker.url.replace("https", "http") + "/healthz", timeout=10)
    untrusting = FunctionsAdmin(worker.url, session=ClientSettings(worker.url, "token", "token:x").http_session())
    with pytest.raises(AdminError, match="TLS handshake failed"):
        untrusting.list("public", "default")
    assert admin_as(worker, keys, SUPERUSER).list("public", "default") == []


def test_a_session_with_its_trust_in_memory_needs_no_ca_file(worker, keys, monkeypatch):
    """A process instance makes HTTPS calls to its worker after dropping to a user that may not read any file of
    the worker's (requests' own CA bundle sits in a virtualenv that may be 0700): the trust read before the drop
    is all it verifies with, and it still refuses a server its CA did not sign."""
    trusting = ClientSettings(worker.url, tls_trust_certs_file_path=keys["ca"]).trust_loaded_now()
    for variable in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # an instance's environment has neither
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(requests.adapters, "DEFAULT_CA_BUNDLE_PATH", "/nonexistent/cacert.pem")
    assert trusting.get(worker.url + "/healthz", timeout=10).status_code == 200
    other = trustme.CA()
    other.cert_pem.write_to_path(str(keys["dir"] / "other-ca.pem"))
    stranger = ClientSettings(worker.url, tls_trust_certs_file_path=str(keys["dir"] / "other-ca.pem"))
    with pytest.raises(requests.exceptions.SSLError):
        stranger.trust_loaded_now().get(worker.url + "/healthz", timeout=10)


def test_cli_passes_pulsar_admin_auth_flags(worker, keys, tmp_path):
    (tmp_path / "tok").write_text(token(keys, SUPERUSER))
    base = [
        *CLI,
        "functions",
        "--admin-url",
        worker.url,
        "--tls-trust-cert-path",
        keys["ca"],
    ]
    ok = subprocess.run(
        base
        + [
            "--auth-plugin",
            "org.apache.pulsar.client.impl.auth.AuthenticationToken",
            "--auth-params",
            f"file://{tmp_path / 'tok'}",
            "list",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and ok.stdout.strip() == "[]", ok.stderr
    denied = subprocess.run(base + ["list"], capture_output=True, text=True, timeout=60)
    assert denied.returncode == 2 and "401" in denied.stderr


# ---- safe defaults -----------------------------------------------------------------------------------------
def test_non_loopback_bind_without_auth_is_refused(broker, tmp_path):
    with pytest.raises(ConfigError, match="refusing to serve on 0.0.0.0 without authentication"):
        WorkerServer(broker.service_url, host="0.0.0.0", data_dir=str(tmp_path))
    assert not (tmp_path / "functions").exists()  # refused before the worker started
    ServerSecurity(insecure_no_auth=True).check_bind("0.0.0.0")
    ServerSecurity().check_bind("127.0.0.1")
    ServerSecurity().check_bind("::1")
    config = ControllerConfig(
        service_url=broker.service_url, admin_url="http://127.0.0.1:9", http_host="0.0.0.0", decision_log=None
    )
    with pytest.raises(ConfigError, match="--insecure-no-auth"):
        Controller(config)
    cli = subprocess.run(
        [
            *CLI,
            "worker",
            "--service-url",
            broker.service_url,
            "--host",
            "0.0.0.0",
            "--data-dir",
            str(tmp_path / "cli"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2 and "refusing to serve on 0.0.0.0" in cli.stderr


def test_credentials_stay_out_of_errors_logs_and_status(broker, worker, keys, caplog):
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConfigError) as number:  # a token written as a YAML number
        ControllerConfig.from_mapping(
            {
                "service_url": broker.service_url,
                "admin_url": "http://127.0.0.1:9",
                "auth": {"mode": "bearer", "token": 918273645546372819},
            }
        )
    assert "918273645546372819" not in str(number.value) and "token" in str(number.value)
    with pytest.raises(ConfigError) as params:
        ControllerConfig.from_mapping(
            {
                "service_url": broker.service_url,
                "admin_url": "http://127.0.0.1:9",
                "client": {"auth_plugin": "token", "auth_params": 5550123},
            }
        )
    assert "5550123" not in str(params.value)
    with pytest.raises(ConfigError) as userinfo:
        ControllerConfig(service_url=broker.service_url, admin_url="http://ops:pa55word@127.0.0.1:9")
    assert "pa55word" not in str(userinfo.value)
    with pytest.raises(AdminError) as unreachable:
        FunctionsAdmin("http://ops:pa55word@127.0.0.1:9").list("public", "default")
    assert "pa55word" not in str(unreachable.value) and "***@127.0.0.1" in str(unreachable.value)
    secret_token = token(keys, STRANGER)
    call(worker, keys, "GET", f"{FNS}/public/default", bearer=secret_token)
    call(worker, keys, "GET", f"{FNS}/public/default", bearer=secret_token + "x")
    assert secret_token not in caplog.text and "pa55word" not in caplog.text
    assert repr(ClientSettings(broker.service_url, "token", f"token:{secret_token}")).count(secret_token) == 0
    controller = Controller(
        ControllerConfig(service_url=broker.service_url, admin_url="http://127.0.0.1:9", decision_log=None, http_port=0),
        admin=FunctionsAdmin("http://ops:pa55word@127.0.0.1:9"),
    )
    try:
        lead(controller.elector)
        controller.iterate()
        status = json.dumps(controller.status())
        assert "cannot reach" in status and "pa55word" not in status
    finally:
        controller.elector.release()


# ---- Pulsar clients with auth (pulsar-lite has none: a token is sent and ignored) -------------------------
def test_clients_configured_with_a_token_still_work_on_pulsar_lite(broker, keys):
    settings = ClientSettings(broker.service_url, "token", f"token:{token(keys, CONTROLLER)}")
    client = open_client(settings)
    topic = f"persistent://public/default/auth-{uuid.uuid4().hex[:6]}"
    try:
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(b"with a token")
        assert consumer.receive(timeout_millis=10_000).data() == b"with a token"
    finally:
        client.close()
    elector = LeaderElector(settings, topic + "-lock", identity="with-token")
    try:
        assert lead(elector).holder == "with-token"
    finally:
        elector.release()
    config = ControllerConfig(
        service_url=broker.service_url,
        admin_url="http://127.0.0.1:9",
        client={"auth_plugin": "token", "auth_params": "token:abc"},
    )
    assert config.client_settings().authentication() is not None
    with pytest.raises(ConfigError, match="not supported"):
        ClientSettings(broker.service_url, "basic", "x").authentication()
    assert isinstance(pulsar.AuthenticationToken("x"), pulsar.Authentication)


# ---- tokens CLI --------------------------------------------------------------------------------------------
def test_tokens_cli_like_bin_pulsar_tokens(tmp_path):
    def cli(*argv, **kw):
        return subprocess.run([*CLI, "tokens", *argv], capture_output=True, text=True, timeout=60, **kw)

    assert cli("create-secret-key", "--output", str(tmp_path / "s.key")).returncode == 0
    assert len((tmp_path / "s.key").read_bytes()) == 32  # raw bytes, as Pulsar writes them
    b64 = cli("create-secret-key", "--base64").stdout.strip()
    assert len(base64.b64decode(b64)) == 32
    made = cli("create", "--secret-key", f"file://{tmp_path / 's.key'}", "--subject", "alice", "-e", "1h").stdout.strip()
    assert cli("validate", "-sk", f"file://{tmp_path / 's.key'}", made).stdout.strip() == "alice"
    assert cli("validate", "-sk", f"data:;base64,{b64}", made).returncode == 2  # another key
    header, claims = cli("show", made).stdout.strip().splitlines()
    assert json.loads(header) == {"alg": "HS256"} and json.loads(claims)["sub"] == "alice"
    assert (
        cli(
            "create-key-pair", "--output-private-key", str(tmp_path / "p.key"), "--output-public-key", str(tmp_path / "pub.key")
        ).returncode
        == 0
    )
    assert (tmp_path / "p.key").stat().st_mode & 0o077 == 0  # the private key is private
    rs = cli("create", "-pk", str(tmp_path / "p.key"), "-s", "bob").stdout.strip()
    assert cli("validate", "-pk", str(tmp_path / "pub.key"), "-i", input=rs).stdout.strip() == "bob"
    assert "expiry time" in cli("create", "-sk", str(tmp_path / "s.key"), "-s", "x", "-e", "soon").stderr
