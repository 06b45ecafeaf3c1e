"""The request gate of the HTTP server (httpd.py): one selector thread that accepts connections within the
per-client and total caps, does TLS handshakes without blocking, and reads each request's head (and a small
body) before a pool thread is given it, so clients that send nothing, or send slowly, hold no thread.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cheroot import server as cheroot_server
from cheroot.makefile import StreamWriter

if TYPE_CHECKING:
    from .httpd import HTTPServer

log = logging.getLogger("pulsar_autoscale.http")

DRAIN_LIMIT = 64 << 10  # unread request body a keep-alive connection may still drain after the response
LINGER_S = 2.0  # past it, reading (and discarding) what the client still sends after a refusal
MAX_HEAD_BYTES = 64 << 10  # request line and headers
REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True)
class ServerLimits:
    """How long and how many: the defaults suit a worker or controller facing untrusted networks."""

    threads: int = 16  # the pool that runs the WSGI app (fixed size)
    queue: int = 128  # complete requests waiting for a thread; past it: 503
    idle_timeout_s: float = 30.0  # a new or keep-alive connection that sends no request
    handshake_timeout_s: float = 10.0  # the whole TLS handshake
    head_timeout_s: float = 10.0  # the request line and headers, from their first byte
    body_timeout_s: float = 30.0  # a buffered body, from the end of the head
    read_timeout_s: float = 10.0  # each socket read or write in a pool thread
    stream_timeout_s: float = 300.0  # a streamed (large or chunked) body, read by the app
    buffered_body_bytes: int = 64 << 10  # bodies up to this are read by the gate
    per_client_connections: int = 64  # open connections per client address
    max_connections: int = 1000  # open connections in all
    shutdown_timeout_s: float = 1.0  # stop(): how long requests in progress may finish


class _Reader:
    """A connection's read side: bytes the gate has read, then (in a pool thread) the socket, under a deadline."""

    def __init__(self, sock, read_timeout_s: float):
        self.sock = sock
        self.read_timeout_s = read_timeout_s
        self.buf = bytearray()
        self.pos = 0
        self.deadline: float | None = None  # set when the connection goes to a pool thread
        self.bytes_read = 0
        self.closed = False
        self.eof = False

    def pending(self) -> bytes:
        return bytes(self.buf[self.pos :])

    def feed(self, data: bytes) -> None:
        if self.pos > 65536:
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += data

    def has_data(self) -> bool:
        return len(self.buf) > self.pos

    def _fill(self) -> bool:
        if self.eof:
            return False
        remaining = (self.deadline or 0) - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("timed out")
        self.sock.settimeout(min(self.read_timeout_s, remaining))
        data = self.sock.recv(65536)
        if not data:
            self.eof = True
            return False
        self.feed(data)
        return True

    def _take(self, n: int) -> bytes:
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += len(out)
        self.bytes_read += len(out)
        return out

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            while self._fill():
                pass
            return self._take(len(self.buf) - self.pos)
        if not self.has_data():
            self._fill()
        return self._take(min(size, len(self.buf) - self.pos))

    def readline(self, size: int | None = -1) -> bytes:
        limit = size if size is not None and size >= 0 else None
        while True:
            end = self.buf.find(b"\n", self.pos)
            if end >= 0 and (limit is None or end - self.pos < limit):
                return self._take(end + 1 - self.pos)
            if limit is not None and len(self.buf) - self.pos >= limit:
                return self._take(limit)
            if not self._fill():
                return self._take(len(self.buf) - self.pos)

    def readlines(self, hint: int = 0) -> list[bytes]:
        return list(iter(self.readline, b""))

    def __iter__(self):
        return iter(self.readline, b"")

    def close(self) -> None:
        self.closed = True


class _Request(cheroot_server.HTTPRequest):
    def send_headers(self):
        """Close rather than drain a large unread body (an early 401/413): draining would hand the client a thread;
        the gate lingers on it instead."""
        unread_chunked = self.chunked_read and not getattr(self.rfile, "closed", True)
        unread = getattr(self.rfile, "remaining", 0)
        if unread > DRAIN_LIMIT or unread_chunked:
            self.close_connection = True
        super().send_headers()
        if self.close_connection and (unread or unread_chunked):
            self.conn.linger_on_close = True


class GatedConnection(cheroot_server.HTTPConnection):
    RequestHandlerClass = _Request

    def __init__(self, server: "HTTPServer", sock, addr):
        self._released = False
        self.gate: RequestGate = server._connections
        self.client = addr[0] if isinstance(addr, tuple) else str(addr)
        super().__init__(server, sock, makefile=self._makefile)
        self.remote_addr, self.remote_port = (addr[0], addr[1]) if isinstance(addr, tuple) else ("", 0)
        # gate state
        self.handshaken = not isinstance(sock, ssl.SSLSocket)
        self.deadline = 0.0
        self.head_started = self.body_started = False
        self.linger_on_close = self.draining = False
        self.want = selectors.EVENT_READ

    def _makefile(self, sock, mode="r", bufsize=8192):
        if "r" in mode:
            return _Reader(sock, self.server.limits.read_timeout_s)
        return StreamWriter(sock, mode, bufsize)

    def close(self):
        if self.linger_on_close and self.server.ready:
            self.linger_on_close = False
            self.gate.put(self, linger=True)
            return
        try:
            super().close()
        except OSError:
            pass
        finally:
            if not self._released:
                self._released = True
                self.gate.release(self.client)


class RequestGate:
    """Stands in for cheroot's ConnectionManager (the same methods): owns every connection between requests."""

    def __init__(self, server: "HTTPServer"):
        self.server = server
        self.limits: ServerLimits = server.limits
        self._selector = selectors.DefaultSelector()
        self._selector.register(server.socket, selectors.EVENT_READ, data=None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, data=self._wake_r)
        self._returned: collections.deque[tuple[GatedConnection, bool]] = collections.deque()
        self._conns: set[GatedConnection] = set()  # connections the gate holds (selector thread only)
        self._lock = threading.Lock()
        self._per_client: dict[str, int] = {}
        self._open = 0
        self._stop = threading.Event()
        self._running = threading.Event()  # run() is in its loop
        self._stopped = threading.Event()
        self.refused = 0

    # ---- counting ------------------------------------------------------------------------------------
    def _admit(self, client: str) -> bool:
        with self._lock:
            n = self._per_client.get(client, 0)
            if n >= self.limits.per_client_connections or self._open >= self.limits.max_connections:
                self.refused += 1
                return False
            self._per_client[client] = n + 1
            self._open += 1
            return True

    def release(self, client: str) -> None:
        with self._lock:
            n = self._per_client.get(client, 0) - 1
            if n > 0:
                self._per_client[client] = n
            else:
                self._per_client.pop(client, None)
            self._open -= 1

    def connections_of(self, client: str) -> int:
        with self._lock:
            return self._per_client.get(client, 0)

    @property
    def can_add_keepalive_connection(self) -> bool:
        return True  # every connection is already counted against the caps

    @property
    def _num_connections(self) -> int:
        return self._open

    # ---- the ConnectionManager interface ----------------------------------------------------------------
    def put(self, conn: GatedConnection, linger: bool = False) -> None:
        """A pool thread is done with a keep-alive connection: back to the gate for its next request (or, with
        ``linger``, to read what the client still sends after a refusal, then close)."""
        self._returned.append((conn, linger))
        self._wake()

    def run(self, expiration_interval: float) -> None:
        self._running.set()
        try:
            next_expiry = time.monotonic() + expiration_interval
            while not self._stop.is_set():
                timeout = max(0.0, next_expiry - time.monotonic())
                for key, _events in self._selector.select(timeout):
                    if key.data is None:
                        self._accept()
                    elif key.data is self._wake_r:
                        self._drain_wake()
                    else:
                        self._step(key.data)
                while self._returned:
                    self._rearm(*self._returned.popleft())
                now = time.monotonic()
                if now >= next_expiry:
                    self._expire(now)
                    next_expiry = now + expiration_interval
        finally:
            self._running.clear()
            self._stopped.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        if self._running.is_set():
            self._stopped.wait(5)

    def close(self) -> None:
        for conn in list(self._conns):
            self._drop(conn)
        while self._returned:
            self._returned.popleft()[0].close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # ---- the gate ------------------------------------------------------------------------------------
    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass  # the pipe is full (a wake-up is pending anyway) or closed (stopping)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _accept(self) -> None:
        for _ in range(64):  # a burst, then back to the other connections
            try:
                sock, addr = self.server.socket.accept()
            except (BlockingIOError, InterruptedError, TimeoutError):
                return
            except OSError as exc:  # out of file descriptors, a connection reset before accept
                log.warning("accept failed: %s", exc)
                return
            client = addr[0] if isinstance(addr, tuple) else str(addr)
            if not self._admit(client):
                log.debug("refused a connection from %s: over the connection limit", client)
                _abort(sock)
                continue
            try:
                sock.setblocking(False)
                if self.server.nodelay and sock.family in (socket.AF_INET, socket.AF_INET6):
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.server.ssl_adapter is not None:
                    sock = self.server.ssl_adapter.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                conn = GatedConnection(self.server, sock, addr)
            except OSError:
                self.release(client)
                _abort(sock)
                continue
            now = time.monotonic()
            conn.deadline = now + (
                self.limits.idle_timeout_s
                if conn.handshaken
                else min(self.limits.idle_timeout_s, self.limits.handshake_timeout_s)
            )
            self._watch(conn, selectors.EVENT_READ)

    def _watch(self, conn: GatedConnection, events: int) -> None:
        if conn in self._conns:
            if conn.want != events:
                self._selector.modify(conn.socket, events, data=conn)
        else:
            self._selector.register(conn.socket, events, data=conn)
            self._conns.add(conn)
        conn.want = events

    def _unwatch(self, conn: GatedConnection) -> None:
        if conn in self._conns:
            self._conns.discard(conn)
            try:
                self._selector.unregister(conn.socket)
            except (KeyError, ValueError, OSError):
                pass

    def _drop(self, conn: GatedConnection) -> None:
        self._unwatch(conn)
        conn.close()

    def _rearm(self, conn: GatedConnection, linger: bool) -> None:
        if self._stop.is_set():
            conn.close()
            return
        try:
            conn.socket.setblocking(False)
        except OSError:
            conn.close()
            return
        if linger:
            conn.draining = True
            conn.deadline = time.monotonic() + LINGER_S
            self._watch(conn, selectors.EVENT_READ)
            return
        conn.rfile.deadline = None
        conn.head_started = conn.body_started = False
        conn.deadline = time.monotonic() + self.limits.idle_timeout_s
        self._watch(conn, selectors.EVENT_READ)
        tls_pending = isinstance(conn.socket, ssl.SSLSocket) and conn.socket.pending()
        if conn.rfile.has_data() or tls_pending:  # a pipelined request, already read: select would not say
            self._step(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns if c.deadline <= now]:
            log.debug("closing a connection from %s: timed out", conn.client)
            if conn.head_started and not conn.draining:
                with contextlib.suppress(OSError):  # best effort: the socket does not block
                    conn.socket.send(REQUEST_TIMEOUT)
            self._drop(conn)

    def _step(self, conn: GatedConnection) -> None:
        if not conn.handshaken:
            try:
                conn.socket.do_handshake()
            except ssl.SSLWantReadError:
                self._watch(conn, selectors.EVENT_READ)
                return
            except ssl.SSLWantWriteError:
                self._watch(conn, selectors.EVENT_WRITE)
                return
            except (ssl.SSLError, OSError) as exc:
                log.debug("TLS handshake with %s failed: %s", conn.client, exc)
                self._drop(conn)
                return
            conn.handshaken = True
            conn.ssl_env = self.server.ssl_adapter.get_environ(conn.socket)
            conn.deadline = time.monotonic() + self.limits.idle_timeout_s
            self._watch(conn, selectors.EVENT_READ)
        if conn.draining:
            self._discard(conn)
            return
        reader: _Reader = conn.rfile
        cap = MAX_HEAD_BYTES + self.limits.buffered_body_bytes + 65536
        while len(reader.buf) - reader.pos < cap:
            try:
                data = conn.socket.recv(65536)
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError:
                self._drop(conn)
                return
            if not data:  # the client closed, between or in the middle of a request
                self._drop(conn)
                return
            reader.feed(data)
        self._check(conn)

    def _discard(self, conn: GatedConnection) -> None:
        for _ in range(64):
            try:
                if not conn.socket.recv(65536):
                    break
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError:
                break
        else:
            return
        self._drop(conn)

    def _check(self, conn: GatedConnection) -> None:
        """Hand the connection to the pool once its request (head, and a small body) is all here."""
        reader: _Reader = conn.rfile
        view = reader.buf
        now = time.monotonic()
        start = reader.pos
        while view.startswith(b"\r\n", start):  # blank lines before a request line are allowed
            start += 2
        if start >= len(view):
            return
        if not conn.head_started:
            conn.head_started = True
            conn.deadline = now + self.limits.head_timeout_s
        end = view.find(b"\r\n\r\n", start)
        if end < 0:
            if len(view) - start > MAX_HEAD_BYTES:
                self._dispatch(conn, now + self.limits.read_timeout_s)  # cheroot answers 413/414
            return
        length, streamed = _body_of(bytes(view[start:end]), self.limits.buffered_body_bytes)
        if streamed:
            self._dispatch(conn, now + self.limits.stream_timeout_s)
        elif len(view) - (end + 4) >= length:
            self._dispatch(conn, now + self.limits.read_timeout_s)
        elif not conn.body_started:
            conn.body_started = True
            conn.deadline = now + self.limits.body_timeout_s

    def _dispatch(self, conn: GatedConnection, deadline: float) -> None:
        self._unwatch(conn)
        conn.rfile.deadline = deadline
        try:
            conn.socket.settimeout(self.limits.read_timeout_s)
        except OSError:
            conn.close()
            return
        self.server.process_conn(conn)


def _body_of(head: bytes, buffered: int) -> tuple[int, bool]:
    """(Content-Length, whether the body is streamed to the app rather than read by the gate)."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding" or (name == b"expect" and b"100-continue" in value.lower()):
            return 0, True
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return 0, True  # cheroot answers 400
    return length, length > buffered


def _abort(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
