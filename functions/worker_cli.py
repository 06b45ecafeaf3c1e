"""`pulsar-autoscale worker`: a function worker serving the Functions admin REST API."""

from __future__ import annotations

import argparse
import signal
import threading

from .config import DEFAULT_MAX_PARALLELISM
from .runtime import RUNTIMES
from .server import WorkerServer


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--service-url", required=True, help="broker URL, e.g. pulsar://127.0.0.1:6650")
    p.add_argument("--port", type=int, default=6750, help="admin REST port (default 6750; 0 = a free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind the REST API to (default 127.0.0.1)")
    p.add_argument("--metrics-url", default=None,
                   help="the broker's Prometheus /metrics URL; used to detect pulsar-lite and apply its workarounds")
    p.add_argument("--data-dir", default="./pulsar-autoscale-worker",
                   help="where function code, configs and state live; functions are restored from it on restart")
    p.add_argument("--runtime", default="thread", choices=RUNTIMES,
                   help="default instance runtime (per function: instanceRuntime in its config)")
    p.add_argument("--broker-kind", default="auto", choices=["auto", "pulsar-lite", "apache"],
                   help="auto: read --metrics-url to tell pulsar-lite from Apache Pulsar")
    p.add_argument("--max-parallelism", type=int, default=DEFAULT_MAX_PARALLELISM,
                   help=f"refuse parallelism above this (default {DEFAULT_MAX_PARALLELISM})")
    p.add_argument("--worker-id", default=None, help="worker id reported by the cluster API")


def run(args: argparse.Namespace) -> int:
    server = WorkerServer(args.service_url, args.port, args.host, args.data_dir, args.metrics_url, args.runtime,
                          args.broker_kind, args.max_parallelism, args.worker_id).start()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"worker {server.worker.worker_id} serving {server.url} (broker {args.service_url}, "
          f"{server.worker.broker_kind}, runtime {args.runtime})", flush=True)
    stop.wait()
    print("draining instances...", flush=True)
    server.stop()
    return 0
