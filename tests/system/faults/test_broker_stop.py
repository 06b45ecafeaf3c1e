"""The broker hung with SIGSTOP under load (pulsar-lite itself, connections staying open through the relay; or
Apache Pulsar's JVM) and continued: nothing is lost, outputs flow again, and `status` during the pause is
recorded (docs/reliability.md)."""

from __future__ import annotations

import pytest

from tests.support.fault_scenarios import broker_stop


@pytest.mark.slow
def test_a_broker_stopped_under_load_loses_nothing(broker_kind):
    """3,000 messages at 400/s, SIGSTOP at 1,000 outputs for 10 s (30 s by hand behaves the same:
    docs/reliability.md), SIGCONT: 0 lost, outputs again within 15 s (CI's 2 busy cores)."""
    outcome = broker_stop(n=3000, stop_at=1000, pause_s=10.0, kind=broker_kind)
    print(f"\n{outcome}")
    assert outcome.lost == 0, outcome
    assert outcome.recovery_s is not None and outcome.recovery_s < 15, outcome
    assert outcome.status_seen and outcome.status_seen[-1].startswith("at the end numRunning=3"), outcome
