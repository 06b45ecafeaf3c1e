"""`pulsar-autoscale worker`: a function worker serving the Functions admin REST API."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import sys
import threading

import pulsar

from pulsar_autoscale.broker.profile import KINDS
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.functions.cluster.member import ClusterSettings
from pulsar_autoscale.functions.cluster.scheduler import POLICIES
from pulsar_autoscale.functions.instance.instance_user import DEFAULT_UIDS, InstanceUsers
from pulsar_autoscale.functions.model.config_validation import DEFAULT_MAX_PARALLELISM
from pulsar_autoscale.functions.runtimes.handles import RUNTIMES
from pulsar_autoscale.paths import user_data_dir
from pulsar_autoscale.pulsar_client import add_client_arguments, settings_from_args
from pulsar_autoscale.security.serving import ServerSecurity, add_server_arguments
from pulsar_autoscale.spark_bridge.session import SparkSettings
from pulsar_autoscale.stop_signals import StopSignals

# A worker's thread instances, a keyed function's front and its background state copies share one GIL: a thread
# that wants it waits up to the switch interval for a busy one (CPython's default 5 ms, on every hop of a record).
GIL_SWITCH_INTERVAL_S = 0.001
# A stop hands instances over and drains them (up to 30 s each wait); past this the process exits anyway, as a
# kill -9 would end it (nothing acknowledged is lost: state is in the changelog, unacked input is redelivered).
SHUTDOWN_TIMEOUT_S = 50.0
NOT_DRAINED = "exiting with instances not drained (they restore as after kill -9)"

log = logging.getLogger(__name__)


def configure_parser(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument("--port", type=int, default=6750, help="admin REST port (default 6750; 0 = a free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind the REST API to (default 127.0.0.1)")
    p.add_argument(
        "--metrics-url",
        default=None,
        help="the broker's Prometheus /metrics URL; used to detect pulsar-lite and apply its workarounds",
    )
    p.add_argument(
        "--web-service-url",
        default=None,
        metavar="URL",
        help="the broker's admin REST API (Pulsar's pulsarWebServiceUrl, e.g. http://broker:8080), with the "
        "connection's credentials: a deleted function's state topics are deleted there "
        "(docs/state.md); pulsar-lite has none",
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="where function code, configs and state live; functions are restored from it on restart "
        "(default $XDG_DATA_HOME/pulsar-autoscale/worker/<port>, ~/.local/share without XDG_DATA_HOME)",
    )
    p.add_argument(
        "--runtime",
        default="thread",
        choices=RUNTIMES,
        help="default instance runtime (per function: instanceRuntime in its config)",
    )
    p.add_argument(
        "--broker-kind", default="auto", choices=KINDS, help="auto: read --metrics-url to tell pulsar-lite from Apache Pulsar"
    )
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=SHUTDOWN_TIMEOUT_S,
        metavar="S",
        help="on SIGTERM/SIGINT, exit after this many seconds even if instances are still handing over "
        f"or draining (a second signal exits at once; default {SHUTDOWN_TIMEOUT_S:.0f})",
    )
    p.add_argument(
        "--max-parallelism",
        type=int,
        default=DEFAULT_MAX_PARALLELISM,
        help=f"refuse parallelism above this (default {DEFAULT_MAX_PARALLELISM})",
    )
    p.add_argument("--worker-id", default=None, help="worker id reported by the cluster API")
    p.add_argument(
        "--warm-pool",
        type=int,
        default=0,
        metavar="N",
        help="warm standby interpreters per process-runtime function: a scale-out serves within "
        "~100 ms instead of 0.3-3 s (default 0)",
    )
    p.add_argument(
        "--instance-user",
        default=None,
        metavar="NAME",
        help="run process-runtime instances, warm standbys and code validation as this user, with a clean "
        "environment (default: nobody when the worker runs as root, else the worker's own user: "
        "then user code is not isolated; docs/security.md)",
    )
    p.add_argument(
        "--instance-uids",
        default=None,
        metavar="FIRST-LAST",
        help="run each function's code as a uid and gid of its own from this range (root only; default "
        f"{DEFAULT_UIDS.start}-{DEFAULT_UIDS.stop - 1} under root when --tenant-admin is given, so one "
        "tenant's code cannot signal another's instances; docs/security.md)",
    )
    p.add_argument(
        "--allow-tenant-thread-runtime",
        action="store_true",
        help="let tenant admins' (non-superusers') functions run on the thread runtime, in the worker's "
        "memory (default: refused with 400 when --tenant-admin is given; trusted code only)",
    )
    c = p.add_argument_group("cluster (docs/cluster.md)")
    c.add_argument(
        "--cluster",
        default=None,
        metavar="NAME",
        help="join the worker cluster NAME: workers coordinate through Pulsar topics and share functions "
        "(default: this worker alone is the cluster)",
    )
    c.add_argument(
        "--capacity",
        type=int,
        default=ClusterSettings.capacity,
        help=f"instances this worker accepts (default {ClusterSettings.capacity})",
    )
    c.add_argument(
        "--scheduler",
        default=ClusterSettings.scheduler,
        choices=POLICIES,
        help="placement of new instances (default round-robin, as Pulsar's)",
    )
    c.add_argument(
        "--heartbeat-interval",
        type=float,
        default=ClusterSettings.heartbeat_interval_s,
        metavar="S",
        help=f"seconds between heartbeats (default {ClusterSettings.heartbeat_interval_s})",
    )
    c.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=ClusterSettings.heartbeat_timeout_s,
        metavar="S",
        help=f"a worker silent this long is dead and its instances move (default {ClusterSettings.heartbeat_timeout_s})",
    )
    p.add_argument(
        "--spark-master",
        default=None,
        help="where stateful stages and burst drains run: local[*] (default), spark://HOST:PORT, "
        "k8s://https://HOST:PORT or yarn (docs/spark.md, 'On a Spark cluster')",
    )
    p.add_argument(
        "--spark-conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for that session, e.g. spark.executor.memory=2g (repeatable)",
    )
    add_server_arguments(p)


def run(args: argparse.Namespace) -> int:
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    faulthandler.enable()  # a crash in native code (the Pulsar C++ client, SQLite) leaves every thread's stack
    if args.shutdown_timeout <= 0:
        raise ConfigError(f"--shutdown-timeout must be positive, got {args.shutdown_timeout}")
    try:
        cluster = (
            ClusterSettings(args.cluster, args.capacity, args.heartbeat_interval, args.heartbeat_timeout, args.scheduler)
            if args.cluster
            else None
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    data_dir = args.data_dir or str(user_data_dir("worker", str(args.port)))
    security = ServerSecurity.from_args(args)
    try:
        server = WorkerServer(
            settings_from_args(args),
            args.port,
            args.host,
            data_dir,
            args.metrics_url,
            args.runtime,
            args.broker_kind,
            args.max_parallelism,
            args.worker_id,
            cluster,
            warm_pool=args.warm_pool,
            spark=SparkSettings.from_args(args.spark_master, args.spark_conf),
            security=security,
            web_service_url=args.web_service_url,
            instance_users=InstanceUsers.from_options(args.instance_user, args.instance_uids, bool(args.tenant_admin)),
            tenant_thread_runtime=args.allow_tenant_thread_runtime,
        ).start()
    except PulsarAutoscaleError as exc:  # e.g. a cluster it could not join: the worker's client may be connecting
        print(f"error: {exc}", file=sys.stderr, flush=True)
        _exit_at_once(2)
    signals = StopSignals()
    print(
        f"worker {server.worker.worker_id} serving {server.url} (broker {args.service_url}, "
        f"{server.worker.broker_kind}, runtime {args.runtime}"
        f"{f', cluster {args.cluster}' if cluster else ''}; {security.describe()}); data in {data_dir}",
        flush=True,
    )
    print(server.worker.instance_users.describe(), flush=True)
    signals.wait()
    _stop_within(
        server,
        args.shutdown_timeout,
        "handing instances over..." if cluster else "draining instances...",
        args.service_url,
        signals,
    )
    return 0


def _stop_within(server: WorkerServer, timeout_s: float, announce: str, service_url: str, signals: StopSignals) -> None:
    """A stop that waits on a broker that is gone, or on user code that never returns, ends anyway: after
    timeout_s, or at once on a second signal (an operator's second Ctrl-C). The stop runs in a thread of its
    own, so the main thread stays free to take that signal whatever the stop is blocked in. A stop that fails
    (the broker did not answer a call of it) ends the process too, with what failed in one line."""
    over, failed = threading.Event(), []

    def stop() -> None:
        try:
            server.stop()
        except BaseException as exc:  # raised again in the main thread, as before
            failed.append(exc)
        finally:
            over.set()

    print(announce, flush=True)  # from here on a second signal counts
    threading.Thread(target=stop, name="worker-stop", daemon=True).start()
    second = signals.wait(2, timeout_s, done=over)
    if failed:
        exc = failed[0]
        if isinstance(exc, pulsar.PulsarException):
            log.error("stop: the broker at %s did not answer (%s: %s); %s", service_url, type(exc).__name__, exc, NOT_DRAINED)
        else:
            log.error("stop failed; %s", NOT_DRAINED, exc_info=exc)
        _exit_at_once(1)
    if not over.is_set() or second:
        why = "a second signal" if second else f"not done after {timeout_s:.0f} s (--shutdown-timeout)"
        log.error("stop: %s; %s; what the stop waited on:", why, NOT_DRAINED)
        faulthandler.dump_traceback()
        _exit_at_once(1)


def _exit_at_once(code: int) -> None:
    """Exit without the interpreter's teardown: the Pulsar client's threads may be in the middle of a call (still
    connecting to a broker that does not answer), and destroying them there aborts the process (SIGABRT)
    instead of exiting with `code`."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
