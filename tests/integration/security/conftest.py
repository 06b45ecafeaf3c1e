"""The secured worker (HTTPS, HS256 tokens, a tenant admin for `acme`) and its keys, one per test module."""

import pytest
import trustme

from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.security import tokens
from pulsar_autoscale.security.guard import AccessPolicy
from pulsar_autoscale.security.serving import ServerSecurity
from tests.support.secured_worker import ACME_ADMIN, CONTROLLER, SUPERUSER


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    secret = tokens.create_secret_key()
    (d / "secret.key").write_bytes(secret)  # Pulsar's create-secret-key file: the raw key bytes
    private, public = tokens.create_key_pair("RS256")
    (d / "private.key").write_bytes(private)
    (d / "public.key").write_bytes(public)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    return {
        "dir": d,
        "secret": secret,
        "secret_spec": f"file://{d / 'secret.key'}",
        "private": private,
        "public_spec": f"file://{d / 'public.key'}",
        "ca": str(d / "ca.pem"),
        "pem": str(d / "server.pem"),
    }


@pytest.fixture(scope="module")
def worker(broker, keys, tmp_path_factory):
    policy = AccessPolicy(
        tokens.TokenValidator.from_settings(secret_key=keys["secret_spec"]),
        superuser_roles=frozenset({SUPERUSER, CONTROLLER}),
        tenant_admins={"acme": frozenset({ACME_ADMIN})},
        controller_roles=frozenset({CONTROLLER}),
    )
    security = ServerSecurity(policy, tls_cert_file=keys["pem"], tls_key_file=keys["pem"], max_request_bytes=1 << 20)
    with WorkerServer(
        broker.service_url,
        data_dir=str(tmp_path_factory.mktemp("secure-worker")),
        metrics_url=broker.metrics_url,
        security=security,
    ) as w:
        yield w
