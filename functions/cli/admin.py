"""`pulsar-autoscale functions ...`: pulsar-admin's `functions` commands and flag names, over REST.

`localrun` needs no worker: it runs the function in this process against the broker, like
Pulsar's `functions localrun`. Connection and auth flags (`--admin-url`, `--auth-plugin`, ...) work
before or after the action (pulsar_autoscale.cliargs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.broker.profile import KINDS
from pulsar_autoscale.cliargs import env_default, global_options
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.config_parse import parse_text, read_config_file
from pulsar_autoscale.functions.model.config_parts import GUARANTEES, SUBSCRIPTION_POSITIONS
from pulsar_autoscale.pulsar_client import add_auth_arguments, add_service_url, settings_from_args

DEFAULT_ADMIN_URL = "http://127.0.0.1:6750"
ADMIN_URL_ENV = "PULSAR_AUTOSCALE_ADMIN_URL"
HELP = {
    "list": "list functions of a namespace",
    "burst": "our worker: drain part of the backlog with Spark (--messages), or show the drains (without)",
    "localrun": "run a function in the foreground against a broker, without a worker",
    "trigger": "send a value to a function's input and print the output it causes",
    "querystate": "print a key of a function's state (counters too)",
    "putstate": "set a key of a function's state",
    "upload": "keep a file on the worker under a path",
    "download": "fetch a file uploaded under a path, or a function's code",
}
ACTIONS = (
    "create",
    "update",
    "localrun",
    "get",
    "list",
    "status",
    "stats",
    "delete",
    "start",
    "stop",
    "restart",
    "trigger",
    "querystate",
    "putstate",
    "upload",
    "download",
    "burst",
)
NAMED = {
    "create",
    "update",
    "localrun",
    "get",
    "status",
    "stats",
    "delete",
    "start",
    "stop",
    "restart",
    "trigger",
    "querystate",
    "putstate",
    "burst",
    "download",
}


def add_admin_url(p: argparse.ArgumentParser) -> None:
    """--admin-url: where a worker's REST API answers (any worker of a cluster, or several)."""
    global_options(p).add_argument(
        "--admin-url",
        default=env_default(ADMIN_URL_ENV, DEFAULT_ADMIN_URL),
        help=f"a worker's admin REST URL, or several comma-separated (env {ADMIN_URL_ENV}, default {DEFAULT_ADMIN_URL})",
    )


def _bool(text: str) -> bool:
    """pulsar-admin's boolean flags take a value: --auto-ack false."""
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_config_flags(a: argparse.ArgumentParser) -> None:
    """pulsar-admin's `functions create/update/localrun` flags (docs/function-config.md maps them to fields)."""
    a.add_argument("--function-config-file", default=None, help="FunctionConfig as JSON or YAML")
    a.add_argument("--py", default=None, help="the function's .py file, uploaded to the worker")
    a.add_argument("--classname", default=None, help="module.Class (or module.function) to run")
    a.add_argument("-i", "--inputs", default=None, help="comma-separated input topics")
    a.add_argument("--topics-pattern", default=None, help="input topics as a regular expression")
    a.add_argument("-o", "--output", default=None, help="output topic")
    a.add_argument("--parallelism", type=int, default=None, help="number of instances")
    a.add_argument("--processing-guarantees", default=None, choices=GUARANTEES)
    a.add_argument("--retain-ordering", action="store_true", default=None)
    a.add_argument("--retain-key-ordering", action="store_true", default=None)
    a.add_argument("--subs-name", default=None, help="subscription name (default tenant/namespace/name)")
    a.add_argument(
        "--subs-position", default=None, choices=SUBSCRIPTION_POSITIONS, help="where a new subscription starts (default Latest)"
    )
    a.add_argument("--skip-to-latest", action="store_true", default=None, help="skip the backlog when the function starts")
    a.add_argument(
        "--cleanup-subscription",
        type=_bool,
        default=None,
        metavar="BOOL",
        help="remove the subscription when the function is deleted (default true)",
    )
    a.add_argument("--user-config", default=None, help="userConfig as a JSON object")
    a.add_argument("--secrets", default=None, help="secrets as a JSON object")
    a.add_argument("--log-topic", default=None)
    a.add_argument(
        "--auto-ack", type=_bool, default=None, metavar="BOOL", help="false: the function acks with context.ack (default true)"
    )
    a.add_argument(
        "--max-message-retries",
        type=int,
        default=None,
        help="redeliveries of a failing message before it goes to the dead-letter topic",
    )
    a.add_argument(
        "--dead-letter-topic", default=None, help="default {input}-{subscription}-DLQ when --max-message-retries is set"
    )
    a.add_argument("--timeout-ms", type=int, default=None, help="ack timeout: redeliver what is not acked in time")
    a.add_argument("--custom-serde-inputs", default=None, help='JSON map {"topic": "module.SerDe"}')
    a.add_argument("--output-serde-classname", default=None, help="module.SerDe for the output")
    a.add_argument(
        "--forward-source-message-property",
        type=_bool,
        default=None,
        metavar="BOOL",
        help="copy input properties to the output (default true)",
    )
    a.add_argument("--producer-config", default=None, help="producerConfig as a JSON object")
    a.add_argument("--batch-builder", default=None, choices=["DEFAULT", "KEY_BASED"])
    a.add_argument("--custom-runtime-options", default=None, help="free-form string (JSON) for the runtime")
    a.add_argument("--cpu", type=float, default=None, help="cores per instance (resources.cpu)")
    a.add_argument("--ram", type=int, default=None, help="bytes of RAM per instance (resources.ram)")
    a.add_argument("--disk", type=int, default=None, help="bytes of disk per instance (resources.disk)")
    for flag, typ in (
        ("--window-length-count", int),
        ("--window-length-duration-ms", int),
        ("--sliding-interval-count", int),
        ("--sliding-interval-duration-ms", int),
    ):
        a.add_argument(flag, type=typ, default=None, help="windowConfig (refused by this worker: see docs)")


def configure_parser(p: argparse.ArgumentParser) -> None:
    add_admin_arguments(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action in ACTIONS:
        a = sub.add_parser(
            action, help=HELP.get(action, f"{action} a function"), description=HELP.get(action, f"{action} a function")
        )
        if action != "upload":
            add_identity_args(a, "function" if action in NAMED else None)
        if action in ("create", "update", "localrun"):
            add_config_flags(a)
        if action == "localrun":
            add_service_url(a)
            a.add_argument(
                "--broker-service-url",
                default=None,
                help="pulsar-admin's name for --service-url (default pulsar://127.0.0.1:6650)",
            )
            a.add_argument("--state-dir", default=None, help="the function's state (default under the user data directory)")
            a.add_argument(
                "--broker-kind",
                default="auto",
                choices=KINDS,
                help="the broker's defects to fence, as the worker's flag: auto reads --metrics-url (none: apache)",
            )
            a.add_argument("--metrics-url", default=None, help="the broker's /metrics, which tells pulsar-lite apart")
        if action in ("start", "stop", "restart", "status", "stats"):
            a.add_argument("--instance-id", type=int, default=None, help="one instance only")
        if action == "trigger":
            a.add_argument("--trigger-value", default=None, help="the value to send")
            a.add_argument("--trigger-file", default=None, help="send this file's bytes instead")
            a.add_argument("--topic", default=None, help="which input (needed when there are several)")
        if action in ("querystate", "putstate"):
            a.add_argument("-k", "--key", required=action == "querystate", default=None, help="state key")
        if action == "putstate":
            a.add_argument(
                "-s",
                "--state",
                required=True,
                help='FunctionState JSON: {"key": "k", "stringValue": "v"} (or numberValue, byteValue)',
            )
        if action in ("upload", "download"):
            a.add_argument("--path", default=None, help="where the file is kept on the worker")
        if action == "upload":
            a.add_argument("--source-file", required=True, help="the file to upload")
        if action == "download":
            a.add_argument("--destination-file", required=True, help="where to write it")
        if action == "burst":
            a.add_argument("--messages", type=int, default=None, help="messages to take from the backlog")
            a.add_argument("--partitions", type=int, default=4, help="Spark tasks (default 4)")
            a.add_argument(
                "--threads-per-partition",
                type=int,
                default=1,
                help="threads per task, for a function that mostly waits (default 1)",
            )


def add_admin_arguments(p: argparse.ArgumentParser) -> None:
    """--admin-url and pulsar-admin's credential flags (--auth-plugin token --auth-params file:/path, ...)."""
    add_admin_url(p)
    add_auth_arguments(p)


def admin_from_args(args) -> FunctionsAdmin:
    return FunctionsAdmin(args.admin_url, session=settings_from_args(args, args.admin_url).http_session())


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


def _json_flag(text: str | None, flag: str) -> dict | None:
    return None if text is None else parse_text(text, flag)


def config_from_flags(args) -> dict:
    """The FunctionConfig the flags describe, over --function-config-file (flags win, as in pulsar-admin)."""
    data: dict = read_config_file(args.function_config_file) if args.function_config_file else {}
    flags = {
        "className": args.classname,
        "output": args.output,
        "parallelism": args.parallelism,
        "processingGuarantees": args.processing_guarantees,
        "retainOrdering": args.retain_ordering,
        "retainKeyOrdering": args.retain_key_ordering,
        "subName": args.subs_name,
        "logTopic": args.log_topic,
        "py": args.py,
        "topicsPattern": args.topics_pattern,
        "subscriptionPosition": args.subs_position,
        "skipToLatest": args.skip_to_latest,
        "cleanupSubscription": args.cleanup_subscription,
        "autoAck": args.auto_ack,
        "maxMessageRetries": args.max_message_retries,
        "deadLetterTopic": args.dead_letter_topic,
        "timeoutMs": args.timeout_ms,
        "outputSerdeClassName": args.output_serde_classname,
        "forwardSourceMessageProperty": args.forward_source_message_property,
        "batchBuilder": args.batch_builder,
        "customRuntimeOptions": args.custom_runtime_options,
        "userConfig": _json_flag(args.user_config, "--user-config"),
        "secrets": _json_flag(args.secrets, "--secrets"),
        "customSerdeInputs": _json_flag(args.custom_serde_inputs, "--custom-serde-inputs"),
        "producerConfig": _json_flag(args.producer_config, "--producer-config"),
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    if args.inputs:
        data["inputs"] = [t.strip() for t in args.inputs.split(",") if t.strip()]
    resources = {k: v for k, v in (("cpu", args.cpu), ("ram", args.ram), ("disk", args.disk)) if v is not None}
    if resources:
        data["resources"] = {**(data.get("resources") or {}), **resources}
    window = {
        k: v
        for k, v in (
            ("windowLengthCount", args.window_length_count),
            ("windowLengthDurationMs", args.window_length_duration_ms),
            ("slidingIntervalCount", args.sliding_interval_count),
            ("slidingIntervalDurationMs", args.sliding_interval_duration_ms),
        )
        if v is not None
    }
    if window:
        data["windowConfig"] = window  # the worker answers why it refuses it
    tenant, namespace, name = identity(args)
    data.update(tenant=data.get("tenant") or tenant, namespace=data.get("namespace") or namespace, name=name or data.get("name"))
    if not data.get("name"):
        raise ConfigError("--name (or --fqfn, or name in --function-config-file) is required")
    return data


def run(args: argparse.Namespace) -> int:
    if args.action == "localrun":
        from pulsar_autoscale.functions.cli.localrun import localrun

        return localrun(args, config_from_flags(args))
    admin = admin_from_args(args)
    if args.action in ("create", "update"):
        data = config_from_flags(args)
        getattr(admin, args.action)(data, data.get("py"))
        print(f"{'Created' if args.action == 'create' else 'Updated'} successfully")
        return 0
    if args.action == "upload":
        admin.upload(args.source_file, args.path or Path(args.source_file).name)
        print(f"Uploaded successfully to {args.path or Path(args.source_file).name}")
        return 0
    tenant, namespace, name = identity(args)
    if args.action == "download":
        if not args.path and not name:
            raise ConfigError("download: give --path (an uploaded file) or --name (a function's code)")
        if args.path:
            code = admin.download(args.path)
        else:
            assert name is not None  # checked above: no --path, so --name was given
            code = admin.download(function=(tenant, namespace, name))
        Path(args.destination_file).write_bytes(code)
        print(f"Downloaded successfully to {args.destination_file} ({len(code)} bytes)")
        return 0
    result: Any  # whatever the action answers, printed as JSON
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
    elif args.action == "trigger":
        if (args.trigger_value is None) == (args.trigger_file is None):
            raise ConfigError("trigger: give one of --trigger-value or --trigger-file")
        out = admin.trigger(tenant, namespace, name, args.trigger_value, args.trigger_file, args.topic)
        if out is not None:
            sys.stdout.buffer.write(out + b"\n")
        return 0
    elif args.action == "querystate":
        result = admin.get_state(tenant, namespace, name, args.key)
    elif args.action == "putstate":
        state = parse_text(args.state, "--state")
        if args.key:
            state.setdefault("key", args.key)
        if not state.get("key"):
            raise ConfigError('putstate: the state needs a key (--key or "key" in --state)')
        admin.put_state(tenant, namespace, name, state)
        print(f"Put state {state['key']!r} successfully")
        return 0
    elif args.action == "burst":
        result = (
            admin.burst(tenant, namespace, name, args.messages, args.partitions, args.threads_per_partition)
            if args.messages is not None
            else admin.burst_report(tenant, namespace, name)
        )
    else:
        result = getattr(admin, args.action)(tenant, namespace, name)
        if getattr(args, "instance_id", None) is not None:
            result = next((i for i in result.get("instances", []) if i["instanceId"] == args.instance_id), None)
            if result is None:
                raise ConfigError(f"no instance {args.instance_id} in {tenant}/{namespace}/{name}")
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0
