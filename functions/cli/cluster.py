"""`pulsar-autoscale functions-worker`: pulsar-admin's functions-worker commands against our workers."""

from __future__ import annotations

import argparse
import json

from pulsar_autoscale.functions.cli.admin import add_admin_arguments, admin_from_args

ACTIONS = {
    "get-cluster": "list the cluster's live workers",
    "get-cluster-leader": "the worker that leads the cluster (schedules instances)",
    "get-function-assignments": "which instances run on which worker",
    "rebalance": "even out instances over the workers (make-before-break: nothing stops before it runs elsewhere)",
}


def configure_parser(p: argparse.ArgumentParser) -> None:
    add_admin_arguments(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_text in ACTIONS.items():
        sub.add_parser(action, help=help_text, description=help_text)


def run(args: argparse.Namespace) -> int:
    admin = admin_from_args(args)
    if args.action == "rebalance":
        admin.rebalance()
        print("Rebalance requested")
        return 0
    result = {
        "get-cluster": admin.cluster,
        "get-cluster-leader": admin.cluster_leader,
        "get-function-assignments": admin.assignments,
    }[args.action]()
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0
