"""Our tokens against a real Apache Pulsar with token authentication and authorization on.

pulsar-lite does not check credentials, so whether `pulsar-autoscale tokens` makes tokens Pulsar accepts, and
whether our clients and worker send them as Pulsar expects, can only be shown on Apache Pulsar: this module
starts its own secured standalone (the key from `tokens create-secret-key`, superuser "admin"), so it runs in
the `--broker apache` pass only, where Apache Pulsar is expected to be available.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pulsar
import pytest
import requests
import trustme
from cryptography.hazmat.primitives import serialization

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.apache import ApacheStandalone
from pulsar_autoscale.broker.apache_dist import DEFAULT_VERSION, cache_root
from pulsar_autoscale.broker.token_auth import TokenAuth
from pulsar_autoscale.netutil import free_port
from pulsar_autoscale.pulsar_client import ClientSettings, open_client
from tests.support.commands import CLI, worker_command
from tests.support.fault_scenarios import stop
from tests.support.scenario import wait_until

REPO = Path(__file__).resolve().parents[2]
CACHED = (cache_root() / DEFAULT_VERSION / "dist" / "bin" / "pulsar").is_file()
SUPERUSER, GRANTED, STRANGER = "admin", "autoscaler", "nobody"
pytestmark = pytest.mark.skipif(
    shutil.which("java") is None or (shutil.which("mvn") is None and not CACHED),
    reason="Apache Pulsar needs java, and mvn unless the distribution is cached",
)


def cli(*args: str) -> str:
    """`pulsar-autoscale ...` as a user runs it; its stdout."""
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, str]:
    """Two secret keys made by our CLI; tokens signed with the first (the broker's) and one with the second."""
    d = tmp_path_factory.mktemp("keys")
    for name in ("broker.key", "other.key"):
        cli("tokens", "create-secret-key", "--output", str(d / name))
    key = f"file://{d / 'broker.key'}"
    made = {role: cli("tokens", "create", "--subject", role, "--secret-key", key) for role in (SUPERUSER, GRANTED, STRANGER)}
    made["forged"] = cli("tokens", "create", "--subject", SUPERUSER, "--secret-key", f"file://{d / 'other.key'}")
    made["key"] = key
    return made


@pytest.fixture(scope="module")
def secured(broker_kind, tmp_path_factory, request):
    if broker_kind != "apache":
        pytest.skip("starts an Apache standalone of its own: runs in the --broker apache pass")
    keys = request.getfixturevalue("keys")  # after the skip: the lite pass makes no keys
    auth = TokenAuth(broker_token=keys[SUPERUSER], superusers=(SUPERUSER,), secret_key=keys["key"])
    # TLS beside the plain ports, as operators run it: a certificate for 127.0.0.1 from a test CA
    certs = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(certs / "ca.pem"))
    cert = ca.issue_cert("127.0.0.1", "localhost")
    # the broker reads PKCS#8 keys only ("BEGIN PRIVATE KEY")
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
    (certs / "broker.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert.cert_chain_pems[0].write_to_path(str(certs / "broker.pem"))
    tls_port = free_port()
    tls = {
        "brokerServicePortTls": tls_port,
        "webServicePortTls": free_port(),
        "tlsCertificateFilePath": certs / "broker.pem",
        "tlsKeyFilePath": certs / "broker.key",
        "tlsTrustCertsFilePath": certs / "ca.pem",
    }
    with ApacheStandalone(data_dir=str(tmp_path_factory.mktemp("secured")), auth=auth, properties=tls) as b:
        b.tls_service_url = f"pulsar+ssl://127.0.0.1:{tls_port}"
        b.ca_file = str(certs / "ca.pem")
        yield b


def settings(broker: ApacheStandalone, token: str | None) -> ClientSettings:
    return ClientSettings(broker.service_url, "token" if token else None, f"token:{token}" if token else None)


def topic() -> str:
    return f"persistent://public/default/sec-{uuid.uuid4().hex[:10]}"


def test_a_superuser_token_of_ours_produces_and_consumes(secured, keys):
    client = open_client(settings(secured, keys[SUPERUSER]))
    try:
        t = topic()
        consumer = client.subscribe(t, "s")
        producer = client.create_producer(t)
        producer.send(b"hello")
        assert consumer.receive(10_000).data() == b"hello"
    finally:
        client.close()


def broker_refusal(secured, token: str | None) -> tuple[Exception, list[str]]:
    """What a producer on public/default with `token` (None: no credentials) gets, and the broker's log lines
    about refused connections and operations meanwhile (its own words for why)."""
    before = secured.log_path.stat().st_size
    # the broker logs its refusal at the first connect: a short operation timeout ends the client's retries
    client = open_client(settings(secured, token), operation_timeout_seconds=4)
    try:
        with pytest.raises(pulsar.PulsarException) as refused:
            client.create_producer(topic())
    finally:
        client.close()
    with open(secured.log_path, "rb") as f:
        f.seek(before)
        said = [
            line.split(" - ", 1)[-1]
            for line in f.read().decode(errors="replace").splitlines()
            if "Failed to authenticate" in line or "is not authorized" in line
        ]
    return refused.value, said


def test_a_role_without_a_grant_is_refused_by_the_broker(secured, keys):
    refused, said = broker_refusal(secured, keys[STRANGER])
    print(f"\nno grant: {type(refused).__name__}: {refused}")
    assert isinstance(refused, pulsar.AuthorizationError), repr(refused)
    # authenticated (no connection refused), then refused the topic
    assert said and all("is not authorized" in line and f"role {STRANGER}" in line.lower() for line in said), said


@pytest.mark.parametrize("who", ["forged", None])
def test_a_token_signed_with_another_key_or_none_is_refused(secured, keys, who):
    """The broker refuses the connection itself (AuthenticationError on CONNECT). The C++ client retries a
    refused connection until the operation timeout, so the create reports the timeout (or the refusal); the
    broker's log says why."""
    refused, said = broker_refusal(secured, keys[who] if who else None)
    print(f"\n{who or 'no token'}: {type(refused).__name__}: {refused}\n  broker: {said[:1]}")
    assert isinstance(refused, (pulsar.AuthenticationError, pulsar.Timeout)), repr(refused)
    reason = "JWT signature does not match" if who else "No anonymous role"
    assert said and all("Failed to authenticate" in line and reason in line for line in said), said


def test_the_admin_rest_api_needs_a_token(secured, keys):
    url = f"{secured.admin_url}/admin/v2/tenants"
    codes = {
        who: requests.get(url, timeout=10, headers={"Authorization": f"Bearer {keys[who]}"} if who else {}).status_code
        for who in (None, "forged", SUPERUSER)
    }
    assert codes == {None: 401, "forged": 401, SUPERUSER: 200}, codes


def test_our_worker_runs_a_function_with_a_granted_role_token(secured, keys, tmp_path):
    """`pulsar-autoscale worker --auth-plugin token --auth-params token:...` for a role granted produce and
    consume on public/default (not a superuser): its instances connect with the token and process."""
    grant = secured.http_session().post(
        f"{secured.admin_url}/admin/v2/namespaces/public/default/permissions/{GRANTED}", json=["produce", "consume"], timeout=10
    )
    assert grant.status_code in (200, 204), grant.text
    assert exclaim_through_worker(
        secured.service_url,
        ("--auth-plugin", "token", "--auth-params", f"token:{keys[GRANTED]}"),
        settings(secured, keys[GRANTED]),
        secured.metrics_url,
        tmp_path,
    )


def test_our_worker_and_clients_connect_over_tls(secured, keys, tmp_path):
    """The broker's TLS port with the operator's CA (`--tls-trust-cert-path`), a token on top: our worker's
    instances and our client produce, process and consume over pulsar+ssl://; a client that does not trust
    the CA is refused by the handshake."""
    tls = ClientSettings(secured.tls_service_url, "token", f"token:{keys[SUPERUSER]}", tls_trust_certs_file_path=secured.ca_file)
    assert exclaim_through_worker(
        secured.tls_service_url,
        ("--auth-plugin", "token", "--auth-params", f"token:{keys[SUPERUSER]}", "--tls-trust-cert-path", secured.ca_file),
        tls,
        secured.metrics_url,
        tmp_path,
    )
    untrusting = open_client(ClientSettings(secured.tls_service_url, "token", f"token:{keys[SUPERUSER]}"))
    try:
        with pytest.raises(pulsar.PulsarException):
            untrusting.create_producer(topic(), send_timeout_millis=5000)
    finally:
        untrusting.close()


def exclaim_through_worker(
    service_url: str, options: tuple[str, ...], client: ClientSettings, metrics_url: str, tmp_path: Path
) -> bool:
    """Our worker started on `service_url` with `options` runs exclaim; five messages sent with `client`
    come back with their "!"."""
    port = free_port()
    log = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen(
        worker_command(service_url, metrics_url, port, tmp_path / "data", *options),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    src, dst = topic(), topic()
    try:
        admin = FunctionsAdmin(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                admin.create(
                    {
                        "tenant": "public",
                        "namespace": "default",
                        "name": "exclaim",
                        "className": "exclaim.Exclaim",
                        "inputs": [src],
                        "output": dst,
                        "parallelism": 1,
                    },
                    str(REPO / "functions" / "examples" / "exclaim.py"),
                )
                break
            except Exception:  # the worker's API is not up yet
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise AssertionError((tmp_path / "worker.log").read_text()[-2000:]) from None
                time.sleep(0.2)
        wait_until(
            lambda: admin.status("public", "default", "exclaim")["numRunning"] >= 1,
            30,
            lambda: (tmp_path / "worker.log").read_text()[-2000:],
            interval_s=0.2,
        )
        pulsar_client = open_client(client)
        try:
            out = pulsar_client.subscribe(dst, "check")
            producer = pulsar_client.create_producer(src)
            for i in range(5):
                producer.send(f"m{i}".encode())
            got = sorted(out.receive(15_000).data() for _ in range(5))
        finally:
            pulsar_client.close()
        assert got == [f"m{i}!".encode() for i in range(5)], got
        return True
    finally:
        stop(worker)
