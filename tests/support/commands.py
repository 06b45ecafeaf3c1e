"""The project's command line as an operator runs it, for tests that start it as a process of its own."""

from __future__ import annotations

import sys
from pathlib import Path

CLI = [sys.executable, "-m", "pulsar_autoscale.cli.main"]


def worker_command(service_url: str, metrics_url: str, port: int | str, data_dir: str | Path, *options: str) -> list[str]:
    """`pulsar-autoscale worker` on a broker (its service and metrics URLs), a port and a data dir, then `options`."""
    return [
        *CLI,
        "worker",
        "--service-url",
        service_url,
        "--metrics-url",
        metrics_url,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *options,
    ]
