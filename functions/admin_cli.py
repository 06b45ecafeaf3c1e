"""`pulsar-autoscale functions ...`: pulsar-admin's `functions` commands and flag names, over REST."""

from __future__ import annotations

import argparse
import json

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.errors import ConfigError

from .config import FunctionConfig, parse_text

DEFAULT_ADMIN_URL = "http://127.0.0.1:6750"
HELP = {"list": "list functions of a namespace",
        "burst": "our worker: drain part of the backlog with Spark (--messages), or show the drains (without)"}
ACTIONS = ("create", "update", "get", "list", "status", "stats", "delete", "start", "stop", "restart", "burst")


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--admin-url", default=DEFAULT_ADMIN_URL, help=f"worker admin REST URL (default {DEFAULT_ADMIN_URL})")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action in ACTIONS:
        a = sub.add_parser(action, help=HELP.get(action, f"{action} a function"))
        add_identity_args(a, "function" if action != "list" else None)
        if action in ("create", "update"):
            a.add_argument("--function-config-file", default=None, help="FunctionConfig as JSON or YAML")
            a.add_argument("--py", default=None, help="the function's .py file, uploaded to the worker")
            a.add_argument("--classname", default=None, help="module.Class (or module.function) to run")
            a.add_argument("--inputs", default=None, help="comma-separated input topics")
            a.add_argument("--output", default=None, help="output topic")
            a.add_argument("--parallelism", type=int, default=None, help="number of instances")
            a.add_argument("--processing-guarantees", default=None, choices=["ATLEAST_ONCE", "ATMOST_ONCE"])
            a.add_argument("--retain-ordering", action="store_true", default=None)
            a.add_argument("--retain-key-ordering", action="store_true", default=None)
            a.add_argument("--subs-name", default=None, help="subscription name (default tenant/namespace/name)")
            a.add_argument("--user-config", default=None, help="userConfig as a JSON object")
            a.add_argument("--log-topic", default=None)
        if action in ("start", "stop", "restart", "status", "stats"):
            a.add_argument("--instance-id", type=int, default=None, help="one instance only")
        if action == "burst":
            a.add_argument("--messages", type=int, default=None, help="messages to take from the backlog")
            a.add_argument("--partitions", type=int, default=4, help="Spark tasks (default 4)")
            a.add_argument("--threads-per-partition", type=int, default=1,
                           help="threads per task, for a function that mostly waits (default 1)")


def add_identity_args(parser: argparse.ArgumentParser, named: str | None) -> None:
    """--tenant, --namespace, --fqfn, and --name unless `named` is None (a namespace-wide action)."""
    parser.add_argument("--tenant", default=None, help="tenant (default public)")
    parser.add_argument("--namespace", default=None, help="namespace (default default)")
    parser.add_argument("--fqfn", default=None, help="tenant/namespace/name in one flag")
    if named:
        parser.add_argument("--name", default=None, help=f"{named} name")


def identity(args) -> tuple[str, str, str | None]:
    tenant, namespace, name = args.tenant, args.namespace, getattr(args, "name", None)
    if args.fqfn:
        parts = args.fqfn.split("/")
        if len(parts) != 3:
            raise ConfigError(f"--fqfn {args.fqfn!r} must be tenant/namespace/name")
        tenant, namespace, name = parts
    return tenant or "public", namespace or "default", name


def _config_from_flags(args) -> dict:
    data: dict = {}
    if args.function_config_file:
        data.update(FunctionConfig.from_file(args.function_config_file).to_dict()
                    if args.action == "create" else parse_text(open(args.function_config_file).read(),
                                                               args.function_config_file))
    flags = {"className": args.classname, "output": args.output, "parallelism": args.parallelism,
             "processingGuarantees": args.processing_guarantees, "retainOrdering": args.retain_ordering,
             "retainKeyOrdering": args.retain_key_ordering, "subName": args.subs_name, "logTopic": args.log_topic,
             "py": args.py}
    data.update({k: v for k, v in flags.items() if v is not None})
    if args.inputs:
        data["inputs"] = [t.strip() for t in args.inputs.split(",") if t.strip()]
    if args.user_config:
        data["userConfig"] = parse_text(args.user_config, "--user-config")
    tenant, namespace, name = identity(args)
    data.update(tenant=data.get("tenant") or tenant, namespace=data.get("namespace") or namespace,
                name=name or data.get("name"))
    if not data.get("name"):
        raise ConfigError("--name (or --fqfn, or name in --function-config-file) is required")
    return data


def run(args: argparse.Namespace) -> int:
    admin = FunctionsAdmin(args.admin_url)
    if args.action in ("create", "update"):
        data = _config_from_flags(args)
        py = data.get("py")
        getattr(admin, args.action)(data, py)
        print(f'{"Created" if args.action == "create" else "Updated"} successfully')
        return 0
    tenant, namespace, name = identity(args)
    if args.action == "list":
        result = admin.list(tenant, namespace)
    elif not name:
        raise ConfigError("--name (or --fqfn) is required")
    elif args.action in ("start", "stop", "restart"):
        admin.action(tenant, namespace, name, args.action, args.instance_id)
        print(f"{args.action.capitalize()}ed successfully" if args.action != "stop" else "Stopped successfully")
        return 0
    elif args.action == "delete":
        admin.delete(tenant, namespace, name)
        print("Deleted successfully")
        return 0
    elif args.action == "burst":
        result = (admin.burst(tenant, namespace, name, args.messages, args.partitions, args.threads_per_partition)
                  if args.messages is not None else admin.burst_report(tenant, namespace, name))
    else:
        result = getattr(admin, args.action)(tenant, namespace, name)
        if getattr(args, "instance_id", None) is not None:
            key = "instances"
            result = next((i for i in result.get(key, []) if i["instanceId"] == args.instance_id), None)
            if result is None:
                raise ConfigError(f"no instance {args.instance_id} in {tenant}/{namespace}/{name}")
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0
