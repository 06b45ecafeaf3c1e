"""pulsar-lite's own start when a port it was told to use is taken (B15, docs/dev/pulsar-lite-defects.md).

Run without our launcher's check (broker/embedded.py), so the defect itself is what is tested."""

from __future__ import annotations

import socket
import subprocess

import pytest

from pulsar_autoscale.broker.embedded import find_binary, render_config
from pulsar_autoscale.broker.lite.startup import metrics_server_lost
from pulsar_autoscale.netutil import free_port, wait_for_port
from tests.support.scenario import wait_until


@pytest.mark.lite_only("starts pulsar-lite's own binary: nothing of the session broker is tested")
@pytest.mark.lite_defect(
    reason="pulsar-lite B15 (docs/dev/pulsar-lite-defects.md): with its metrics port taken it logs "
    "'Metrics server terminated' and runs on without /metrics"
)
def test_a_broker_whose_metrics_port_is_taken_does_not_run(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port, metrics_port = free_port(), taken.getsockname()[1]
        conf = tmp_path / "pulsar-lite.toml"
        conf.write_text(render_config(port, metrics_port, str(tmp_path), "warn"))
        log = tmp_path / "broker.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen([find_binary(), "--config", str(conf)], stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(
                lambda: proc.poll() is not None or metrics_server_lost(log.read_text()),
                20,
                "pulsar-lite to exit or to report its metrics server lost",
            )
            assert wait_for_port("127.0.0.1", port, 5, alive=lambda: proc.poll() is None)  # serving clients
            assert proc.poll() is not None, f"pulsar-lite runs without metrics: {log.read_text().strip()}"
        finally:
            proc.kill()
            proc.wait()
