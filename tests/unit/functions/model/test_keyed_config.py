"""keyedState in FunctionConfig: off unless asked, immutable, thread runtime only (pure, fast)."""

from __future__ import annotations

import json

import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.model.migration_settings import KeyedMigration, keyed_migration

BASE = {"tenant": "public", "namespace": "default", "name": "f", "className": "m.C", "inputs": ["in"]}


def test_keyed_state_is_off_by_default_and_only_shown_when_on():
    assert not FunctionConfig.from_dict(BASE).keyedState
    assert "keyedState" not in FunctionConfig.from_dict(BASE).to_dict()
    assert FunctionConfig.from_dict({**BASE, "keyedState": True}).to_dict()["keyedState"] is True


def test_keyed_state_cannot_be_altered_and_runs_on_either_runtime():
    cfg = FunctionConfig.from_dict({**BASE, "keyedState": True})
    with pytest.raises(ConfigError, match="keyedState cannot be altered"):
        cfg.merged({"keyedState": False})
    assert FunctionConfig.from_dict({**BASE, "keyedState": True, "instanceRuntime": "process"}).instanceRuntime == "process"


def _migration(options) -> KeyedMigration:
    return keyed_migration(
        FunctionConfig.from_dict({**BASE, "keyedState": True, "customRuntimeOptions": json.dumps({"keyedMigration": options})})
    )


def test_keyed_migration_settings_come_from_custom_runtime_options():
    assert keyed_migration(FunctionConfig.from_dict({**BASE, "keyedState": True})) == KeyedMigration(4, 0.5, False)
    assert _migration({"mode": "stop-the-world", "subscaleSize": 8, "duty": 1}) == KeyedMigration(8, 1.0, True)
    assert _migration({"preCopyMBps": 2.5}).pre_copy_mb_per_s == 2.5
    assert _migration({"preCopyMBps": None}).pre_copy_mb_per_s is None
    # other keys of Pulsar's free-form field are left alone
    cfg = FunctionConfig.from_dict({**BASE, "keyedState": True, "customRuntimeOptions": '{"autoscale": {"max": 4}}'})
    assert keyed_migration(cfg) == KeyedMigration()


@pytest.mark.parametrize(
    "options, problem",
    [
        ({"mode": "pause"}, "mode must be 'live' or 'stop-the-world'"),
        ({"duty": 0}, r"duty must be in \(0, 1\]"),
        ({"subscaleSize": 0}, "subscaleSize must be an integer from 1"),
        ({"subscaleSize": None}, "subscaleSize must be an integer from 1 .* got null"),
        ({"duty": None}, r"duty must be in \(0, 1\] .* got null"),
        ({"preCopyMBps": 0}, "preCopyMBps must be above 0"),
        ({"preCopyMBps": "fast"}, "preCopyMBps"),
        ({"subscale": 4}, "keyedMigration.subscale is unknown"),
        ([4], "keyedMigration must be an object"),
    ],
)
def test_bad_keyed_migration_settings_are_refused_naming_the_field(options, problem):
    with pytest.raises(ConfigError, match=problem):
        _migration(options)
    with pytest.raises(ConfigError, match="keyedState is false"):
        FunctionConfig.from_dict({**BASE, "customRuntimeOptions": json.dumps({"keyedMigration": {}})})
