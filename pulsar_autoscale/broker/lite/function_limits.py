"""B4, B5, B9 and B11: configs pulsar-lite cannot honour, refused when a function is created or updated.

Tests: tests/integration/broker_conformance/test_regex.py (B9: no regex subscription),
tests/integration/broker_conformance/test_reader.py::test_seek_on_a_live_consumer_rewinds (B5),
tests/integration/worker/test_lite_refusals.py (B4, B11: Key_Shared at parallelism > 1).
"""

from __future__ import annotations

from pulsar_autoscale.broker.profile import BrokerProfile
from pulsar_autoscale.errors import ConfigError


def check_function(cfg, broker: BrokerProfile) -> None:
    """Refused where the broker has these limits (pulsar-lite), accepted on Apache Pulsar.

    B9: it cannot list a namespace's topics (GetTopicsOfNamespace times out), so a regex subscription
    (topicsPattern) never opens. B5: seek is ignored, so skipToLatest would silently not skip. B4, B11: a
    Key_Shared subscription (retainKeyOrdering without keyedState) with several consumers strands messages
    (a closed consumer's unacked ones, and keys of pipelined producers) that no reopen brings back."""
    if not broker.function_limits:
        return
    if cfg.topicsPattern:
        raise ConfigError(
            "topicsPattern is not supported on pulsar-lite (it cannot list a namespace's topics, "
            "defect B9 in docs/dev/pulsar-lite-defects.md): list the topics in inputs, or run on Apache Pulsar"
        )
    if cfg.skipToLatest:
        raise ConfigError(
            "skipToLatest is not supported on pulsar-lite (it ignores seek, defect B5 in "
            "docs/dev/pulsar-lite-defects.md): run on Apache Pulsar"
        )
    if cfg.subscription_type == "KEY_SHARED" and not cfg.keyedState and cfg.parallelism > 1:
        raise ConfigError(
            f"retainKeyOrdering at parallelism {cfg.parallelism} is not supported on pulsar-lite without "
            "keyedState: it subscribes Key_Shared, which strands messages when a consumer closes "
            "(defect B4) and loses keys of pipelined producers (defect B11, docs/dev/pulsar-lite-defects.md)"
            ": set keyedState true (per-key order through the worker's router), keep parallelism 1, "
            "or run on Apache Pulsar"
        )
