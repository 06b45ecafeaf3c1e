"""The embedded broker: pulsar-lite run as a child process with a generated TOML config.

Metrics are always bound to 127.0.0.1 on an explicit port: pulsar-lite's default
0.0.0.0:8080 collides as soon as two brokers run on one machine.

Clients reach pulsar-lite through `relay` (B10: a client killed with unread data would
otherwise leave its consumers, and the messages dispatched to them, on the broker until it
restarts); pulsar-lite itself listens on a private port. Both children get a parent-death
signal, so a killed wrapper never leaves an orphaned broker holding the port and the data dir.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, cast

import requests

from pulsar_autoscale.broker.lite.startup import metrics_server_lost
from pulsar_autoscale.errors import BrokerError, ConfigError
from pulsar_autoscale.netutil import free_port, wait_for_port
from pulsar_autoscale.stop_signals import StopSignals

log = logging.getLogger(__name__)
HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1
# free_port() only proposes a port: another process may bind it before the broker does. Ports picked here are
# picked again that many times; a port the caller chose is never changed.
PORT_TRIES = 3
METRICS_STARTUP_S = 5.0


class PortTaken(BrokerError):
    """A port the broker needed was bound by another process; `which`: "client", "metrics" or "lite"."""

    def __init__(self, message: str, which: str):
        super().__init__(message)
        self.which = which


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when the process that started it dies (Linux; a no-op elsewhere).

    The signal follows the thread that called Popen: start the broker from a thread that lives
    as long as it should.
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def find_binary() -> str:
    try:
        from pulsar_lite.binary_finder import find_pulsar_lite_binary
    except ImportError as exc:  # pragma: no cover - dependency is pinned
        raise BrokerError("pulsar-lite is not installed: pip install pulsar-lite") from exc
    try:
        return find_pulsar_lite_binary()
    except FileNotFoundError as exc:
        raise BrokerError(f"pulsar-lite binary not found: {exc}") from exc


def render_config(
    port: int, metrics_port: int, data_dir: str, log_level: str, keep_alive_s: int = 30, liveness_timeout_s: int = 10
) -> str:
    """keep_alive_s / liveness_timeout_s: how soon the broker drops a client that stopped answering its
    pings (a hung process): at most about their sum. pulsar-lite's defaults are 30 s and 10 s."""
    return (
        f'addr = "{HOST}:{port}"\n'
        f'db_path = "{Path(data_dir, "db").as_posix()}"\n'
        f'log_level = "{log_level}"\n'
        f"keep_alive_interval_secs = {keep_alive_s}\n"
        f"connection_liveness_check_timeout_secs = {liveness_timeout_s}\n"
        "\n[metrics]\nenabled = true\n"
        f'addr = "{HOST}:{metrics_port}"\n'
    )


@dataclass
class EmbeddedBroker:
    """A running pulsar-lite; use as a context manager or call start()/stop()."""

    port: int = 0
    metrics_port: int = 0
    data_dir: str | None = None
    log_level: str = "warn"
    keep_alive_s: int = 10  # a hung client (SIGSTOP) is dropped within about 15 s: the leader lock frees
    liveness_timeout_s: int = 5
    startup_timeout_s: float = 20.0
    relay: bool = True  # False: clients reach pulsar-lite directly, exposed to B10 (for comparisons)
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _relay: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _lite_port: int = field(default=0, init=False, repr=False)
    _log_start: int = field(default=0, init=False, repr=False)
    _owns_dir: bool = field(default=False, init=False, repr=False)

    @property
    def service_url(self) -> str:
        return f"pulsar://{HOST}:{self.port}"

    @property
    def direct_service_url(self) -> str:
        """pulsar-lite's own port, bypassing the relay (exposed to B10: for the conformance tests)."""
        return f"pulsar://{HOST}:{self._lite_port}"

    @property
    def lite_pid(self) -> int | None:
        """pulsar-lite's own pid (not the relay's): what a fault test stops to hang the broker."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.metrics_port}/metrics"

    def start(self) -> "EmbeddedBroker":
        picked = {"client": not self.port, "metrics": not self.metrics_port, "lite": self.relay or not self.port}
        for attempt in range(1, PORT_TRIES + 1):
            try:
                return self._start()
            except PortTaken as exc:
                if attempt == PORT_TRIES or not picked[exc.which]:
                    raise
                log.warning(
                    "pulsar-lite: the %s port picked for it was taken meanwhile; picking another (%s)",
                    exc.which,
                    str(exc).splitlines()[0],
                )
            self.port = 0 if picked["client"] else self.port
            self.metrics_port = 0 if picked["metrics"] else self.metrics_port
        raise AssertionError("unreachable: the last try returns or raises")

    def _start(self) -> "EmbeddedBroker":
        self.port = self.port or free_port()
        self.metrics_port = self.metrics_port or free_port()
        self._lite_port = free_port() if self.relay else self.port
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="pulsar-lite-")
            self._owns_dir = True
        os.makedirs(self.data_dir, exist_ok=True)
        conf = Path(self.data_dir, "pulsar-lite.toml")
        conf.write_text(
            render_config(
                self._lite_port, self.metrics_port, self.data_dir, self.log_level, self.keep_alive_s, self.liveness_timeout_s
            )
        )
        log = open(Path(self.data_dir, "broker.log"), "ab")
        self._log_start = log.tell()
        self._proc = subprocess.Popen(
            [find_binary(), "--config", str(conf)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        log.close()
        ok = wait_for_port(HOST, self._lite_port, self.startup_timeout_s, alive=self.alive)
        if not ok:
            reason = (
                f"pulsar-lite did not accept connections within {self.startup_timeout_s:.0f}s "
                f"(data dir {self.data_dir} locked by another broker, or unusable?)"
            )
            self._fail(reason, self._port_taken())
        if not self._metrics_answer(METRICS_STARTUP_S):  # B15: pulsar-lite runs on without it
            self._fail(
                f"pulsar-lite serves no metrics at {self.metrics_url} within {METRICS_STARTUP_S:.0f}s "
                f"(port {self.metrics_port} in use?)",
                self._port_taken(),
            )
        if not self.relay:
            return self
        self._relay = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pulsar_autoscale.broker.relay",
                str(self.port),
                str(self._lite_port),
                str(Path(self.data_dir, "broker.log")),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            preexec_fn=_die_with_parent,
        )
        relay_out = cast(IO[str], self._relay.stdout)  # stdout=PIPE, text=True
        if relay_out.readline().strip() != "relay ready":
            err = self._relay.communicate(timeout=5)[1].strip().splitlines()
            self._fail(
                f"cannot listen on {HOST}:{self.port} ({err[-1] if err else 'relay exited'}): port in use?",
                "client" if any("in use" in line.lower() for line in err) else None,
            )
        if not self.alive():  # e.g. it answered metrics, then found its own port taken (a race, under load)
            self._fail("pulsar-lite exited during startup", self._port_taken())
        return self

    def _metrics_answer(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.alive() and not metrics_server_lost(self._this_log()):
            try:
                if requests.get(self.metrics_url, timeout=1).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.05)
        return False

    def _port_taken(self) -> str | None:
        """Which of pulsar-lite's ports another process holds, from its log: the metrics port (B15: it runs
        on) or its own (it exits; with that port taken, a connect may reach the other process)."""
        text = self._this_log()
        if metrics_server_lost(text):
            return "metrics"
        if "address already in use" in text.lower() and (self._proc is None or self._proc.poll() is not None):
            return "lite" if self.relay else "client"
        return None

    def _fail(self, reason: str, taken: str | None = None) -> None:
        """Stops what started and raises; PortTaken when the `taken` port ("client", "metrics", "lite") was."""
        tail = self.log_tail()
        self.stop()
        message = f"{reason}. Broker log tail:\n{tail}"
        raise PortTaken(message, taken) if taken else BrokerError(message)

    def _this_log(self) -> str:
        """What the broker wrote since this start (the log is appended to across starts)."""
        try:
            # start sets data_dir before anything is logged (None fails in Path, as it always has)
            with open(Path(cast(str, self.data_dir), "broker.log"), "rb") as f:
                f.seek(self._log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 20) -> str:
        try:
            path = Path(cast(str, self.data_dir), "broker.log")  # start sets data_dir (None fails here, as it always has)
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        """pulsar-lite and (once started) its relay are both running."""
        lite = self._proc is not None and self._proc.poll() is None
        return lite and (self._relay is None or self._relay.poll() is None)

    def stop(self) -> None:
        if self._relay is not None:
            if self._relay.poll() is None:
                self._relay.terminate()
                try:
                    self._relay.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._relay.kill()
                    self._relay.wait()
            self._relay = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._owns_dir and self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=0, help="binary protocol port (default: a free port)")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus /metrics port on 127.0.0.1 (default: a free port)")
    p.add_argument("--data-dir", default=None, help="storage directory (default: a temporary directory removed on exit)")
    p.add_argument("--log-level", default="info", choices=["error", "warn", "info", "debug", "trace"])
    p.add_argument(
        "--kind",
        default="lite",
        choices=["lite", "apache"],
        help="lite: embedded pulsar-lite; apache: Apache Pulsar standalone (needs java and mvn; "
        "--metrics-port is then its web port: admin REST, functions API, /metrics)",
    )
    p.add_argument(
        "--version",
        default=None,
        help="Apache Pulsar version for --kind apache (default: $PULSAR_AUTOSCALE_APACHE_VERSION or 4.0.8)",
    )
    p.add_argument(
        "--token-secret-key",
        default=None,
        metavar="KEY",
        help="--kind apache: require tokens signed with this key (file:///path, from `pulsar-autoscale "
        "tokens create-secret-key`) and turn authorization on (pulsar-lite checks no credentials)",
    )
    p.add_argument(
        "--superuser-roles",
        default="admin",
        metavar="ROLES",
        help="--kind apache with --token-secret-key: comma-separated superuser roles (default admin)",
    )
    p.add_argument(
        "--broker-token",
        default=None,
        metavar="TOKEN",
        help="--kind apache with --token-secret-key: the broker's own token (token:XXX, file:/path or "
        "the token), for a superuser role; its functions worker and instances use it too",
    )


def run(args: argparse.Namespace) -> int:
    if getattr(args, "token_secret_key", None) and getattr(args, "kind", "lite") != "apache":
        raise ConfigError("--token-secret-key needs --kind apache: pulsar-lite checks no credentials")
    if getattr(args, "kind", "lite") == "apache":
        from pulsar_autoscale.broker import apache

        return apache.run(args)
    broker = EmbeddedBroker(args.port, args.metrics_port, args.data_dir, args.log_level).start()
    signals = StopSignals()
    print(f"broker ready: service-url {broker.service_url}  metrics {broker.metrics_url}  data {broker.data_dir}", flush=True)
    try:
        while not signals.wait(timeout_s=0.5):
            if not broker.alive():
                print(f"broker exited unexpectedly. Log tail:\n{broker.log_tail()}", file=sys.stderr)
                return 1
    finally:
        broker.stop()
    print("broker stopped", flush=True)
    return 0
