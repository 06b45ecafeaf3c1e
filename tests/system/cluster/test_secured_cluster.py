"""A worker cluster with token authentication on its REST API, over plain HTTP and over HTTPS: the workers call
each other with their own credentials (--auth-params, a superuser's token) and trust (--tls-trust-cert-path), and a
process instance's state calls reach the state's owner with a key of their own that opens that one function's
state calls and nothing else, through the worker's trust read before the instance drops to its own user, so that
one copy of a function's state works on a secured cluster as on an open one. Without credentials, or with a key
of another function, the state-calls route refuses."""

from __future__ import annotations

import uuid

import pytest
import requests
import trustme

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.functions.state.owner_calls import STATE_KEY_HEADER
from pulsar_autoscale.security import tokens
from tests.support.cluster_harness import WorkerCluster
from tests.support.scenario import OutputCollector, wait_until

TOTAL_FN = """
from pulsar import Function


class Total(Function):
    def process(self, input, context):
        return str(context.incr_counter("total", 1))
"""
N = 60


def _tls_files(d) -> tuple[str, tuple[str, ...]]:
    """A CA, the workers' certificate for 127.0.0.1 signed by it, and the worker options that serve and trust it."""
    ca = trustme.CA()
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(d / "server.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    return str(d / "ca.pem"), (
        "--tls-cert-file",
        str(d / "server.pem"),
        "--tls-key-file",
        str(d / "server.pem"),
        "--tls-trust-cert-path",
        str(d / "ca.pem"),
    )


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_one_copy_of_state_on_a_cluster_with_token_auth(broker, client, tmp_path, tls):
    secret = tokens.create_secret_key()
    key_file = tmp_path / "secret.key"
    key_file.write_bytes(secret)
    admin_token = tokens.create_token("admin", secret_key=secret)
    auth = (
        "--token-secret-key",
        f"file://{key_file}",
        "--superuser-roles",
        "admin",
        "--auth-plugin",
        "token",
        "--auth-params",
        f"token:{admin_token}",
    )
    ca, tls_args = _tls_files(tmp_path) if tls else (None, ())
    code = tmp_path / "total.py"
    code.write_text(TOTAL_FN)
    name = f"sec-{uuid.uuid4().hex[:6]}"
    src, dst = (f"persistent://public/default/{name}-{t}" for t in ("in", "out"))
    with WorkerCluster(
        broker.service_url,
        broker.metrics_url,
        tmp_path,
        n=2,
        runtime="process",
        extra_args=auth + tls_args,
        token=admin_token,
        ca=ca,
    ) as cluster:
        a, b = cluster.live()
        assert a.url.startswith("https://" if tls else "http://"), a.url
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {admin_token}"
        session.verify, session.trust_env = ca or True, False  # REQUESTS_CA_BUNDLE would win over verify
        admin = FunctionsAdmin(a.url, session=session)
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": name,
                "className": "total.Total",
                "inputs": [src],
                "output": dst,
                "parallelism": 2,
                "subscriptionPosition": "Earliest",
            },
            str(code),
        )
        wait_until(lambda: admin.status("public", "default", name)["numRunning"] == 2, 90, "2 instances running")
        hosts = {i["status"]["workerId"] for i in admin.status("public", "default", name)["instances"]}
        assert hosts == {a.worker_id, b.worker_id}, f"one instance per worker, so one calls the owner: {hosts}"
        collector = OutputCollector(client, dst)
        try:
            producer = client.create_producer(src, batching_enabled=False)
            for i in range(N):
                producer.send(b"x", partition_key=f"k{i % 10}")
            producer.close()
            wait_until(
                lambda: sum(collector.counts.values()) >= N,
                90,
                lambda: f"{N} outputs, saw {sum(collector.counts.values())}\n{cluster.log_tails(30)}",
            )
            assert sorted(int(v) for v in collector.counts) == list(range(1, N + 1)), collector.counts
        finally:
            collector.close()
        assert admin.get_state("public", "default", name, "total") == {"key": "total", "numberValue": N}

        calls = f"{a.url}/admin/v3/functions/public/default/{name}/state-calls"
        body = {"session": uuid.uuid4().hex, "fresh": True, "calls": [["get_counter", None, ["total"]]]}
        anyone = requests.Session()
        anyone.verify, anyone.trust_env = ca or True, False
        assert anyone.post(calls, json=body, timeout=10).status_code == 401
        forged = anyone.post(calls, json=body, headers={STATE_KEY_HEADER: "not-the-key"}, timeout=10)
        assert forged.status_code == 403, forged.text
        other = anyone.post(
            f"{a.url}/admin/v3/functions/public/default/other/state-calls",
            json=body,
            headers={STATE_KEY_HEADER: "not-the-key"},
            timeout=10,
        )
        assert other.status_code == 403, other.text
        admin.delete("public", "default", name)
