"""`pulsar-autoscale controller --config controller.yaml`: run one controller replica."""

from __future__ import annotations

import argparse
import signal
import threading

from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.security.serving import ServerSecurity, add_server_arguments
from pulsar_autoscale.stop_signals import StopSignals

EXAMPLE = """\
example controller.yaml:
  service_url: pulsar://127.0.0.1:6650
  admin_url: http://127.0.0.1:6750
  metrics_url: http://127.0.0.1:8080/metrics
  policy: predictive          # the default; threshold | queueing | ds2 | ... | path/to/policy.py
  policy_params: {p99_s: 1.0, scale_in_periods: 2}
  fast: {enabled: true, period_s: 1}   # recommended (off by default): a scale-out check every second
  period_s: 30
  window_s: 30
  plan: {min_parallelism: 1, max_parallelism: 15, cooldown_s: 60,
         bounds: [{pattern: "public/default/recognize*", min: 2, max: 10}]}
  dry_run: false
  decision_log: decisions.jsonl   # default $XDG_DATA_HOME/pulsar-autoscale/controller/decisions.jsonl
  auth: {mode: bearer, token_file: /etc/pulsar-autoscale/controller.token}   # our worker's API (or stock Pulsar's)
  client: {auth_plugin: token, auth_params: "file:///etc/pulsar-autoscale/controller.token"}  # the broker
"""


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EXAMPLE
    p.add_argument("--config", required=True, help="controller YAML file (options below)")
    p.add_argument("--dry-run", action="store_true", help="recommend only: log decisions, apply nothing")
    p.add_argument("--identity", default=None, help="name of this replica (default: random)")
    add_server_arguments(p)  # who may read /status and /metrics, TLS


def run(args: argparse.Namespace) -> int:
    config = ControllerConfig.from_file(args.config)
    overrides = {}
    if args.dry_run:
        overrides["dry_run"] = True
    if args.identity:
        overrides["identity"] = args.identity
    if overrides:
        config = ControllerConfig(**{**config.__dict__, **overrides})
    security = ServerSecurity.from_args(args)
    controller = Controller(config, config_path=args.config, overrides=overrides, security=security).start()
    signals = StopSignals()
    # SIGHUP: re-read the config file; off the signal handler, which must not wait for a running period
    signal.signal(signal.SIGHUP, lambda *_: threading.Thread(target=_reload, args=(controller,), daemon=True).start())
    print(
        f"controller {controller.identity}: policy {config.policy}, period {config.period_s}s, "
        f"mode {config.mode}{' (dry run)' if config.dry_run else ''}; {security.describe()}; status on "
        f"http://{config.http_host}:{controller.http_port}/status; decision log {config.decision_log}",
        flush=True,
    )
    signals.wait()
    controller.stop()
    return 0


def _reload(controller: Controller) -> None:
    try:
        controller.reload()
    except ConfigError:
        pass  # reload() logged why; the running config stays
