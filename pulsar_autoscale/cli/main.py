"""The `pulsar-autoscale` command: one subcommand per module, each with configure_parser and run."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from pulsar_autoscale.cliargs import spread
from pulsar_autoscale.errors import PulsarAutoscaleError

# subcommand -> (module, help). Each module defines configure_parser(parser) and run(args) -> int.
COMMANDS = {
    "broker": ("pulsar_autoscale.broker.embedded", "run the embedded pulsar-lite broker"),
    "worker": ("pulsar_autoscale.functions.cli.worker", "run a function worker with the Functions admin REST API"),
    "functions": ("pulsar_autoscale.functions.cli.admin", "manage functions (pulsar-admin functions compatible flags)"),
    "functions-worker": ("pulsar_autoscale.functions.cli.cluster", "the worker cluster: members, leader, assignments, rebalance"),
    "stages": ("pulsar_autoscale.functions.cli.stages", "manage Spark stateful stages on our worker"),
    "controller": ("pulsar_autoscale.controller.cli", "run the autoscaling controller (MAPE loop)"),
    "autoscaler": (
        "pulsar_autoscale.controller.controls_cli",
        "per-function controls of a running controller: pause, resume, get, set, why, reload",
    ),
    "tokens": ("pulsar_autoscale.security.tokens_cli", "create keys and tokens (Pulsar's bin/pulsar tokens)"),
    "simulate": ("pulsar_autoscale.sim.cli", "simulate an app under a workload and a policy"),
    "plan": ("pulsar_autoscale.planning.cli", "capacity planning: measure MST on a testbed and plan a target rate"),
    "demo": ("pulsar_autoscale.cli.demo", "run the end-to-end demo on the embedded broker (or --broker apache)"),
    "produce": ("pulsar_autoscale.cli.client", "send messages to a topic (like pulsar-client produce)"),
    "consume": ("pulsar_autoscale.cli.client", "receive messages from a topic (like pulsar-client consume)"),
}


# Their level without -v: apscheduler's "Running job ..." every second and werkzeug's line per HTTP request are
# noise; so is apscheduler's warning for a period skipped because the one before still runs (a fast check that took
# over its second on a busy machine): an iteration that keeps running is reported by the controller's watchdog.
QUIET_LOGGERS = {"apscheduler": logging.ERROR, "werkzeug": logging.WARNING}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """All subcommands, or with `command` only that one's options: its module alone is imported (a
    worker restarted after a crash then boots without the simulator's, the demo's and the
    controller's imports, about a second of CPU on a busy 2-core machine)."""
    parser = argparse.ArgumentParser(prog="pulsar-autoscale", description="Elastic Apache Pulsar Functions.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if command in (None, name):
            importlib.import_module(module).configure_parser(p)
            spread(p)  # connection and auth options before or after the action
    return parser


def _deepest_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the (sub)command given, so an error shows that command's usage."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen is None or chosen not in subs[0].choices:
            return parser
        parser = subs[0].choices[chosen]


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # a reader that went away shows here, not at the interpreter's exit
        return code
    except BrokenPipeError:  # a command's output read by `| head -1`
        return _reader_gone()


def _main(argv: list[str] | None) -> int:
    given = sys.argv[1:] if argv is None else argv
    command = next((a for a in given if not a.startswith("-")), None)  # -v is the only option before it
    parser = build_parser(command if command in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _deepest_parser(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not args.command:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy, level in QUIET_LOGGERS.items():
        logging.getLogger(noisy).setLevel(logging.DEBUG if args.verbose else level)
    try:
        return importlib.import_module(args._module).run(args) or 0
    except PulsarAutoscaleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _reader_gone() -> int:
    """The reader of our output went away (`| head -1`): stop quietly. stdout now points at /dev/null, so
    the interpreter's flush at exit does not fail a second time; exit 1, as Python's own docs advise."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 1


if __name__ == "__main__":
    sys.exit(main())
