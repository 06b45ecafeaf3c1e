"""Every `pulsar-autoscale` command line in the README's and docs' fenced blocks parses with the real CLI, as
typed there (options before or after the action, variables of the block expanded); usage lines with
`[--option]` are not commands and are left out; every `make` target the docs name exists."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from pulsar_autoscale.cli.main import build_parser
from tests.support.doc_blocks import ROOT, documented_commands, is_synopsis

COMMANDS = documented_commands()
OURS = [c for c in COMMANDS if c.program.endswith("pulsar-autoscale") and not is_synopsis(c)]


def test_the_docs_show_commands_of_every_kind():
    assert len(OURS) >= 70, len(OURS)
    assert {c.argv[0] for c in OURS} >= {
        "broker",
        "worker",
        "functions",
        "functions-worker",
        "produce",
        "consume",
        "controller",
        "autoscaler",
        "tokens",
        "simulate",
        "plan",
    }


@pytest.mark.parametrize("command", OURS, ids=lambda c: f"{c.where} {' '.join(c.argv[:2])}")
def test_documented_command_parses(command):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(command.argv)
        except SystemExit as exc:
            assert exc.code == 0, f"{command.where}: pulsar-autoscale {' '.join(command.argv)}\n{err.getvalue()}"


def test_documented_make_targets_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = {a for c in COMMANDS if c.program == "make" for a in c.argv if not a.startswith("-")}
    assert named and named <= targets, named - targets
