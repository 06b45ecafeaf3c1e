"""The unit tier runs without a broker: a unit test that asks for one is in the wrong directory."""

import pytest


@pytest.fixture(scope="session")
def broker():
    pytest.fail("a unit test asked for the broker: move it to tests/integration")
