"""The HTTP server of the worker and the controller: cheroot (CherryPy's WSGI server) behind a request gate.

cheroot gives the HTTP/1.1 parsing, keep-alive, the WSGI gateway and a bounded thread pool. Left alone it hands a
connection to a pool thread as soon as it is accepted (and does the TLS handshake in its accept loop), so clients
that send nothing, or send slowly, would hold every thread. The gate, which replaces cheroot's connection manager,
runs one selector thread that

- accepts, refusing a client address over ``per_client_connections`` (or anyone past ``max_connections``): cheroot
  has no such option, so the cap is counted here, from accept to close;
- does TLS handshakes non-blocking, driven by readiness, within ``handshake_timeout_s``;
- reads each request's head (and a body up to ``buffered_body_bytes``) without a thread, closing a connection idle
  past ``idle_timeout_s``, a head not complete ``head_timeout_s`` after its first byte, or a buffered body not
  complete ``body_timeout_s`` after its head;
- only then gives the connection to the pool, which runs the WSGI app on the bytes already read.

A larger or chunked body is handed over with its head, so the app can refuse it (401, 413) before it is read; its
reads in the pool thread must then finish within ``stream_timeout_s``. A response that leaves more than
``DRAIN_LIMIT`` bytes of it unread closes the connection; the gate reads and discards the rest for up to
``LINGER_S`` first, so that a client still sending sees the response rather than a reset (werkzeug did so too).
Keep-alive connections come back to the gate between requests. A full pool queue gets 503.
"""

from __future__ import annotations

import logging
import math
import ssl
import threading
import time

from cheroot import wsgi
from cheroot.ssl.builtin import BuiltinSSLAdapter
from cheroot.workers import threadpool

from .http_gate import MAX_HEAD_BYTES, GatedConnection, RequestGate, ServerLimits

log = logging.getLogger("pulsar_autoscale.http")


__all__ = ["HTTPServer", "ServerLimits"]


class _DaemonThreadPool(threadpool.ThreadPool):
    def _spawn_worker(self):
        """Daemon threads, as werkzeug's were: a server never stopped must not keep the process alive."""
        worker = threadpool.WorkerThread(self.server)
        worker.name = f"http-{worker.name}"
        worker.daemon = True
        worker.start()
        return worker


class HTTPServer(wsgi.Server):
    """cheroot's WSGI server with the gate; bound on construction. ``serve_forever``/``shutdown`` as werkzeug's."""

    ConnectionClass = GatedConnection

    def __init__(self, host: str, port: int, app, limits: ServerLimits | None = None, tls: tuple[str, str] | None = None):
        self.limits = limits or ServerLimits()
        super().__init__(
            (host, port),
            app,
            numthreads=self.limits.threads,
            max=self.limits.threads,
            request_queue_size=128,
            timeout=math.ceil(self.limits.idle_timeout_s),
            shutdown_timeout=math.ceil(self.limits.shutdown_timeout_s),
            accepted_queue_size=self.limits.queue,
            accepted_queue_timeout=0,
        )
        self.requests = _DaemonThreadPool(
            self,
            min=self.limits.threads,
            max=self.limits.threads,
            accepted_queue_size=self.limits.queue,
            accepted_queue_timeout=0,
        )
        self.max_request_header_size = MAX_HEAD_BYTES
        if tls is not None:
            self.ssl_adapter = BuiltinSSLAdapter(*tls)
            self.ssl_adapter.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.prepare()
        self.server_port: int = self.socket.getsockname()[1]

    def prepare(self):
        super().prepare()
        self._connections._selector.close()  # cheroot's own manager, replaced before it ever ran
        self.socket.setblocking(False)
        self._connections = RequestGate(self)

    def serve_forever(self) -> None:
        threading.Thread(target=self._serve_unservicable, name="http-503", daemon=True).start()  # type: ignore[attr-defined]
        while self.ready:
            try:
                self._connections.run(self.expiration_interval)
            except Exception:  # the loop must go on while the server is up
                log.exception("HTTP server loop failed")
                time.sleep(0.1)

    def shutdown(self) -> None:
        """Stop accepting, close the connections held, let requests in progress finish (bounded): idempotent."""
        self.stop()

    def error_log(self, msg="", level=logging.INFO, traceback=False):
        """cheroot writes to stderr; ours goes to logging."""
        log.log(level if level > logging.INFO else logging.DEBUG, "%s", msg, exc_info=traceback)
