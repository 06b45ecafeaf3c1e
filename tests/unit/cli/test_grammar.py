"""One grammar for every command: each command's and action's --help works, and connection and auth options
parse before or after the action, for every action of every command (argparse only: no broker, no process)."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from pulsar_autoscale.cli.main import COMMANDS, build_parser
from pulsar_autoscale.cliargs import TITLE

# a value for each connection option a command may have; store_true options take none
VALUES = {
    "--admin-url": "http://10.0.0.1:6750",
    "--controller-url": "http://10.0.0.1:9091",
    "--service-url": "pulsar://10.0.0.1:6650",
    "--auth-plugin": "token",
    "--auth-params": "file:/tmp/t",
    "--tls-trust-cert-path": "/tmp/ca.pem",
}


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: child for a in p._actions if isinstance(a, argparse._SubParsersAction) for name, child in a.choices.items()}


def _connection(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for g in p._action_groups if g.title == TITLE for a in g._group_actions]


def _required(p: argparse.ArgumentParser, given: list[str] = ()) -> list[str]:
    """The fewest arguments the parser accepts: a value for each required positional and option not `given`."""
    out, done = [], set()
    for group in p._mutually_exclusive_groups:
        if group.required:
            out += [group._group_actions[0].option_strings[-1], "x"]
            done.update(id(a) for a in group._group_actions)
    for a in p._actions:
        if id(a) in done or isinstance(a, argparse._SubParsersAction):
            continue
        if not a.option_strings and a.nargs not in ("?", "*"):
            out.append("x")
        elif a.option_strings and a.required and not set(a.option_strings) & set(given):
            out += [a.option_strings[-1], "x"]
    return out


def _flags(actions: list[argparse.Action]) -> tuple[list[str], dict[str, object]]:
    argv, want = [], {}
    for a in actions:
        flag = a.option_strings[-1]
        if a.nargs == 0:
            argv.append(flag)
            want[a.dest] = a.const
        else:
            argv += [flag, VALUES.get(flag, "x")]
            want[a.dest] = VALUES.get(flag, "x")
    return argv, want


def _leaves():
    """(command, action or None) for every command, and every action of a command that has them."""
    parser = build_parser()
    for name, p in _subparsers(parser).items():
        actions = _subparsers(p)
        if not actions:
            yield name, None
        for action in actions:
            yield name, action


LEAVES = list(_leaves())


def test_every_command_is_walked():
    assert {c for c, _ in LEAVES} == set(COMMANDS)
    assert ("functions", "list") in LEAVES and ("functions-worker", "get-cluster") in LEAVES


@pytest.mark.parametrize("command,action", LEAVES, ids=lambda x: x or "-")
def test_help_exits_0(command, action):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        build_parser(command).parse_args([command, *([action] if action else []), "--help"])
    assert exit_.value.code == 0
    assert "usage:" in out.getvalue()


OFFLINE = {"tokens", "plan"}  # commands whose actions connect to nothing


def test_commands_with_actions_that_connect_have_connection_options():
    parser = build_parser()
    for command in {c for c, a in LEAVES if a} - OFFLINE:
        assert _connection(_subparsers(parser)[command]), command


@pytest.mark.parametrize("command,action", [leaf for leaf in LEAVES if leaf[1] and leaf[0] not in OFFLINE], ids=lambda x: x)
def test_connection_options_before_or_after_the_action(command, action):
    parser = build_parser(command)
    command_parser = _subparsers(parser)[command]
    options = _connection(command_parser)
    argv, want = _flags(options)
    rest = _required(_subparsers(command_parser)[action])
    before = parser.parse_args([command, *argv, action, *rest])
    after = parser.parse_args([command, action, *rest, *argv])
    for dest, value in want.items():
        assert getattr(before, dest) == value, (dest, "before")
        assert getattr(after, dest) == value, (dest, "after")


@pytest.mark.parametrize("command", [c for c, a in LEAVES if a is None])
def test_connection_options_of_a_command_without_actions(command):
    parser = build_parser(command)
    options = _connection(_subparsers(parser)[command])
    argv, want = _flags(options)
    args = parser.parse_args([command, *argv, *_required(_subparsers(parser)[command], argv)])
    for dest, value in want.items():
        assert getattr(args, dest) == value


def test_an_option_after_the_action_wins_and_one_before_is_not_reset():
    parser = build_parser("functions")
    both = parser.parse_args(["functions", "--admin-url", "http://a:1", "list", "--admin-url", "http://b:2"])
    assert both.admin_url == "http://b:2"
    before = parser.parse_args(["functions", "--auth-plugin", "token", "status", "--name", "f"])
    assert before.auth_plugin == "token" and before.admin_url == "http://127.0.0.1:6750"


def test_connection_defaults_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("PULSAR_AUTOSCALE_ADMIN_URL", "http://env:6750")
    monkeypatch.setenv("PULSAR_AUTOSCALE_CONTROLLER_URL", "http://env:9091")
    assert build_parser("functions-worker").parse_args(["functions-worker", "get-cluster"]).admin_url == "http://env:6750"
    assert build_parser("autoscaler").parse_args(["autoscaler", "get"]).controller_url == "http://env:9091"
