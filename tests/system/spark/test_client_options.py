"""Authentication and TLS options of the `pulsar` source and sink, the burst drain and stages.

pulsar-lite has no authentication, so these tests pin what can be checked here: the options
are parsed under the pulsar-spark connector's names, reach the Pulsar client (a token read
from a file, a client that connects with it), and authParams never shows in an error, a repr
or a Spark plan.
"""

from __future__ import annotations

import pulsar
import pytest

from pulsar_autoscale.pulsar_client import ClientSettings
from pulsar_autoscale.spark_bridge.options import (
    PulsarOptionError,
    client_options,
    parse_sink_options,
    parse_source_options,
)
from pulsar_autoscale.spark_bridge.ranges import Connection, last_position

SECRET = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0LXJvbGU.s3cr3t-signature"
URL = "pulsar://127.0.0.1:6650"


def source(**extra):
    return parse_source_options({"service.url": URL, "topic": "t", **extra})


@pytest.mark.parametrize("prefix", ["pulsar.client.", ""], ids=["connector-names", "bare-names"])
def test_auth_and_tls_options_are_parsed_under_the_connector_names(prefix):
    opts = source(
        **{
            f"{prefix}authPluginClassName": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
            f"{prefix}authParams": f"token:{SECRET}",
            f"{prefix}tlsTrustCertsFilePath": "/etc/ca.pem",
            f"{prefix}tlsAllowInsecureConnection": "true",
            f"{prefix}tlsHostnameVerificationEnable": "true",
        }
    )
    client = opts.connection.client
    assert client == ClientSettings(
        URL, "org.apache.pulsar.client.impl.auth.AuthenticationToken", f"token:{SECRET}", "/etc/ca.pem", True, True
    )
    assert client.bearer_token() == SECRET
    kwargs = client.client_kwargs()
    assert isinstance(kwargs["authentication"], pulsar.AuthenticationToken)
    assert kwargs["tls_trust_certs_file_path"] == "/etc/ca.pem" and kwargs["tls_allow_insecure_connection"]
    # The options a stage passes on parse back to the same settings (sink too).
    assert parse_sink_options({**client_options(client), "topic": "o"}).connection.client == client


def test_auth_params_never_show_in_errors_or_reprs():
    for bad in (
        {"authPluginClassName": "com.example.Kerberos", "authParams": SECRET},
        {"authParams": SECRET},
        {"authPluginClassName": "tls", "authParams": f"tlsCertFile:{SECRET}"},
        {"authParams": SECRET, "pulsar.client.authParams": SECRET},
        {"pulsar.client.tlsAllowInsecureConnection": "maybe", "authParams": SECRET},
    ):
        with pytest.raises(PulsarOptionError) as info:
            source(**bad)
        assert SECRET not in str(info.value), str(info.value)
    opts = source(authPluginClassName="token", authParams=SECRET)
    assert SECRET not in repr(opts) and SECRET not in repr(Connection(opts.connection))


def test_a_token_file_is_read_and_the_client_connects_with_it(broker, tmp_path, pulsar_client, topic):
    """Token auth end to end as far as pulsar-lite allows: the client sends the token (pulsar-lite
    ignores it) and reads; a missing token file fails naming the file, not its content."""
    token = tmp_path / "token"
    token.write_text(SECRET + "\n")
    pulsar_client.create_producer(topic).send(b"x")
    opts = parse_source_options(
        {
            "service.url": broker.service_url,
            "topic": topic,
            "pulsar.client.authPluginClassName": "token",
            "pulsar.client.authParams": f"file://{token}",
        }
    )
    assert opts.connection.client.bearer_token() == SECRET
    conn = Connection(opts.connection)
    try:
        assert last_position(conn, topic) is not None
    finally:
        conn.close()
    with pytest.raises(PulsarOptionError, match="cannot read the token file"):
        source(authPluginClassName="token", authParams=f"file://{tmp_path}/missing")


@pytest.mark.spark
def test_auth_params_do_not_show_in_spark_plans(spark, broker, pulsar_client, topic):
    pulsar_client.create_producer(topic).send(b"x")
    df = (
        spark.read.format("pulsar")
        .option("service.url", broker.service_url)
        .option("topic", topic)
        .option("pulsar.client.authPluginClassName", "token")
        .option("pulsar.client.authParams", f"token:{SECRET}")
        .load()
    )
    plans = df._jdf.queryExecution().toString()
    assert "pulsar" in plans.lower() and SECRET not in plans, plans
    assert df.count() == 1
