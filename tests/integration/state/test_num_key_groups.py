"""numKeyGroups: default 128, range-checked, and fixed for the function's life (a 400 naming it on update)."""

import pytest

from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.config import FunctionConfig
from tests.support.scenario import EXAMPLES

BASE = {"tenant": "public", "namespace": "default", "name": "kg", "className": "exclaim.Exclaim", "inputs": ["in"]}


def test_default_range_and_round_trip():
    assert FunctionConfig.from_dict(BASE).numKeyGroups == 128
    cfg = FunctionConfig.from_dict({**BASE, "numKeyGroups": 65536})
    assert FunctionConfig.from_dict(cfg.to_dict()) == cfg
    for bad, msg in (
        (0, "an integer from 1 to 65536, got 0"),
        (65537, "an integer from 1 to 65536, got 65537"),
        ("8", "an integer, got string"),
    ):
        with pytest.raises(ConfigError, match=f"numKeyGroups must be {msg}"):
            FunctionConfig.from_dict({**BASE, "numKeyGroups": bad})


def test_update_refuses_a_change_with_400_naming_it(admin):
    admin.create({**BASE, "name": "kg-upd", "inputs": ["kg-upd-in"], "numKeyGroups": 64}, str(EXAMPLES / "exclaim.py"))
    with pytest.raises(AdminError, match="numKeyGroups cannot be altered") as err:
        admin.update({"tenant": "public", "namespace": "default", "name": "kg-upd", "numKeyGroups": 128})
    assert err.value.status == 400
    admin.set_parallelism("public", "default", "kg-upd", 2)  # other updates keep it
    assert admin.get("public", "default", "kg-upd")["numKeyGroups"] == 64
