"""What a command logs by default: no scheduler or HTTP chatter per period or request, all of it with -v."""

from __future__ import annotations

import logging

import pytest

from pulsar_autoscale.cli.main import main


@pytest.fixture
def restore_levels():
    names = ("apscheduler.scheduler", "werkzeug")
    before = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in before.items():
        logging.getLogger(n).setLevel(level)


@pytest.mark.parametrize("verbose", [False, True])
def test_a_skipped_period_and_a_request_are_logged_only_with_v(tmp_path, restore_levels, verbose):
    argv = ["-v"] * verbose + ["tokens", "create-secret-key", "--output", str(tmp_path / "key")]
    assert main(argv) == 0
    # apscheduler's "Execution of job ... skipped: maximum number of running instances reached" is a WARNING
    assert logging.getLogger("apscheduler.scheduler").isEnabledFor(logging.WARNING) is verbose
    assert logging.getLogger("werkzeug").isEnabledFor(logging.INFO) is verbose
    assert logging.getLogger("werkzeug").isEnabledFor(logging.WARNING)
