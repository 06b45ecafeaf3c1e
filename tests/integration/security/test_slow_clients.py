"""Clients that connect and send nothing, or send slowly: they must not hold the worker's or the controller's HTTP
server (the attack: one idle socket on the TLS port used to block every other request, with no credentials).

The secured worker (TLS, tokens) and a TLS controller take the attack as it was found; a small app served by the
same ``ServerSecurity.make_server`` with short limits shows the timeouts, the per-client cap and the stop.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
import uuid

import pytest
import requests
from flask import Flask, request

from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.security import tokens
from pulsar_autoscale.security.guard import AccessPolicy
from pulsar_autoscale.security.httpd import ServerLimits
from pulsar_autoscale.security.serving import ServerSecurity
from tests.support.scenario import wait_until
from tests.support.secured_worker import FNS, SUPERUSER, token

SHORT = ServerLimits(threads=2, idle_timeout_s=0.5, handshake_timeout_s=0.5, head_timeout_s=0.5, body_timeout_s=0.5)
PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01"  # a TLS record header and one byte of a ClientHello


def timed_get(url: str, ca: str, **kw) -> tuple[requests.Response, float]:
    start = time.monotonic()
    r = requests.get(url, verify=ca, timeout=2, **kw)
    return r, time.monotonic() - start


def closed_by_server(sock: socket.socket, within_s: float) -> bytes:
    """Blocks until the server closes the connection (at most within_s); what it sent before closing."""
    sock.settimeout(within_s)
    received = b""
    with contextlib.suppress(ConnectionResetError, ssl.SSLError):
        while data := sock.recv(4096):
            received += data
    return received


# ---- the attack, on the secured worker and a TLS controller ---------------------------------------------------
def test_an_idle_or_half_handshaken_socket_does_not_block_the_tls_worker(worker, keys):
    idle = socket.create_connection(("127.0.0.1", worker.port))
    half = socket.create_connection(("127.0.0.1", worker.port))
    half.sendall(PARTIAL_CLIENT_HELLO)
    try:
        r, took = timed_get(worker.url + "/healthz", keys["ca"])
        assert r.status_code == 200 and took < 2, took
        r, took = timed_get(
            worker.url + f"{FNS}/public/default", keys["ca"], headers={"Authorization": f"Bearer {token(keys, SUPERUSER)}"}
        )
        assert r.status_code == 200 and took < 2, took
    finally:
        idle.close()
        half.close()


def test_an_idle_socket_does_not_block_the_tls_controller(broker, keys):
    policy = AccessPolicy(
        tokens.TokenValidator.from_settings(secret_key=keys["secret_spec"]), superuser_roles=frozenset({SUPERUSER})
    )
    config = ControllerConfig(
        service_url=broker.service_url,
        admin_url="http://127.0.0.1:9",
        http_port=0,
        decision_log=None,
        lock_topic=f"persistent://public/default/lock-{uuid.uuid4().hex[:6]}",
    )
    controller = Controller(config, security=ServerSecurity(policy, keys["pem"], keys["pem"])).start()
    idle = socket.create_connection(("127.0.0.1", controller.http_port))
    try:
        url = f"https://127.0.0.1:{controller.http_port}/status"
        r, took = timed_get(url, keys["ca"], headers={"Authorization": f"Bearer {token(keys, SUPERUSER)}"})
        assert r.status_code == 200 and took < 2, took
        assert timed_get(url, keys["ca"])[0].status_code == 401
    finally:
        idle.close()
        started = time.monotonic()
        controller.stop()
        assert time.monotonic() - started < 5


# ---- a small app, short limits ---------------------------------------------------------------------------
@pytest.fixture
def serve(keys):
    """serve(limits, tls) -> (server, host-port, scheme): the app on ServerSecurity.make_server, stopped after."""
    servers = []

    def start(limits: ServerLimits = SHORT, tls: bool = False):
        app = Flask("slow-clients")
        app.add_url_rule("/healthz", "healthz", lambda: {"ok": True})
        app.add_url_rule("/echo", "echo", lambda: {"n": len(request.get_data())}, methods=["POST"])
        security = ServerSecurity(
            tls_cert_file=keys["pem"] if tls else None, tls_key_file=keys["pem"] if tls else None, limits=limits
        )
        server = security.make_server("127.0.0.1", 0, app)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, f"{security.scheme}://127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()


def connect(server, tls: bool, keys, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.server_port), timeout=5, source_address=(source, 0))
    if tls:
        sock = ssl.create_default_context(cafile=keys["ca"]).wrap_socket(sock, server_hostname="127.0.0.1")
    return sock


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_idle_slow_header_and_slow_body_connections_are_closed_within_their_timeouts(serve, keys, tls):
    server, url = serve(SHORT, tls)
    bound = SHORT.idle_timeout_s + 1.5  # the timeout, plus the server's check interval (0.5 s) and slack
    idle_tcp = socket.create_connection(("127.0.0.1", server.server_port))  # not even a TLS handshake
    idle = connect(server, tls, keys)  # between requests
    slow_head = connect(server, tls, keys)
    slow_head.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    slow_body = connect(server, tls, keys)
    slow_body.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
    started = time.monotonic()
    for name, sock in (("idle tcp", idle_tcp), ("idle", idle), ("slow head", slow_head), ("slow body", slow_body)):
        sent = closed_by_server(sock, bound + 1)
        took = time.monotonic() - started
        assert took < bound, (name, took)
        assert sent == b"" or sent.startswith(b"HTTP/1.1 408"), (name, sent)
        sock.close()
    assert requests.get(url + "/healthz", verify=keys["ca"], timeout=2).json() == {"ok": True}


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_slow_clients_hold_no_thread_of_the_pool(serve, keys, tls):
    limits = ServerLimits(threads=2)
    server, url = serve(limits, tls)
    attackers = []
    for _ in range(4 * limits.threads):
        attackers.append(socket.create_connection(("127.0.0.1", server.server_port)))  # idle
        slow = connect(server, tls, keys)
        slow.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
        attackers.append(slow)
    try:
        with requests.Session() as session:
            for _ in range(10):
                start = time.monotonic()
                assert session.get(url + "/healthz", verify=keys["ca"], timeout=2).status_code == 200
                assert time.monotonic() - start < 1
            r = session.post(url + "/echo", data=b"y" * 1000, verify=keys["ca"], timeout=2)
            assert r.json() == {"n": 1000}
    finally:
        for sock in attackers:
            sock.close()


def test_a_client_over_the_per_client_cap_is_refused_and_others_are_not(serve, keys):
    server, url = serve(ServerLimits(per_client_connections=3))
    held = []
    for _ in range(3):
        conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=5)
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b'{"ok":true}\n'  # accepted, served, kept alive
        held.append(conn)
    over = socket.create_connection(("127.0.0.1", server.server_port), timeout=5)
    over.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert closed_by_server(over, 5) == b""
    over.close()
    other = socket.create_connection(("127.0.0.1", server.server_port), timeout=5, source_address=("127.0.0.2", 0))
    other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert closed_by_server(other, 5).startswith(b"HTTP/1.1 200")  # another address is served
    other.close()
    held.pop().close()
    wait_until(lambda: server._connections.connections_of("127.0.0.1") < 3, 5, "the server to see the close")
    assert requests.get(url + "/healthz", timeout=2).status_code == 200


def test_keep_alive_serves_several_requests_on_one_connection(serve, keys):
    server, _ = serve(ServerLimits())
    conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=5)
    conn.request("GET", "/healthz")
    first = conn.getresponse()
    first.read()
    sock = conn.sock
    for _ in range(3):
        conn.request("POST", "/echo", body=b"z" * 100)
        resp = conn.getresponse()
        assert resp.read() == b'{"n":100}\n' and resp.getheader("Connection") != "close"
    assert conn.sock is sock and first.version == 11
    conn.close()


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_stop_is_prompt_with_slow_clients_connected(serve, keys, tls):
    server, url = serve(ServerLimits(), tls)
    socks = [socket.create_connection(("127.0.0.1", server.server_port)) for _ in range(5)]
    slow = connect(server, tls, keys)
    slow.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n")  # streamed: read in a thread
    assert requests.get(url + "/healthz", verify=keys["ca"], timeout=2).status_code == 200
    started = time.monotonic()
    server.shutdown()
    assert time.monotonic() - started < 3
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "/healthz", verify=keys["ca"], timeout=2)
    for sock in [*socks, slow]:
        sock.close()
