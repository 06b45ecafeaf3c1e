"""`pulsar-autoscale autoscaler pause|resume|get|set|why|reload`: per-function controls of a running
controller, through its HTTP API (any replica: controls are stored on a Pulsar topic they all read)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import requests

from pulsar_autoscale.cliargs import env_default, global_options
from pulsar_autoscale.configparse import parse_params
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.headers import PARTIAL_HEADER
from pulsar_autoscale.pulsar_client import add_auth_arguments, settings_from_args

DEFAULT_URL = "http://127.0.0.1:9091"
URL_ENV = "PULSAR_AUTOSCALE_CONTROLLER_URL"


def configure_parser(p: argparse.ArgumentParser) -> None:
    g = global_options(p)
    g.add_argument(
        "--controller-url",
        default=env_default(URL_ENV, DEFAULT_URL),
        help=f"a controller replica's HTTP address (env {URL_ENV}, default {DEFAULT_URL})",
    )
    g.add_argument("--json", action="store_true", help="print JSON")
    add_auth_arguments(p)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help_text: str, function: bool = True) -> argparse.ArgumentParser:
        a = actions.add_parser(name, help=help_text, description=help_text)
        if function:
            a.add_argument("function", metavar="FUNCTION", help="tenant/namespace/name, or name in public/default")
        return a

    action("pause", "leave the function as it is (an operator's parallelism stays) until resume")
    action("resume", "let the autoscaler decide for the function again")
    get = action("get", "effective controls of one function (or of all), and where each came from", function=False)
    get.add_argument("function", metavar="FUNCTION", nargs="?", help="default: every function")
    s = action("set", "per-function bounds, policy, dry run, idle time; stored, so they survive a failover")
    s.add_argument("--min", type=int, help="lowest parallelism; 0 allows scale to zero (our worker only)")
    s.add_argument("--max", type=int, help="highest parallelism")
    s.add_argument("--policy", help="this function's own policy: entry-point name or path to a .py file")
    s.add_argument("--param", action="append", default=[], metavar="K=V", help="its parameter (YAML), repeatable")
    s.add_argument("--dry-run", dest="dry_run", action="store_true", default=None, help="recommend only for this function")
    s.add_argument("--no-dry-run", dest="dry_run", action="store_false", help="apply again")
    s.add_argument("--idle-s", type=float, help="with min 0: scale to zero after this long with an empty backlog")
    s.add_argument(
        "--unset",
        action="append",
        default=[],
        metavar="FIELD",
        help="clear one operator control (min, max, policy, policy_params, dry_run, idle_s, paused)",
    )
    s.add_argument("--clear", action="store_true", help="clear every operator control of the function")
    why = action("why", "the function's recent evaluations: inputs, proposal, decision and reasons")
    why.add_argument("--limit", type=int, default=10, help="how many (default 10)")
    action("reload", "re-read the controller's config file (like SIGHUP); a bad file keeps the old one", function=False)


def run(args: argparse.Namespace) -> int:
    base = args.controller_url.rstrip("/")
    session = settings_from_args(args, base).http_session()  # --auth-plugin/--auth-params, TLS trust
    if args.action == "reload":
        return _print(args, _call(session, "POST", f"{base}/autoscaler/reload"))
    if args.action == "get" and not args.function:
        return _print(args, _call(session, "GET", f"{base}/autoscaler/functions"))
    url = f"{base}/autoscaler/functions/{_fqfn(args.function)}"
    if args.action in ("pause", "resume"):
        return _print(args, _call(session, "POST", f"{url}/{args.action}"))
    if args.action == "get":
        return _print(args, _call(session, "GET", url))
    if args.action == "why":
        records, resp = _answer(session, "GET", f"{url}/why", params={"limit": args.limit})
        if PARTIAL_HEADER in resp.headers:
            print(f"warning: {resp.headers[PARTIAL_HEADER]}", file=sys.stderr)
        if args.json:
            return _print(args, records)
        for r in records:
            print(format_record(r))
        if not records:
            print(f"no evaluations of {_fqfn(args.function)} in the decision log yet")
        return 0
    if args.clear:
        return _print(args, _call(session, "DELETE", url))
    update: dict = {k: getattr(args, k) for k in ("min", "max", "policy", "dry_run", "idle_s") if getattr(args, k) is not None}
    if args.param:
        update["policy_params"] = parse_params(args.param)
    update.update(dict.fromkeys(args.unset))
    if not update:
        raise ConfigError(
            "set needs at least one of --min --max --policy --param --dry-run --no-dry-run --idle-s --unset --clear"
        )
    return _print(args, _call(session, "PUT", url, json=update))


def _fqfn(function: str) -> str:
    parts = function.split("/")
    if len(parts) == 1:
        return f"public/default/{function}"
    if len(parts) != 3 or not all(parts):
        raise ConfigError(f"FUNCTION {function!r} must be tenant/namespace/name or a name in public/default")
    return function


def _call(session: requests.Session, method: str, url: str, **kwargs):
    return _answer(session, method, url, **kwargs)[0]


def _answer(session: requests.Session, method: str, url: str, **kwargs) -> tuple[Any, requests.Response]:
    """The controller's JSON answer and its response; an error status is a PulsarAutoscaleError with its reason."""
    try:
        resp = session.request(method, url, timeout=30, **kwargs)
    except requests.RequestException as exc:
        raise PulsarAutoscaleError(
            f"cannot reach the controller at {url} ({type(exc).__name__}): is it running? (--controller-url or {URL_ENV})"
        ) from None
    try:
        body = resp.json()
    except ValueError:
        body = {"reason": resp.text.strip()}
    if resp.status_code >= 400:
        reason = body.get("reason", body) if isinstance(body, dict) else body
        raise PulsarAutoscaleError(f"{method} {url} -> {resp.status_code}: {reason}")
    return body, resp


def _print(args: argparse.Namespace, body) -> int:
    if args.json or not isinstance(body, dict):
        print(json.dumps(body, indent=2, sort_keys=True))
        return 0
    if body and all(isinstance(v, dict) and "function" in v for v in body.values()):  # get, every function
        for controls in body.values():
            print(_summary(controls))
        return 0
    if "function" in body:
        print(_summary(body))
        for note in body.get("notes", []):
            print(f"  note: {note}")
        for layer, values in body.get("layers", {}).items():
            print(f"  {layer}: {json.dumps(values, sort_keys=True) if values else '-'}")
        if body.get("last"):
            print(f"  last: {format_record(body['last'])}")
        return 0
    print(json.dumps(body, indent=2, sort_keys=True))
    return 0


def _summary(c: dict) -> str:
    state = "paused" if c["paused"] else ("asleep" if c.get("asleep") else "active")
    params = f" {json.dumps(c['policy_params'], sort_keys=True)}" if c["policy_params"] else ""
    src = c.get("sources", {})
    return (
        f"{c['function']}: {state}, bounds [{c['min']}, {c['max']}] ({src.get('min')}/{src.get('max')}), "
        f"policy {c['policy']}{params} ({src.get('policy')}), dry run {'on' if c['dry_run'] else 'off'}, "
        f"idle {c['idle_s']:g}s"
    )


def format_record(r: dict) -> str:
    """One evaluation on one line: when, what changed, whether it was applied, the inputs, why."""
    when = time.strftime("%H:%M:%S", time.localtime(r.get("time", 0)))
    if r.get("error") and "new" not in r:
        return f"{when}  error: {r['error']}"
    move = f"{r.get('old')} -> {r.get('new')}" if r.get("old") != r.get("new") else f"keep {r.get('new')}"
    proposed = f" (proposed {r['proposed']})" if r.get("proposed") not in (None, r.get("new")) else ""
    outcome = (
        "failed: " + str(r["error"])
        if r.get("error")
        else "dry run"
        if r.get("dry_run") and r.get("old") != r.get("new")
        else "applied"
        if r.get("applied")
        else ""
    )
    fs = r.get("inputs") or {}
    figures = " ".join(
        f"{label}={_num(fs.get(key))}"
        for label, key in (("lambda", "arrival_rate"), ("Q", "backlog"), ("mu", "service_rate"), ("util", "utilization"))
        if fs.get(key) is not None
    )
    kind = f"[{r['kind']}] " if r.get("kind") else ""
    parts = [
        when,
        f"epoch {r.get('epoch')}",
        f"{kind}{move}{proposed}",
        outcome,
        figures,
        f"{r.get('policy')}: {r.get('reason')}",
    ]
    return "  ".join(p for p in parts if p)


def _num(value) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
