"""The secured worker and its keys, shared with tests/integration/test_security.py."""

from tests.integration.test_security import keys, worker  # noqa: F401 (fixtures)
