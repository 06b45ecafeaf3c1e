"""The broker a benchmark runs on, chosen with `--broker lite|apache|both`: with `both`, one run measures the
same thing on the embedded pulsar-lite and on an Apache Pulsar standalone, one after the other on the same
machine, so the two columns of a table come from one command."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from typing import Callable, Iterator

KINDS = ("lite", "apache")


def add_broker_option(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--broker",
        choices=(*KINDS, "both"),
        default="lite",
        help="lite: the embedded pulsar-lite (default); apache: an Apache Pulsar standalone (java, and "
        "mvn for the first fetch: docs/apache-pulsar.md); both: one after the other",
    )


@contextlib.contextmanager
def open_broker(kind: str) -> Iterator:
    """A started broker with service_url and metrics_url, in a scratch directory removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{kind}-") as scratch:
        if kind == "apache":
            from pulsar_autoscale.broker.apache import ApacheStandalone

            with ApacheStandalone(data_dir=scratch) as broker:
                yield broker
        else:
            from pulsar_autoscale.broker.embedded import EmbeddedBroker

            with EmbeddedBroker(data_dir=scratch, log_level="warn") as broker:
                yield broker


def per_broker(choice: str, measure: Callable[[object], dict]) -> dict:
    """`measure(broker)` on each broker chosen: its result alone for one broker, {kind: result} for both."""
    kinds = KINDS if choice == "both" else (choice,)
    results = {}
    for kind in kinds:
        print(f"[{kind}] starting the broker", file=sys.stderr, flush=True)
        with open_broker(kind) as broker:
            results[kind] = {"broker": kind, **measure(broker)}
    return results[choice] if choice != "both" else {"brokers": results}
