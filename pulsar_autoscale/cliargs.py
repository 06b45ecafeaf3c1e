"""Options of a whole command (where to connect, with which credentials), accepted before or after its action.

pulsar-admin users type `functions list --admin-url URL --auth-plugin token ...`; argparse only takes a
command's options before the action. A command module adds such options to `global_options(parser)`;
`spread(parser)` (run by the CLI's main for every command) copies them onto every action's parser with
SUPPRESS defaults, so an action's copy sets the value only when given there, and otherwise the value given
before the action (or the command's default, which may come from the environment) stands.
"""

from __future__ import annotations

import argparse
import copy
import os

TITLE = "connection and auth"


def global_options(p: argparse.ArgumentParser):
    """The parser's argument group for options that every action accepts too."""
    for group in p._action_groups:
        if group.title == TITLE:
            return group
    return p.add_argument_group(TITLE)


def env_default(name: str, default: str | None = None) -> str | None:
    """A default an operator can set once for a shell (the table in docs/security.md lists them)."""
    return os.environ.get(name) or default


def spread(p: argparse.ArgumentParser) -> None:
    """Copy the command's global options onto each action's parser (and theirs, recursively); an action that
    defines the same flag itself keeps its own."""
    group = global_options(p)
    options = list(group._group_actions)
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if subs and options:
        group.description = "given before or after the action"
    for sub in subs:
        for child in {id(c): c for c in sub.choices.values()}.values():  # an alias names the same parser
            group = global_options(child)
            for option in options:
                if any(s in child._option_string_actions for s in option.option_strings):
                    continue
                twin = copy.copy(option)
                twin.default, twin.required = argparse.SUPPRESS, False
                group._add_action(twin)
            spread(child)
