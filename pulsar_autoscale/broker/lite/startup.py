"""B15: pulsar-lite whose metrics port is taken runs on without /metrics.

Test: tests/integration/broker_conformance/test_startup.py.
"""

from __future__ import annotations


def metrics_server_lost(broker_log: str) -> bool:
    """B15: pulsar-lite whose metrics port is taken logs this and runs on without /metrics (Apache Pulsar's
    broker does not start without its web port): the embedded broker's start fails instead, naming the port,
    or picks another port when it picked that one."""
    return "Metrics server terminated" in broker_log
