"""keyedState in FunctionConfig: off unless asked, immutable, thread runtime only (pure, fast)."""

from __future__ import annotations

import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.config import FunctionConfig

BASE = {"tenant": "public", "namespace": "default", "name": "f", "className": "m.C", "inputs": ["in"]}


def test_keyed_state_is_off_by_default_and_only_shown_when_on():
    assert not FunctionConfig.from_dict(BASE).keyedState
    assert "keyedState" not in FunctionConfig.from_dict(BASE).to_dict()
    assert FunctionConfig.from_dict({**BASE, "keyedState": True}).to_dict()["keyedState"] is True


def test_keyed_state_cannot_be_altered_and_needs_the_thread_runtime():
    cfg = FunctionConfig.from_dict({**BASE, "keyedState": True})
    with pytest.raises(ConfigError, match="keyedState cannot be altered"):
        cfg.merged({"keyedState": False})
    with pytest.raises(ConfigError, match="keyedState needs the thread runtime"):
        FunctionConfig.from_dict({**BASE, "keyedState": True, "instanceRuntime": "process"})
