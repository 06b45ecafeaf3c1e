"""`pulsar-autoscale functions localrun`: a function in the foreground, against a broker, no worker.

Like Pulsar's localrun: the instances (`--parallelism`, thread runtime) run in this process with the
same loop as on a worker, so retries, the dead-letter topic and every other config field behave the
same; state lives in a local directory. Ctrl-C drains them and exits.
"""

from __future__ import annotations

import argparse
import logging
import threading

from pulsar_autoscale.broker.profile import BrokerProfile, resolve
from pulsar_autoscale.functions.instance.instance import Instance, subscribe_fenced
from pulsar_autoscale.functions.instance.loader import load_callable
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.state.store import StateStore
from pulsar_autoscale.paths import user_data_dir
from pulsar_autoscale.pulsar_client import ClientSettings, open_client
from pulsar_autoscale.stop_signals import StopSignals

DEFAULT_SERVICE_URL = "pulsar://127.0.0.1:6650"
log = logging.getLogger(__name__)


def localrun(args: argparse.Namespace, data: dict) -> int:
    cfg = FunctionConfig.from_dict(data)
    code = str(args.py) if args.py else None
    load_callable(cfg.className, code)  # refuse at once what could never run
    service_url = args.broker_service_url or args.service_url or DEFAULT_SERVICE_URL
    settings = ClientSettings(
        service_url, args.auth_plugin, args.auth_params, args.tls_trust_cert_path, args.tls_allow_insecure_connection
    )
    state_dir = args.state_dir or user_data_dir("localrun", cfg.tenant, cfg.namespace, cfg.name)
    broker = resolve(args.broker_kind, args.metrics_url)
    client = open_client(settings, operation_timeout_seconds=30)
    state = StateStore(f"{state_dir}/state.sqlite", cfg.numKeyGroups, keyed=cfg.keyedState)
    instances = [
        Instance(cfg, i, client, code, state, lambda: cfg.parallelism, open_input=_input(client, cfg, i, broker))
        for i in range(cfg.parallelism)
    ]
    threads = [threading.Thread(target=inst.run, name=f"{cfg.fqfn}:{inst.instance_id}", daemon=True) for inst in instances]
    signals = StopSignals()
    for t in threads:
        t.start()
    print(
        f"localrun {cfg.fqfn}: {cfg.parallelism} instance(s) on {service_url} ({broker.name}), inputs "
        f"{', '.join(cfg.inputs) or cfg.topicsPattern} -> {cfg.output or '(no output)'}; state in {state_dir}; "
        "Ctrl-C to stop",
        flush=True,
    )
    while not signals.wait(timeout_s=0.5):
        if not any(t.is_alive() for t in threads):
            break
    for inst in instances:
        inst.stop()
    for t in threads:
        t.join(30)
    client.close()
    totals = [inst.stats.figures() for inst in instances]
    failed = [f.error for f in totals if f.error]
    print(
        f"localrun {cfg.fqfn} stopped: {sum(f.processed for f in totals)} processed, "
        f"{sum(f.user_exceptions for f in totals)} user exceptions",
        flush=True,
    )
    if failed:
        print(f"error: {failed[0]}", flush=True)
        return 1
    return 0


def _input(client, cfg: FunctionConfig, instance_id: int, broker: BrokerProfile):
    """An instance's consumer, as a worker opens it on `broker`: a FAILOVER input counts its own nacks, or no retry
    would ever reach maxMessageRetries (broker/lite/nack_redelivery.py), and on pulsar-lite fetches one message at a
    time (a larger receiver queue delivers messages twice there, B1)."""
    return lambda: subscribe_fenced(client, cfg, f"{cfg.fqfn}:{instance_id}", broker)
