"""Small socket helpers shared by the broker, worker and tests."""

from __future__ import annotations

import socket
import threading
import time

_handed_out: set[int] = set()
_handing = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now that this process has not been given before: whoever asked binds it a moment later (a
    worker process a second later), and until then the system may offer the same port again (two workers of
    one test cluster once got one port, and the second died)."""
    with _handing:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def cannot_bind(host: str, port: int) -> OSError | None:
    """Why a server could not listen on host:port now (as cheroot binds: SO_REUSEADDR), None if it could."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            s.listen(1)
    except OSError as exc:
        return exc
    return None


def wait_for_port(host: str, port: int, timeout_s: float, alive=lambda: True) -> bool:
    """Poll until something accepts TCP connections on host:port; False on timeout or if alive() turns False."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            return False
        try:
            with socket.create_connection((host, port), timeout=0.25):
                return True
        except OSError:
            time.sleep(0.05)
    return False
