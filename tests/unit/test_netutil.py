"""Ports for servers this process starts: never the same one twice, and a taken one named before start."""

from __future__ import annotations

import errno
import socket

from pulsar_autoscale.netutil import cannot_bind, free_port


def test_free_port_never_hands_out_a_port_twice():
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_cannot_bind_names_a_port_someone_listens_on():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        problem = cannot_bind("127.0.0.1", port)
        assert problem is not None and problem.errno == errno.EADDRINUSE
    assert cannot_bind("127.0.0.1", port) is None
