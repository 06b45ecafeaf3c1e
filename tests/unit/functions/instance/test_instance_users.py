"""--instance-uids as an operator types it: a range, or a clear error naming the flag."""

from __future__ import annotations

import os

import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.instance.instance_user import InstanceUser, InstanceUsers, parse_uid_range


def test_a_range_is_first_to_last_inclusive():
    assert parse_uid_range("2000000000-2000000009") == range(2_000_000_000, 2_000_000_010)
    assert len(parse_uid_range("70000-70000")) == 1


@pytest.mark.parametrize("text", ["70000", "70000-", "b-c", "9-1", "0-10", "1-4294967295", "-5-10"])
def test_a_bad_range_names_the_flag_and_the_form(text):
    with pytest.raises(ConfigError, match="--instance-uids .* must be FIRST-LAST"):
        parse_uid_range(text)


def test_one_user_and_a_uid_range_together_are_refused():
    with pytest.raises(ConfigError, match="--instance-user and --instance-uids: give one"):
        InstanceUsers.from_options("nobody", "70000-70009", tenants=False)


def test_without_a_range_every_function_runs_as_the_one_user():
    users = InstanceUsers(InstanceUser.resolve(None))
    assert users.of("a/b/c") == users.of("x/y/z") == users.shared
    if os.geteuid() != 0:  # a worker that is not root cannot take a range: said at start, not at an instance
        with pytest.raises(ConfigError, match="needs a worker running as root"):
            InstanceUsers.from_options(None, "70000-70009", tenants=False)
