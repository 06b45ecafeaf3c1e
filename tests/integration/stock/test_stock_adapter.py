"""The stock Pulsar adapter against a fake cluster that checks every request against Pulsar's API documents.

Real HTTP servers on loopback ports (tests/support/contracts/fake_cluster.py); nothing of ours is mocked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import ssl

import pytest
import requests

from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.admin.http_auth import AuthConfig, AuthError, ClusterSession, RedirectRefused, Secret, cluster_session
from pulsar_autoscale.admin.stock import StockPulsarAdmin, TopicStats
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.snapshot import window_snapshot
from tests.support.contracts.fake_cluster import FakeCluster, FakeIssuer
from tests.support.contracts.published import (
    BROKER_DOC,
    FUNCTIONS_DOC,
    TOPIC_DELETE_DOC,
    broker_doc,
    functions_doc,
    published,
    topic_delete_doc,
)

TOKEN = "tok-7f3a-SECRET"
FQFN = "public/default/enrich"
IN_TOPIC = "persistent://public/default/raw"


def _second_loopback() -> str:
    """127.0.0.2 is another host name for requests (it strips credentials across hosts); fall back if unusable."""
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
        return "127.0.0.2"
    except OSError:
        return "127.0.0.1"


@pytest.fixture
def cluster():
    c = FakeCluster()
    c.add_host("w1")
    c.add_host("w2", bind=_second_loopback())
    c.add_host("foreign", state=None)
    c.state.functions[FQFN] = {
        "tenant": "public",
        "namespace": "default",
        "name": "enrich",
        "className": "enrich.Fn",
        "inputs": [IN_TOPIC],
        "output": "persistent://public/default/enriched",
        "parallelism": 2,
        "runtime": "PYTHON",
        "py": "enrich.py",
    }
    yield c
    c.close()


def conforms(cluster) -> None:
    assert cluster.state.violations == [], "requests or answers outside Pulsar's documented API"


def admin_for(cluster, auth=None, **kw) -> StockPulsarAdmin:
    return StockPulsarAdmin(cluster.hosts["w1"].url, auth=auth, extra_hosts=(cluster.hosts["w2"].host_port,), timeout_s=10, **kw)


def instance(iid, received, processed, latency_ms=None):
    m = {
        "receivedTotal": received,
        "processedSuccessfullyTotal": processed,
        "systemExceptionsTotal": 0,
        "userExceptionsTotal": 0,
        "lastInvocation": 0,
        "userMetrics": {},
    }
    if latency_ms is not None:
        m["avgProcessLatency"] = latency_ms
    return {"instanceId": iid, "metrics": {**m, "1min": {"receivedTotal": 0, "processedSuccessfullyTotal": 0}}}


def function_stats(*instances):
    return {
        "receivedTotal": sum(i["metrics"]["receivedTotal"] for i in instances),
        "processedSuccessfullyTotal": sum(i["metrics"]["processedSuccessfullyTotal"] for i in instances),
        "instances": list(instances),
        "lastInvocation": 0,
    }


def topic_stats(rate_in, counter, backlogs):
    return {
        "msgRateIn": rate_in,
        "msgRateOut": rate_in,
        "msgInCounter": counter,
        "msgOutCounter": counter,
        "subscriptions": {s: {"msgBacklog": b, "type": "Shared", "consumers": []} for s, b in backlogs.items()},
    }


# ---- the documents ------------------------------------------------------------------------------------
def test_documents_are_the_published_ones_and_valid_with_their_errata():
    spec_validator = pytest.importorskip(
        "openapi_spec_validator", reason="dev dependency openapi-spec-validator checks the documents"
    )
    readme = (FUNCTIONS_DOC.parent / "README.md").read_text()
    for doc in (FUNCTIONS_DOC, BROKER_DOC, TOPIC_DELETE_DOC):
        assert hashlib.sha256(doc.read_bytes()).hexdigest() in readme, f"{doc.name} differs from the published copy"
    with pytest.raises(Exception, match="Duplicate parameter 'body'"):  # the known upstream problem
        spec_validator.validate(published(FUNCTIONS_DOC))
    for spec in (functions_doc(), broker_doc(), topic_delete_doc()):
        assert spec["swagger"] == "2.0"
        spec_validator.validate(spec)


# ---- every adapter call, validated ------------------------------------------------------------------------
def test_list_get_status_stats_conform(cluster):
    admin = admin_for(cluster)
    assert admin.list("public", "default") == ["enrich"]
    assert admin.get("public", "default", "enrich")["parallelism"] == 2
    assert admin.status("public", "default", "enrich")["numInstances"] == 2
    assert len(admin.stats("public", "default", "enrich")["instances"]) == 2
    assert [(r[1], r[2]) for r in cluster.state.requests] == [
        ("GET", "/admin/v3/functions/public/default"),
        ("GET", "/admin/v3/functions/public/default/enrich"),
        ("GET", "/admin/v3/functions/public/default/enrich/status"),
        ("GET", "/admin/v3/functions/public/default/enrich/stats"),
    ]
    conforms(cluster)


def test_set_parallelism_is_a_partial_multipart_put_and_no_change_is_a_noop(cluster):
    admin = admin_for(cluster)
    admin.set_parallelism("public", "default", "enrich", 4, epoch=7)
    assert cluster.state.updates == [(FQFN, {"tenant": "public", "namespace": "default", "name": "enrich", "parallelism": 4})]
    assert cluster.state.functions[FQFN]["parallelism"] == 4
    admin.set_parallelism("public", "default", "enrich", 4)  # Pulsar: 400 "Update contains no change"
    assert len(cluster.state.updates) == 1
    assert [r[1] for r in cluster.state.requests] == ["PUT", "PUT"]
    with pytest.raises(AdminError, match="parallelism must be an integer >= 1"):
        admin.set_parallelism("public", "default", "enrich", 0)
    with pytest.raises(AdminError, match="doesn't exist"):
        admin.set_parallelism("public", "default", "nosuch", 2)
    conforms(cluster)


def test_topic_stats_of_a_plain_topic(cluster):
    cluster.state.topics[IN_TOPIC] = topic_stats(120.5, 9000, {FQFN: 340, "audit": 0})
    ts = admin_for(cluster).topic_stats(IN_TOPIC)
    assert ts == TopicStats(IN_TOPIC, 0, 120.5, 120.5, 9000.0, {FQFN: 340.0, "audit": 0.0})
    assert ts.backlog_of(FQFN) == 340 and ts.backlog_of("other") is None
    assert [r[2] for r in cluster.state.requests] == [
        "/admin/v2/persistent/public/default/raw/partitions",
        "/admin/v2/persistent/public/default/raw/stats",
    ]
    conforms(cluster)


def test_topic_stats_of_a_partitioned_topic_are_summed(cluster):
    cluster.state.partitions[IN_TOPIC] = 3
    for i in range(3):
        cluster.state.topics[f"{IN_TOPIC}-partition-{i}"] = topic_stats(10.0 * (i + 1), 100 * (i + 1), {FQFN: i + 1})
    admin = admin_for(cluster)
    ts = admin.topic_stats(IN_TOPIC)
    assert (ts.partitions, ts.msg_rate_in, ts.msg_in_counter, ts.backlog_of(FQFN)) == (3, 60.0, 600.0, 6.0)
    assert cluster.state.requests[-1][3] == {"perPartition": "true"}
    assert admin.backlog_and_arrivals([IN_TOPIC], FQFN) == (6.0, 600.0)
    assert admin.backlog_and_arrivals([IN_TOPIC], "not-subscribed") == (None, 600.0)
    conforms(cluster)


# ---- counters for the policies -----------------------------------------------------------------------------
def test_counters_busy_time_from_latency_and_ca2_unknown(cluster):
    admin = admin_for(cluster)
    cluster.state.function_stats[FQFN] = function_stats(instance(0, 100, 100, 20.0), instance(1, 50, 50, 40.0))
    first, running = admin.counters_and_running("public", "default", "enrich", now=1000.0)
    assert running == 2
    assert (first.received, first.processed, first.outputs) == (150, 150, 150)
    assert first.busy_s == pytest.approx(100 * 0.020 + 50 * 0.040)
    assert first.arrived is None
    cluster.state.function_stats[FQFN] = function_stats(instance(0, 400, 400, 20.0), instance(1, 350, 350, 40.0))
    second = admin.counters("public", "default", "enrich", now=1030.0)
    snap = window_snapshot(FQFN, 2, first, second, backlog=12.0, running=2)
    assert snap.processing_rate == pytest.approx(600 / 30)
    assert snap.service_rate == pytest.approx(600 / (300 * 0.020 + 300 * 0.040))
    assert snap.ca2 is None  # Pulsar reports no inter-arrival figures
    assert snap.arrival_rate is None  # comes from the broker (topic stats or /metrics)
    conforms(cluster)


def test_counters_carry_over_the_restart_a_stock_update_causes(cluster):
    admin = admin_for(cluster)
    cluster.state.function_stats[FQFN] = function_stats(instance(0, 500, 480, 10.0), instance(1, 300, 300, 10.0))
    before = admin.counters("public", "default", "enrich", now=0.0)
    # parallelism 2 -> 3: Pulsar restarted every instance, counters start again from zero
    cluster.state.function_stats[FQFN] = function_stats(
        instance(0, 20, 20, 10.0), instance(1, 10, 10, 10.0), instance(2, 5, 5, 10.0)
    )
    after = admin.counters("public", "default", "enrich", now=30.0)
    assert after.processed == 480 + 300 + 20 + 10 + 5
    assert after.received == 500 + 300 + 20 + 10 + 5
    # scale in to 1: the stopped instances' totals stay counted
    cluster.state.function_stats[FQFN] = function_stats(instance(0, 3, 3, 10.0))
    shrunk = admin.counters("public", "default", "enrich", now=60.0)
    assert shrunk.processed == after.processed + 3
    assert shrunk.processed >= after.processed >= before.processed


# ---- restart-aware planning inputs ----------------------------------------------------------------------
WORKER_METRICS = """\
# TYPE pulsar_function_worker_start_instance_process_time_ms summary
pulsar_function_worker_start_instance_process_time_ms{cluster="standalone",quantile="0.5",} 1200.0
pulsar_function_worker_start_instance_process_time_ms_count{cluster="standalone",} 4.0
pulsar_function_worker_start_instance_process_time_ms_sum{cluster="standalone",} 6000.0
# TYPE pulsar_function_worker_stop_instance_process_time_ms summary
pulsar_function_worker_stop_instance_process_time_ms{cluster="standalone",quantile="0.5",} NaN
pulsar_function_worker_stop_instance_process_time_ms_count{cluster="standalone",} 2.0
pulsar_function_worker_stop_instance_process_time_ms_sum{cluster="standalone",} 1000.0
# TYPE pulsar_function_worker_instance_count gauge
pulsar_function_worker_instance_count{cluster="standalone",} 2.0
"""


def test_restart_cost_from_worker_start_and_stop_times(cluster):
    admin = admin_for(cluster)
    cluster.state.worker_metrics = WORKER_METRICS
    assert admin.restart_cost_s() == pytest.approx((6000 / 4 + 1000 / 2) / 1000)
    cluster.state.worker_metrics = (
        '# TYPE pulsar_function_worker_instance_count gauge\npulsar_function_worker_instance_count{cluster="standalone",} 0.0\n'
    )
    assert admin.restart_cost_s() is None  # never started an instance: not measured
    cluster.state.worker_metrics = "<html>not metrics</html> {{{\n"
    with pytest.raises(AdminError, match="malformed worker metrics"):
        admin.restart_cost_s()


def test_max_useful_parallelism_under_failover_is_the_partition_count(cluster):
    admin = admin_for(cluster)
    cluster.state.partitions[IN_TOPIC] = 4
    base = cluster.state.functions[FQFN]
    assert admin.max_useful_parallelism(base) is None  # Shared: no cap
    assert admin.max_useful_parallelism({**base, "retainKeyOrdering": True}) is None  # Key_Shared: no cap
    assert admin.max_useful_parallelism({**base, "retainOrdering": True}) == 4
    assert admin.max_useful_parallelism({**base, "processingGuarantees": "EFFECTIVELY_ONCE"}) == 4
    two = {**base, "retainOrdering": True, "inputs": [IN_TOPIC, "public/default/side"]}
    assert admin.max_useful_parallelism(two) == 4 + 1  # a plain topic: one consumer
    conforms(cluster)


# ---- redirects ----------------------------------------------------------------------------------------
def test_307_to_another_cluster_host_keeps_credentials(cluster):
    cluster.state.credentials = {f"Bearer {TOKEN}"}
    path = "/admin/v3/functions/public/default/enrich/stats"
    cluster.state.redirects[("w1", path)] = (307, cluster.hosts["w2"].url)
    cluster.state.function_stats[FQFN] = function_stats(instance(0, 7, 7, 1.0))
    admin = admin_for(cluster, auth={"mode": "bearer", "token": TOKEN})
    assert admin.stats("public", "default", "enrich")["receivedTotal"] == 7
    seen = [(r[0], r[2], r[4]) for r in cluster.state.requests]
    assert seen == [("w1", path, f"Bearer {TOKEN}"), ("w2", path, f"Bearer {TOKEN}")]
    assert admin.session.redirects_followed == 1
    conforms(cluster)


def test_plain_requests_drops_the_token_on_that_redirect(cluster):
    """Why ClusterSession exists: requests strips Authorization on a cross-host redirect, so w2 answers 401."""
    if cluster.hosts["w2"].url.split("//")[1].startswith("127.0.0.1"):
        pytest.skip("127.0.0.2 cannot be bound here, so both fake hosts share a host name")
    cluster.state.credentials = {f"Bearer {TOKEN}"}
    path = "/admin/v3/functions/public/default/enrich/stats"
    cluster.state.redirects[("w1", path)] = (307, cluster.hosts["w2"].url)
    resp = requests.get(cluster.hosts["w1"].url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert resp.status_code == 401
    assert cluster.state.requests[-1][0] == "w2" and cluster.state.requests[-1][4] is None


def test_307_put_keeps_method_and_multipart_body(cluster):
    cluster.state.credentials = {f"Bearer {TOKEN}"}
    path = "/admin/v3/functions/public/default/enrich"
    cluster.state.redirects[("w1", path)] = (307, cluster.hosts["w2"].url)
    admin_for(cluster, auth={"mode": "bearer", "token": TOKEN}).set_parallelism("public", "default", "enrich", 5)
    assert [(r[0], r[1]) for r in cluster.state.requests] == [("w1", "PUT"), ("w2", "PUT")]
    assert cluster.state.updates[-1][1]["parallelism"] == 5
    # Pulsar documents 307 only for status/stats; a proxy or load balancer in front of the workers may
    # still redirect an update, and the fake says so: that is the one deviation, the rest conforms.
    assert cluster.state.violations == [f"[w1] PUT {path}: 307 is not documented here"]


def test_303_turns_the_call_into_a_get_as_requests_does(cluster):
    path = "/admin/v3/functions/public/default/enrich"
    cluster.state.redirects[("w1", path)] = (303, cluster.hosts["w2"].url)
    session = cluster_session([cluster.hosts["w1"].url], extra_hosts=[cluster.hosts["w2"].host_port])
    resp = session.request(
        "PUT",
        cluster.hosts["w1"].url + path,
        files={"functionConfig": (None, json.dumps({"parallelism": 3}), "application/json")},
    )
    assert resp.status_code == 200 and resp.json()["name"] == "enrich"
    assert [(r[0], r[1]) for r in cluster.state.requests] == [("w1", "PUT"), ("w2", "GET")]
    assert cluster.state.updates == []


def test_redirect_to_a_foreign_host_is_refused_without_sending_credentials(cluster):
    cluster.state.credentials = {f"Bearer {TOKEN}"}
    path = "/admin/v3/functions/public/default/enrich/status"
    foreign = cluster.hosts["foreign"]
    cluster.state.redirects[("w1", path)] = (307, foreign.url)
    admin = admin_for(cluster, auth={"mode": "bearer", "token": TOKEN})
    with pytest.raises(RedirectRefused) as err:
        admin.status("public", "default", "enrich")
    assert isinstance(err.value, AdminError)
    assert foreign.host_port in str(err.value) and "not a host of the configured cluster" in str(err.value)
    assert TOKEN not in str(err.value)
    assert [r[0] for r in cluster.state.requests] == ["w1"]  # the foreign host never saw a request
    with pytest.raises(RedirectRefused, match="no request was sent"):
        admin.session.request("GET", foreign.url + "/metrics")


def test_redirect_loops_end_with_a_clear_error(cluster):
    path = "/admin/v3/functions/public/default/enrich/stats"
    cluster.state.redirects[("w1", path)] = (307, cluster.hosts["w2"].url)
    cluster.state.redirects[("w2", path)] = (307, cluster.hosts["w1"].url)
    with pytest.raises(AdminError, match="redirect in a loop"):
        admin_for(cluster).stats("public", "default", "enrich")


# ---- bad input -------------------------------------------------------------------------------------------
def test_401_and_403_name_the_problem(cluster):
    cluster.state.credentials = {f"Bearer {TOKEN}"}
    cluster.state.forbidden = {"Bearer reader"}
    with pytest.raises(AdminError, match="401 Unauthorized") as err:
        admin_for(cluster).list("public", "default")
    assert err.value.status == 401 and "mode none" in str(err.value)
    with pytest.raises(AdminError, match="403 Forbidden") as err:
        admin_for(cluster, auth={"mode": "bearer", "token": "reader"}).get("public", "default", "enrich")
    assert err.value.status == 403


def test_404_function_and_wrong_admin_url(cluster):
    admin = admin_for(cluster)
    with pytest.raises(AdminError, match="not found \\(404\\)") as err:
        admin.stats("public", "default", "nosuch")
    assert "public/default/nosuch doesn't exist" in str(err.value)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(AdminError, match="cannot reach the functions admin API"):
        StockPulsarAdmin(f"http://127.0.0.1:{closed}", timeout_s=5).list("public", "default")
    issuer = FakeIssuer("id", "secret")  # an HTTP server that is not Pulsar
    try:
        with pytest.raises(AdminError, match="Pulsar worker or broker"):
            StockPulsarAdmin(issuer.token_url.rsplit("/oauth", 1)[0], timeout_s=5).list("public", "default")
    finally:
        issuer.close()
    with pytest.raises(ConfigError, match="not an absolute http"):
        StockPulsarAdmin("pulsar-worker:6750")


def test_malformed_bodies_are_errors_not_figures(cluster):
    admin = admin_for(cluster)
    stats_path = "/admin/v3/functions/public/default/enrich/stats"
    cluster.state.malformed[stats_path] = json.dumps({"receivedTotal": "lots", "processedSuccessfullyTotal": 1})
    with pytest.raises(AdminError, match="malformed function stats .*receivedTotal is 'lots'"):
        admin.counters("public", "default", "enrich", now=0.0)
    cluster.state.malformed[stats_path] = json.dumps(
        {"instances": [{"instanceId": 0, "metrics": {"receivedTotal": 1, "processedSuccessfullyTotal": -4}}]}
    )
    with pytest.raises(AdminError, match="instances\\[0\\].metrics.processedSuccessfullyTotal is -4"):
        admin.stats("public", "default", "enrich")
    cluster.state.malformed[stats_path] = "<html>gateway error</html>"
    with pytest.raises(AdminError, match="not JSON"):
        admin.stats("public", "default", "enrich")
    cluster.state.malformed["/admin/v3/functions/public/default"] = json.dumps({"functions": ["enrich"]})
    with pytest.raises(AdminError, match="malformed function list .*expected a JSON list"):
        admin.list("public", "default")
    cluster.state.malformed["/admin/v2/persistent/public/default/raw/partitions"] = json.dumps({"partitions": 0})
    cluster.state.malformed["/admin/v2/persistent/public/default/raw/stats"] = json.dumps(
        {"msgRateIn": 1.0, "msgInCounter": 5, "subscriptions": {FQFN: {"msgBacklog": None}}}
    )
    with pytest.raises(AdminError, match=f"subscriptions.{FQFN}.msgBacklog is None"):
        admin.topic_stats(IN_TOPIC)
    with pytest.raises(AdminError, match="must be a full name"):
        admin.topic_stats("raw")


# ---- auth modes ------------------------------------------------------------------------------------------
def test_token_file_is_reread_when_it_changes(cluster, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    cluster.state.credentials = {"Bearer first-token"}
    admin = admin_for(cluster, auth={"mode": "bearer", "token_file": str(token_file)})
    admin.list("public", "default")
    token_file.write_text("second-token-which-is-longer\n")  # rotated (size and mtime change)
    cluster.state.credentials = {"Bearer second-token-which-is-longer"}
    admin.list("public", "default")
    assert [r[4] for r in cluster.state.requests] == ["Bearer first-token", "Bearer second-token-which-is-longer"]
    token_file.unlink()
    with pytest.raises(AuthError, match="cannot read the token file"):
        admin.list("public", "default")


def test_basic_auth(cluster):
    import base64

    cluster.state.credentials = {"Basic " + base64.b64encode(b"ops:pa55word").decode()}
    admin = admin_for(cluster, auth={"mode": "basic", "username": "ops", "password": "pa55word"})
    assert admin.list("public", "default") == ["enrich"]
    conforms(cluster)


def test_oauth2_client_credentials_cached_until_expiry(cluster):
    issuer = FakeIssuer("autoscaler", "client-SECRET-9", expires_in=3600)
    short = FakeIssuer("autoscaler", "client-SECRET-9", expires_in=0)
    try:
        cluster.state.credentials = {"Bearer issued-1", "Bearer issued-2"}
        auth = {
            "mode": "oauth2",
            "oauth2_token_url": issuer.token_url,
            "oauth2_client_id": "autoscaler",
            "oauth2_client_secret": "client-SECRET-9",
            "oauth2_audience": "urn:pulsar:cluster",
        }
        admin = admin_for(cluster, auth=auth)
        for _ in range(3):
            admin.list("public", "default")
        assert issuer.issued == ["issued-1"] and issuer.bad_requests == []
        admin = admin_for(cluster, auth={**auth, "oauth2_token_url": short.token_url})
        admin.list("public", "default")
        admin.list("public", "default")
        assert short.issued == ["issued-1", "issued-2"]  # expired at once: fetched again
        bad = admin_for(cluster, auth={**auth, "oauth2_client_secret": "wrong"})
        with pytest.raises(AuthError, match="refused client 'autoscaler' \\(401: invalid_client\\)") as err:
            bad.list("public", "default")
        assert "wrong" not in str(err.value)
    finally:
        issuer.close()
        short.close()


def test_tls_client_certificate_and_ca(tmp_path):
    trustme = pytest.importorskip("trustme", reason="trustme makes the test CA and certificates")
    ca = trustme.CA()
    server_cert = ca.issue_cert("127.0.0.1")
    client_cert = ca.issue_cert("pulsar-autoscale")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_cert.configure_cert(ctx)
    ca.configure_trust(ctx)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ca_file, cert_file, key_file = tmp_path / "ca.pem", tmp_path / "client.pem", tmp_path / "client.key"
    ca.cert_pem.write_to_path(str(ca_file))
    client_cert.cert_chain_pems[0].write_to_path(str(cert_file))
    client_cert.private_key_pem.write_to_path(str(key_file))
    c = FakeCluster()
    try:
        host = c.add_host("tls", ssl_context=ctx)
        c.state.functions[FQFN] = {"tenant": "public", "namespace": "default", "name": "enrich", "parallelism": 1}
        auth = {"mode": "tls", "cert_file": str(cert_file), "key_file": str(key_file), "ca_file": str(ca_file)}
        assert StockPulsarAdmin(host.url, auth=auth, timeout_s=10).list("public", "default") == ["enrich"]
        with pytest.raises(AdminError, match="cannot reach"):  # no client certificate: handshake refused
            StockPulsarAdmin(host.url, auth={"mode": "none", "ca_file": str(ca_file)}, timeout_s=10).list("public", "default")
        assert c.state.violations == []
    finally:
        c.close()


def test_auth_config_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="auth mode 'kerberos' is unknown"):
        AuthConfig(mode="kerberos")
    with pytest.raises(ConfigError, match="bearer auth needs token or token_file"):
        AuthConfig.from_mapping({"mode": "bearer"})
    with pytest.raises(ConfigError, match="tls auth needs cert_file and key_file"):
        AuthConfig.from_mapping({"mode": "tls", "cert_file": "x.pem"})
    with pytest.raises(ConfigError, match="cert_file .*missing.pem does not exist"):
        AuthConfig.from_mapping({"mode": "tls", "cert_file": str(tmp_path / "missing.pem"), "key_file": "k"})
    with pytest.raises(ConfigError, match="unknown option\\(s\\) tokn"):
        AuthConfig.from_mapping({"mode": "bearer", "tokn": "x"})
    with pytest.raises(ConfigError, match="credentials in the auth settings, not in the URL"):
        cluster_session(["http://ops:pw@broker:8080"])
    with pytest.raises(ConfigError, match="must be host:port"):
        ClusterSession(AuthConfig(), ["broker"])


def test_secrets_never_in_repr_str_or_logs(cluster, caplog):
    caplog.set_level(logging.DEBUG)
    issuer = FakeIssuer("autoscaler", "client-SECRET-9")
    try:
        cluster.state.credentials = {f"Bearer {TOKEN}", "Bearer issued-1"}
        path = "/admin/v3/functions/public/default/enrich/stats"
        cluster.state.redirects[("w1", path)] = (307, cluster.hosts["w2"].url)
        configs = [
            {"mode": "bearer", "token": TOKEN},
            {"mode": "basic", "username": "ops", "password": "pa55word-SECRET"},
            {
                "mode": "oauth2",
                "oauth2_token_url": issuer.token_url,
                "oauth2_client_id": "autoscaler",
                "oauth2_client_secret": "client-SECRET-9",
            },
        ]
        shown = []
        for auth in configs:
            admin = admin_for(cluster, auth=auth)
            try:
                admin.stats("public", "default", "enrich")
            except AdminError as exc:
                shown.append(str(exc))
            shown += [
                repr(admin),
                str(admin),
                repr(admin.session),
                repr(admin.session.auth_config),
                str(admin.session.auth_config),
                f"{admin.session.auth_config.token}",
            ]
        assert len(shown) == 19  # basic is refused by the fake (401): its error message is checked too
        text = "\n".join(shown) + "\n" + caplog.text
        for secret in (TOKEN, "pa55word-SECRET", "client-SECRET-9", "issued-1", "b3BzOnBhNTV3b3JkLVNFQ1JFVA"):
            assert secret not in text
        assert "Secret('***')" in text
        with pytest.raises(TypeError):
            import pickle

            pickle.dumps(Secret("x"))
    finally:
        issuer.close()
