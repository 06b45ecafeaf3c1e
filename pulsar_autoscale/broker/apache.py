"""A real Apache Pulsar: `bin/pulsar standalone` from the binary distribution on Maven Central.

Broker-facing behaviour is tested on stock Pulsar as well as on the embedded pulsar-lite, and
this is the one-command way to get it: the distribution
(`org.apache.pulsar:pulsar-server-distribution:<version>:tar.gz:bin`) is fetched through Maven,
verified and unpacked once into the user's cache directory; every instance then runs from a
private copy of `conf/` in its own data directory, on free ports, so several can run at once and
nothing is ever written into the cache tree.

`bin/pulsar` execs java, so the child's pid is the JVM's own; the JVM gets a parent-death signal
(as the embedded broker does), so a killed wrapper never leaves a standalone holding its ports.
"""

from __future__ import annotations

import argparse
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
from typing import cast

import requests
import yaml

from pulsar_autoscale.broker.apache_dist import ensure_distribution, require_tools
from pulsar_autoscale.broker.apache_python import python_instance_missing, python_shim
from pulsar_autoscale.broker.embedded import _die_with_parent
from pulsar_autoscale.broker.token_auth import TokenAuth
from pulsar_autoscale.errors import BrokerError, ConfigError
from pulsar_autoscale.netutil import free_port
from pulsar_autoscale.pulsar_client import ClientSettings
from pulsar_autoscale.stop_signals import StopSignals

log = logging.getLogger(__name__)
HOST = "127.0.0.1"
PORT_TRIES = 3
# Sized for a 2-core, 24 GB machine shared with tests: the distribution's defaults are 2 GB heap, 4 GB direct
# memory and -XX:+AlwaysPreTouch (which alone costs seconds of system time at every start).
DEFAULT_MEM = "-Xms512m -Xmx1g -XX:MaxDirectMemorySize=1g"
DEFAULT_GC = "-XX:+UseG1GC -XX:ParallelGCThreads=2 -XX:ConcGCThreads=1 -XX:+PerfDisableSharedMem"
BOOKIE_CACHE_MB = 32
LEADER_READY_LOG = "FunctionMetaDataManager done becoming leader"
LEADER_LOG_GRACE_S = 20.0
# Started again over the data of a standalone killed with -9, the bookie can take over the registration the killed
# one left in the metadata store, whose expiry then deletes it: the bookie shuts down and the whole standalone
# exits during startup (seen once in a test run that kills and restarts one). A second start finds it gone.
REGISTRATION_LOST_LOG = ("Lock on resource /ledgers/available/", "was invalidated")
STARTS_AFTER_REGISTRATION_LOST = 2


class _RegistrationLost(BrokerError):
    """The standalone exited during startup because its bookie's registration was deleted under it."""


def _set_properties(path: Path, values: dict[str, object]) -> None:
    """key=value edits of a Java properties file: replace the key's lines, append the keys it lacks."""
    lines = path.read_text().splitlines()
    seen: set[str] = set()
    out = []
    for line in lines:
        key = line.split("=", 1)[0].strip() if "=" in line and not line.lstrip().startswith("#") else None
        if key in values:
            if key in seen:
                continue
            seen.add(key)
            line = f"{key}={values[key]}"
        out.append(line)
    out += [f"{k}={v}" for k, v in values.items() if k not in seen]
    path.write_text("\n".join(out) + "\n")


def registration_lost(startup_log: str) -> bool:
    """The log of a start says its bookie's registration was deleted under it (REGISTRATION_LOST_LOG)."""
    return any(all(part in line for part in REGISTRATION_LOST_LOG) for line in startup_log.splitlines())


@dataclass
class ApacheStandalone:
    """A running `bin/pulsar standalone` (broker, BookKeeper, RocksDB metadata, functions worker); use as a
    context manager or call start()/stop()."""

    version: str | None = None  # default: $PULSAR_AUTOSCALE_APACHE_VERSION or DEFAULT_VERSION
    port: int = 0  # brokerServicePort (default: a free port)
    web_port: int = 0  # webServicePort: admin REST, /metrics, functions API
    data_dir: str | None = None  # default: a temporary directory removed on stop()
    functions_worker: bool = True
    startup_timeout_s: float = 120.0
    stop_timeout_s: float = 30.0
    jvm_mem: str = DEFAULT_MEM
    jvm_gc: str = DEFAULT_GC
    log_level: str = "info"
    # statsUpdateFrequencyInSecs, its initial delay and managedLedgerStatsPeriodSeconds (Pulsar's defaults: 60 s):
    # topic rates (msgRateIn/Out), the /metrics gauges and entry sizes refresh this often, like pulsar-lite's (5 s)
    stats_interval_s: int = 5
    # The interpreter the process runtime launches for Python functions: Pulsar runs `python3` from PATH, so the
    # JVM's PATH starts with a directory whose `python3` execs this one (apache_python.python_shim). It needs
    # pulsar-client[functions]: see apache_python.PYTHON_INSTANCE_MODULES; start() warns about what it lacks.
    python: str = sys.executable
    # None: no authentication, as the distribution ships; a TokenAuth: tokens required, authorization on
    auth: TokenAuth | None = None
    # more standalone.conf keys, applied last (e.g. keepAliveIntervalSeconds: how soon a hung client is dropped)
    properties: dict[str, object] = field(default_factory=dict)
    start_s: float | None = field(default=None, init=False)
    python_missing: list[str] = field(default_factory=list, init=False)  # modules the python instance lacks
    home: Path | None = field(default=None, init=False, repr=False)
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _owns_dir: bool = field(default=False, init=False, repr=False)
    _log_start: int = field(default=0, init=False, repr=False)

    @property
    def service_url(self) -> str:
        return f"pulsar://{HOST}:{self.port}"

    @property
    def admin_url(self) -> str:
        """The web service: admin REST v2, the functions worker's /admin/v3/functions, /metrics."""
        return f"http://{HOST}:{self.web_port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.admin_url}/metrics"

    def http_session(self) -> requests.Session:
        """A session for the admin REST API, with the broker's own (superuser) token when auth is on: the same
        credentials path as every other client of ours (ClientSettings)."""
        if self.auth is None:
            return ClientSettings(self.service_url).http_session()
        return ClientSettings(self.service_url, "token", f"token:{self.auth.broker_token}").http_session()

    @property
    def pid(self) -> int | None:
        """The JVM's pid (bin/pulsar execs java)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def log_path(self) -> Path:
        return Path(self.data_dir or ".", "logs", "pulsar-standalone.out")

    def start(self) -> "ApacheStandalone":
        require_tools("java")
        self.home = ensure_distribution(self.version)
        picked = (not self.port, not self.web_port)
        taken = lost = 0  # starts that failed on a port taken meanwhile, on a registration lost
        while True:
            try:
                return self._start()
            except _RegistrationLost:
                lost += 1
                if lost > STARTS_AFTER_REGISTRATION_LOST:
                    raise
                log.warning(
                    "apache pulsar: its bookie lost its registration during startup (the registration a killed "
                    "standalone left on this data expired under it); starting again"
                )
            except BrokerError as exc:
                taken += 1
                in_use = "address already in use" in str(exc).lower()
                if not in_use or taken == PORT_TRIES or not any(picked):
                    raise
                log.warning("apache pulsar: a port picked for it was taken meanwhile; picking others")
                self.port = 0 if picked[0] else self.port
                self.web_port = 0 if picked[1] else self.web_port

    def _start(self) -> "ApacheStandalone":
        self.port = self.port or free_port()
        self.web_port = self.web_port or free_port()
        bk_port, stream_port, zk_port = free_port(), free_port(), free_port()
        if self.data_dir is None:
            self.data_dir = tempfile.mkdtemp(prefix="apache-pulsar-")
            self._owns_dir = True
        data = Path(self.data_dir)
        conf = self._write_conf(data, bk_port)
        pybin = data / "pybin"
        pybin.mkdir(exist_ok=True)
        shim = pybin / "python3"
        shim.write_text(python_shim(self.python))
        shim.chmod(0o755)
        env = dict(
            os.environ,
            PULSAR_MEM=self.jvm_mem,
            PULSAR_GC=self.jvm_gc,
            PULSAR_LOG_DIR=str(data / "logs"),
            PULSAR_LOG_LEVEL=self.log_level,
            PULSAR_LOG_CONF=str(conf / "log4j2.yaml"),
            FUNCTIONS_LOG_CONF=str(conf / "functions_log4j2.xml"),
            PULSAR_STANDALONE_CONF=str(conf / "standalone.conf"),
            PULSAR_ROUTING_APPENDER_DEFAULT="Console",
            PATH=f"{pybin}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        home = cast(Path, self.home)  # start sets it before _start
        cmd = [
            str(home / "bin" / "pulsar"),
            "standalone",
            "--config",
            str(conf / "standalone.conf"),
            "--functions-worker-conf",
            str(conf / "functions_worker.yml"),
            "--metadata-dir",
            str(data / "metadata"),
            "--bookkeeper-dir",
            str(data / "bookkeeper"),
            "--bookkeeper-port",
            str(bk_port),
            "--zookeeper-dir",
            str(data / "zookeeper"),
            "--zookeeper-port",
            str(zk_port),
            "--stream-storage-port",
            str(stream_port),
            "--no-stream-storage",
            "--advertised-address",
            HOST,
        ]
        if not self.functions_worker:
            cmd.append("--no-functions-worker")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log_path, "ab")
        self._log_start = out.tell()
        spawned = time.monotonic()
        # bin/pulsar cds to PULSAR_HOME (the cache tree) before exec'ing java: every path the standalone writes is
        # made absolute, under the data dir, in _write_conf and the flags above.
        self._proc = subprocess.Popen(
            cmd, cwd=data, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
        )
        out.close()
        if self.functions_worker:
            self.python_missing = python_instance_missing(self.python)
            if self.python_missing:
                log.warning(
                    "Python functions on this standalone will fail to start: %s lacks %s "
                    "(pip install 'pulsar-client[functions]' there)",
                    self.python,
                    ", ".join(self.python_missing),
                )
        self._wait_ready(spawned)
        self.start_s = time.monotonic() - spawned
        log.info(
            "apache pulsar %s ready in %.1fs (pid %s, RSS %.0f MB)", home.parent.name, self.start_s, self.pid, self.rss_mb() or 0
        )
        return self

    def _write_conf(self, data: Path, bk_port: int) -> Path:
        """A private copy of the distribution's conf/ with this instance's ports, dirs and sizing."""
        conf = data / "conf"
        shutil.rmtree(conf, ignore_errors=True)
        shutil.copytree(cast(Path, self.home) / "conf", conf)  # start sets home before _start writes this
        _set_properties(
            conf / "standalone.conf",
            {
                "brokerServicePort": self.port,
                "webServicePort": self.web_port,
                "bindAddress": HOST,
                "advertisedAddress": HOST,
                "clusterName": "standalone",
                "managedLedgerDefaultEnsembleSize": 1,
                "managedLedgerDefaultWriteQuorum": 1,
                "managedLedgerDefaultAckQuorum": 1,
                # the bookie reads standalone.conf too: small caches (the default is direct memory / 8 each)
                "dbStorage_writeCacheMaxSizeMb": BOOKIE_CACHE_MB,
                "dbStorage_readAheadCacheMaxSizeMb": BOOKIE_CACHE_MB,
                "httpServerEnabled": "false",
                "bookiePort": bk_port,
                "brokerShutdownTimeoutMs": 5000,
                "statsUpdateFrequencyInSecs": self.stats_interval_s,
                "statsUpdateInitialDelayInSecs": self.stats_interval_s,
                "managedLedgerStatsPeriodSeconds": self.stats_interval_s,  # the entry-size figures, too
                # the functions worker's package store (the file system provider in RocksDB-metadata mode); its
                # default is the relative "packages-storage", i.e. inside the cache tree
                "STORAGE_PATH": data / "packages-storage",
                **(self.auth.broker_properties() if self.auth else {}),
                **self.properties,
            },
        )
        fw_path = conf / "functions_worker.yml"
        fw = yaml.safe_load(fw_path.read_text()) or {}
        fw.update(
            {
                "pulsarFunctionsCluster": "standalone",
                "workerHostname": HOST,
                "workerPort": self.web_port,
                "pulsarServiceUrl": self.service_url,
                "pulsarWebServiceUrl": self.admin_url,
                "downloadDirectory": str(data / "download" / "pulsar_functions"),
                "connectorsDirectory": str(data / "connectors"),
                "functionsDirectory": str(data / "functions"),
                "functionRuntimeFactoryClassName": "org.apache.pulsar.functions.runtime.process.ProcessRuntimeFactory",
            }
        )
        # Process runtime. The python instance (instances/python-instance/python_instance_main.py) is run as
        # `python3 python_instance_main.py ...` with its own dir on sys.path (Function_pb2, server, log, ...);
        # it imports `pulsar`, google.protobuf (gencode 6.31: protobuf >= 6 needed), grpc, prometheus_client
        # and, through state_context / python_instance, `bookkeeper` (apache-bookkeeper-client) and `ratelimit`:
        # pulsar-client[functions]. pythonInstanceLocation stays the distribution's (read-only use).
        runtime = dict(fw.get("functionRuntimeFactoryConfigs") or {})
        runtime["logDirectory"] = str(data / "logs" / "functions")
        fw["functionRuntimeFactoryConfigs"] = runtime
        if self.auth is not None:
            fw.update(self.auth.worker_settings())
        fw_path.write_text(yaml.safe_dump(fw, sort_keys=False))
        return conf

    def _ready_problem(self) -> str | None:
        """What is not ready yet (None: all of it), from the admin REST API."""
        checks: list[tuple[str, str | None]] = [
            ("/admin/v2/clusters", "standalone"),
            ("/admin/v2/namespaces/public", "public/default"),
        ]
        if self.functions_worker:
            checks.append(("/admin/v3/functions/public/default", None))
            checks.append(("/admin/v2/worker/cluster/leader", "workerId"))
        session = self.http_session()
        for path, needle in checks:
            try:
                r = session.get(self.admin_url + path, timeout=2)
            except requests.RequestException:
                return f"{path} does not answer"
            if r.status_code != 200 or (needle is not None and needle not in r.text):
                return f"{path} answers {r.status_code} {r.text.strip()[:120]}"
        return None

    def _leader_ready(self) -> bool:
        """The functions worker's leader can take writes. The REST API answers reads and names the leader about
        1.5 s before that: a create in between gets 503 "Leader not yet ready", and no GET tells the two apart,
        so this reads the log line the leader writes once its metadata producer is up (INFO level)."""
        if not self.functions_worker or self.log_level not in ("info", "debug", "trace"):
            return True
        return LEADER_READY_LOG in self._startup_log()

    def _wait_ready(self, spawned: float) -> None:
        deadline = spawned + self.startup_timeout_s
        problem: str | None = "not started"
        rest_ready_at: float | None = None
        while time.monotonic() < deadline:
            proc = cast(subprocess.Popen, self._proc)  # _start spawned it before waiting
            if proc.poll() is not None:
                reason = f"apache pulsar standalone exited with {proc.returncode} during startup"
                self._fail(reason, _RegistrationLost if registration_lost(self._startup_log()) else BrokerError)
            if rest_ready_at is None:
                problem = self._ready_problem()
                rest_ready_at = time.monotonic() if problem is None else None
            if rest_ready_at is not None:
                if self._leader_ready():
                    return
                if time.monotonic() - rest_ready_at > LEADER_LOG_GRACE_S:  # another version's wording: go on
                    log.warning(
                        "no %r in the log %.0fs after the REST API answered; assuming the functions worker's leader is ready",
                        LEADER_READY_LOG,
                        LEADER_LOG_GRACE_S,
                    )
                    return
                problem = "functions worker leader not ready"
            time.sleep(0.25)
        self._fail(f"apache pulsar standalone not ready within {self.startup_timeout_s:.0f}s ({problem})")

    def _fail(self, reason: str, error: type[BrokerError] = BrokerError) -> None:
        tail = self.log_tail(40)
        self.stop()
        raise error(f"{reason}; log {self.log_path}, tail:\n{tail}")

    def _startup_log(self) -> str:
        """What this start wrote to the log so far."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                return "\n".join(f.read().decode(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def rss_mb(self) -> float | None:
        """The JVM's resident set (VmRSS), MB; None when it is not running."""
        pid = self.pid
        if pid is None:
            return None
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """SIGTERM (the standalone's shutdown hook closes broker, worker and bookie), then SIGKILL."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("apache pulsar did not stop within %.0fs of SIGTERM; killing it", self.stop_timeout_s)
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._owns_dir and self.data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None
            self._owns_dir = False

    def __enter__(self) -> "ApacheStandalone":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def run(args: argparse.Namespace) -> int:
    """`pulsar-autoscale broker --kind apache`: start, print where it is, run until SIGINT/SIGTERM."""
    signals = StopSignals()
    auth = None
    if getattr(args, "token_secret_key", None):
        if not args.broker_token:
            raise ConfigError(
                "--token-secret-key needs --broker-token: the broker's own token, for a superuser "
                "role (pulsar-autoscale tokens create --subject admin --secret-key ...)"
            )
        roles = tuple(r.strip() for r in args.superuser_roles.split(",") if r.strip())
        # token:XXX, file:/path or bare; the "token" plugin always gives one (None is for other plugins)
        token = cast(str, ClientSettings("", "token", args.broker_token).bearer_token())
        auth = TokenAuth(broker_token=token, superusers=roles, secret_key=args.token_secret_key)
    broker = ApacheStandalone(
        version=args.version,
        port=args.port,
        web_port=args.metrics_port,
        data_dir=args.data_dir,
        log_level=args.log_level,
        auth=auth,
    ).start()
    home = cast(Path, broker.home)  # start set it
    print(
        f"apache pulsar {home.parent.name} ready: service-url {broker.service_url}  "
        f"admin-url {broker.admin_url}  metrics {broker.metrics_url}",
        flush=True,
    )
    print(
        f"started in {broker.start_s:.1f}s  pid {broker.pid}  RSS {broker.rss_mb() or 0:.0f} MB  log {broker.log_path}",
        flush=True,
    )
    if auth is not None:
        print(
            f"token authentication and authorization on: superusers {','.join(auth.superusers)}; "
            f"make tokens with `pulsar-autoscale tokens create --secret-key {args.token_secret_key} "
            f"--subject ROLE`",
            flush=True,
        )
    try:
        while not signals.wait(timeout_s=0.5):
            if not broker.alive():
                print(f"apache pulsar exited unexpectedly. Log tail:\n{broker.log_tail()}", file=sys.stderr)
                return 1
    finally:
        broker.stop()
    print("broker stopped", flush=True)
    return 0
