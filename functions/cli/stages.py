"""`pulsar-autoscale stages ...`: Spark stateful stages on our worker (docs/spark-stateful.md).

A stage's parallelism, status and stats go through `pulsar-autoscale functions update|status|stats`,
as the controller's do: through the Functions API a stage is one more function.
"""

from __future__ import annotations

import argparse
import json

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.cli.admin import add_admin_arguments, add_identity_args, admin_from_args, identity
from pulsar_autoscale.functions.model.config_parse import parse_text

ACTIONS = {
    "create": "create a stage from a StatefulStageConfig file",
    "get": "print a stage's config",
    "list": "list the stages of a namespace",
    "delete": "stop and delete a stage (its checkpoint too)",
}


def configure_parser(p: argparse.ArgumentParser) -> None:
    add_admin_arguments(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, help_text in ACTIONS.items():
        a = sub.add_parser(action, help=help_text, description=help_text)
        add_identity_args(a, "stage" if action != "list" else None)
        if action == "create":
            a.add_argument(
                "--stage-config-file",
                required=True,
                help="StatefulStageConfig as JSON or YAML (input, output, key, window, parallelism, ...)",
            )


def run(args: argparse.Namespace) -> int:
    admin = admin_from_args(args)
    tenant, namespace, name = identity(args)
    if args.action == "list":
        print(json.dumps(admin.list_stages(tenant, namespace), indent=2))
        return 0
    if args.action == "create":
        try:
            text = open(args.stage_config_file).read()
        except OSError as exc:
            raise ConfigError(f"cannot read {args.stage_config_file}: {exc.strerror}") from None
        data = parse_text(text, args.stage_config_file)
        data.update(
            tenant=data.get("tenant") or tenant, namespace=data.get("namespace") or namespace, name=name or data.get("name")
        )
    if not (name or (args.action == "create" and data.get("name"))):
        raise ConfigError("--name (or --fqfn, or name in --stage-config-file) is required")
    if args.action == "create":
        admin.create_stage(data)
        print("Created successfully")
    else:
        assert name is not None  # checked above: only create may take the name from the file
        if args.action == "delete":
            admin.delete_stage(tenant, namespace, name)
            print("Deleted successfully")
        else:
            print(json.dumps(admin.get_stage(tenant, namespace, name), indent=2, sort_keys=True))
    return 0
