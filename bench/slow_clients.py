"""Latency of the worker's and the controller's HTTP API while N idle and N slow-body connections are open,
against a baseline with none, in the same run, over plain HTTP and TLS.

    .venv/bin/python bench/slow_clients.py [--n 200] [--samples 200] [--out bench/results/slow_clients.json]

Idle: a TCP connection that sends nothing (on the TLS port: not even a ClientHello). Slow-body: a request head with
Content-Length 1000, then one byte of body a second. The attackers come from 127.0.0.2, 127.0.0.3, ... (50 each,
under the per-client cap of 64), so that the cap does not simply refuse them; the measuring client is 127.0.0.1.
Measured per server: the cheap endpoint on a fresh connection per request (as a liveness probe makes; the worker's
/healthz, the controller's /metrics as it has no /healthz) and an authenticated status on a keep-alive session (as the
CLI makes: `functions status` on the worker, /status on the controller). The servers run in this process, as in the
tests. Target: p99 < 100 ms with the attackers open. Prints one JSON object and writes it to --out.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import requests
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pulsar_autoscale.admin.client import FunctionsAdmin  # noqa: E402
from pulsar_autoscale.broker.embedded import EmbeddedBroker  # noqa: E402
from pulsar_autoscale.controller.config import ControllerConfig  # noqa: E402
from pulsar_autoscale.controller.loop import Controller  # noqa: E402
from pulsar_autoscale.functions.api.server import WorkerServer  # noqa: E402
from pulsar_autoscale.security import tokens  # noqa: E402
from pulsar_autoscale.security.guard import AccessPolicy  # noqa: E402
from pulsar_autoscale.security.serving import ServerSecurity  # noqa: E402

EXCLAIM = Path(__file__).resolve().parents[1] / "functions" / "examples" / "exclaim.py"
PER_SOURCE = 50
TARGET_P99_MS = 100.0


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


class Attack:
    """N idle and N slow-body connections; a thread sends each slow one a byte a second."""

    def __init__(self, port: int, n: int, ca: str | None):
        self.ctx = ssl.create_default_context(cafile=ca) if ca else None
        self.idle: list[socket.socket] = []
        self.slow: list[socket.socket] = []
        for i in range(2 * n):
            source = f"127.0.0.{2 + i // PER_SOURCE}"
            sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
            if i % 2 == 0:
                self.idle.append(sock)
                continue
            if self.ctx:
                sock = self.ctx.wrap_socket(sock, server_hostname="127.0.0.1")
            sock.sendall(
                b"POST /admin/v3/functions/public/default/x HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/octet-stream\r\nContent-Length: 1000\r\n\r\n"
            )
            self.slow.append(sock)
        self._stop = threading.Event()
        self.bytes_sent = 0
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _trickle(self) -> None:
        while not self._stop.wait(1.0):
            for sock in self.slow:
                try:
                    sock.send(b"x")
                    self.bytes_sent += 1
                except OSError:
                    pass

    def open_counts(self) -> dict:
        """How many attacker connections the server still holds open (not closed or refused)."""

        def alive(sock) -> bool:
            try:
                sock.setblocking(False)
                return sock.recv(1) != b""
            except (BlockingIOError, ssl.SSLWantReadError):
                return True
            except OSError:
                return False
            finally:
                sock.settimeout(10)

        return {"idle": sum(map(alive, self.idle)), "slow_body": sum(map(alive, self.slow))}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self.idle + self.slow:
            sock.close()


def percentiles(samples: list[float]) -> dict:
    ms = sorted(s * 1000 for s in samples)
    return {
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2),
        "max_ms": round(ms[-1], 2),
        "n": len(ms),
    }


def measure(
    cheap_url: str, status_url: str, headers: dict, ca: str | None, samples: int, cheap_headers: dict | None = None
) -> dict:
    verify = ca or True
    cheap, status = [], []
    with requests.Session() as session:
        session.get(status_url, headers=headers, verify=verify, timeout=10).raise_for_status()
        for _ in range(samples):
            start = time.perf_counter()
            r = requests.get(cheap_url, headers=cheap_headers or {}, verify=verify, timeout=10)  # a new connection
            cheap.append(time.perf_counter() - start)
            r.raise_for_status()
            start = time.perf_counter()
            r = session.get(status_url, headers=headers, verify=verify, timeout=10)
            status.append(time.perf_counter() - start)
            r.raise_for_status()
    return {"cheap": percentiles(cheap), "status": percentiles(status)}


def run_one(
    name: str, port: int, cheap_url: str, status_url: str, headers: dict, ca: str | None, args, cheap_headers: dict | None = None
) -> dict:
    baseline = measure(cheap_url, status_url, headers, ca, args.samples, cheap_headers)
    opened = time.monotonic()
    attack = Attack(port, args.n, ca)
    try:
        time.sleep(args.settle_s)  # let the slow bodies trickle for a while first
        loaded = measure(cheap_url, status_url, headers, ca, args.samples, cheap_headers)
        still_open = attack.open_counts()
        window_s = time.monotonic() - opened
    finally:
        attack.close()
    ok = all(loaded[k]["p99_ms"] < TARGET_P99_MS for k in loaded)
    result = {
        "baseline": baseline,
        "attacked": loaded,
        "attackers_open_at_end": still_open,
        "attack_window_s": round(window_s, 1),
        "p99_under_target": ok,
    }
    print(f"{name}: baseline {baseline}, attacked {loaded}, open {still_open}", file=sys.stderr)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=200, help="idle connections, and as many slow-body ones")
    p.add_argument("--samples", type=int, default=200, help="requests per endpoint and phase")
    p.add_argument("--settle-s", type=float, default=2.0)
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "slow_clients.json"))
    args = p.parse_args(argv)
    raise_fd_limit(8 * args.n + 1024)
    logging.basicConfig(level=logging.CRITICAL)
    logging.getLogger("pulsar_autoscale").setLevel(logging.CRITICAL)

    results: dict = {
        "n_idle": args.n,
        "n_slow_body": args.n,
        "samples": args.samples,
        "target_p99_ms": TARGET_P99_MS,
        "servers": {},
    }
    with tempfile.TemporaryDirectory() as d, EmbeddedBroker(data_dir=f"{d}/broker", log_level="warn") as broker:
        ca = trustme.CA()
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(f"{d}/server.pem")
        ca.cert_pem.write_to_path(f"{d}/ca.pem")
        secret = tokens.create_secret_key()
        Path(f"{d}/secret.key").write_bytes(secret)
        auth = {"Authorization": f"Bearer {tokens.create_token('admin', secret_key=secret)}"}
        policy = AccessPolicy(
            tokens.TokenValidator.from_settings(secret_key=f"file://{d}/secret.key"), superuser_roles=frozenset({"admin"})
        )
        for tls in (False, True):
            scheme = "https" if tls else "http"
            cafile = f"{d}/ca.pem" if tls else None
            security = ServerSecurity(policy, f"{d}/server.pem" if tls else None, f"{d}/server.pem" if tls else None)
            with WorkerServer(broker.service_url, data_dir=f"{d}/worker-{scheme}", security=security) as worker:
                session = requests.Session()
                session.headers.update(auth)
                session.verify = cafile or True
                session.trust_env = False  # REQUESTS_CA_BUNDLE would override verify
                admin = FunctionsAdmin(worker.url, session=session)
                admin.create(
                    {
                        "tenant": "public",
                        "namespace": "default",
                        "name": "bench",
                        "className": "exclaim.Exclaim",
                        "inputs": [f"persistent://public/default/bench-{scheme}-in"],
                        "parallelism": 1,
                    },
                    str(EXCLAIM),
                )
                results["servers"][f"worker-{scheme}"] = run_one(
                    f"worker-{scheme}",
                    worker.port,
                    worker.url + "/healthz",
                    worker.url + "/admin/v3/functions/public/default/bench/status",
                    auth,
                    cafile,
                    args,
                )
                admin.delete("public", "default", "bench")
            config = ControllerConfig(
                service_url=broker.service_url,
                admin_url="http://127.0.0.1:9",
                http_port=0,
                decision_log=None,
                lock_topic=f"persistent://public/default/lock-{uuid.uuid4().hex[:6]}",
            )
            controller = Controller(config, security=security).start()
            try:
                url = f"{scheme}://127.0.0.1:{controller.http_port}"
                results["servers"][f"controller-{scheme}"] = run_one(
                    f"controller-{scheme}",
                    controller.http_port,
                    url + "/metrics",
                    url + "/status",
                    auth,
                    cafile,
                    args,
                    cheap_headers=auth,
                )
            finally:
                controller.stop()
    results["all_under_target"] = all(r["p99_under_target"] for r in results["servers"].values())
    text = json.dumps(results, indent=2)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    return 0 if results["all_under_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
