"""A TCP relay in front of pulsar-lite that turns a client's connection reset into a clean close (fence for B10).

B10: when a client dies with data still unread in its socket (kill -9 under load), the kernel
resets the connection. pulsar-lite 0.2.0 returns from the connection's loop on the read
error before its cleanup runs, so the dead client's consumers stay registered on their
subscriptions until the broker restarts: the messages dispatched to them are never
redelivered, and their consumer ids are refused to everyone else ("Consumer 0 already
exists"). A clean end of stream runs the cleanup (consumers removed, their unacked messages
redelivered within milliseconds).

The same early return happens when a client's byte stream ends inside a frame (a client
killed in the middle of writing one): the broker's decoder fails with "bytes remaining on
stream" and the dead client's consumers stay, with every message dispatched to them. So the
relay forwards only whole frames from the client: it holds back a frame until its last byte
has arrived, and a client that ends inside one has that partial frame dropped.

The relay runs as its own process (no GIL shared with a worker) and forwards bytes both
ways. pulsar-lite answers a topic lookup with its own address (the private port), so the relay
rewrites the broker URL in lookup responses to its own: clients stay on the relay. When the
client side ends, by FIN or by reset, it half-closes the broker side and
reads whatever the broker still sends until the broker closes, so pulsar-lite always sees a
clean end of stream at a frame boundary and never a reset. It adds one loopback hop per message.

    python -m pulsar_autoscale.broker.relay LISTEN_PORT UPSTREAM_PORT [LOG_FILE]

LOG_FILE (appended to; the embedded broker gives its broker.log) gets a line for each client
that ended inside a frame.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time

HOST = "127.0.0.1"
CHUNK = 256 * 1024
LOOKUP_RESPONSE = 24  # BaseCommand.Type.LOOKUP_RESPONSE, also the field number of lookupTopicResponse
BROKER_SERVICE_URL = 1  # CommandLookupTopicResponse.brokerServiceUrl


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _put_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(msg: bytes):
    """(field number, wire type, raw bytes of the whole field) for each field of a protobuf message."""
    i = 0
    while i < len(msg):
        start = i
        tag, i = _varint(msg, i)
        wire = tag & 7
        if wire == 0:
            _, i = _varint(msg, i)
        elif wire == 2:
            n, i = _varint(msg, i)
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        yield tag >> 3, wire, msg[start:i]


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _put_varint(number << 3 | 2) + _put_varint(len(payload)) + payload


def rewrite_lookup(frame: bytes, broker_url: bytes) -> bytes:
    """A frame with its LookupTopicResponse's brokerServiceUrl set to broker_url; any other frame unchanged."""
    if len(frame) < 10 or frame[8] != 0x08 or frame[9] != LOOKUP_RESPONSE:
        return frame
    cmd_size = int.from_bytes(frame[4:8], "big")
    command, rest = frame[8 : 8 + cmd_size], frame[8 + cmd_size :]
    out = bytearray()
    for number, wire, raw in _fields(command):
        if number == LOOKUP_RESPONSE and wire == 2:
            inner = bytearray()
            _, start = _varint(raw, 0)
            n, start = _varint(raw, start)
            for f, _w, r in _fields(raw[start : start + n]):
                inner += _length_delimited(BROKER_SERVICE_URL, broker_url) if f == BROKER_SERVICE_URL else r
            out += _length_delimited(LOOKUP_RESPONSE, bytes(inner))
        else:
            out += raw
    body = len(out).to_bytes(4, "big") + bytes(out) + rest
    return len(body).to_bytes(4, "big") + body


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def frame_ends(buf: bytes | bytearray) -> list[int]:
    """Where each whole frame at the start of buf ends (a frame: 4-byte big-endian size, then that many bytes)."""
    ends, i = [], 0
    while len(buf) - i >= 4:
        end = i + 4 + int.from_bytes(buf[i : i + 4], "big")
        if end > len(buf):
            break
        ends.append(end)
        i = end
    return ends


async def _client_to_broker(client: asyncio.StreamReader, broker: asyncio.StreamWriter, log) -> None:
    pending = bytearray()
    try:
        while data := await client.read(CHUNK):
            pending += data
            ends = frame_ends(pending)
            if ends:
                broker.write(bytes(pending[: ends[-1]]))
                del pending[: ends[-1]]
                await broker.drain()
    except (ConnectionError, OSError):
        pass  # reset by a dead client: the broker still gets a clean end of stream below
    finally:
        if pending:
            log(
                f"a client ended inside a frame: dropped its last {len(pending)} bytes, so the broker "
                "sees a clean close and redelivers what it dispatched to that client (B10)"
            )
        try:
            broker.write_eof()
        except (ConnectionError, OSError, RuntimeError):
            pass


async def _broker_to_client(broker: asyncio.StreamReader, client: asyncio.StreamWriter, broker_url: bytes) -> None:
    client_alive = True
    pending = bytearray()
    try:
        while data := await broker.read(CHUNK):
            if not client_alive:
                continue  # drain what the broker sends until it closes: never reset the broker's side
            pending += data
            ends = frame_ends(pending)
            frames = [rewrite_lookup(bytes(pending[a:b]), broker_url) for a, b in zip([0, *ends], ends)]
            del pending[: ends[-1] if ends else 0]
            try:
                client.write(b"".join(frames))
                await client.drain()
            except (ConnectionError, OSError):
                client_alive = False
    except (ConnectionError, OSError):
        pass
    finally:
        client.close()  # the broker closed (B3 does on any refused command): the client must see it and reconnect


async def _serve(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, upstream_port: int, broker_url: bytes, log
) -> None:
    try:
        broker_r, broker_w = await asyncio.open_connection(HOST, upstream_port)
    except OSError:
        client_w.close()
        return
    _nodelay(client_w)
    _nodelay(broker_w)
    try:
        await asyncio.gather(_client_to_broker(client_r, broker_w, log), _broker_to_client(broker_r, client_w, broker_url))
    finally:
        for w in (broker_w, client_w):
            w.close()


def file_log(path: str | None):
    """A line per event, appended to path (None: nowhere: the relay's stdout and stderr are not read)."""

    def log(line: str) -> None:
        if path is not None:
            with open(path, "a") as f:
                f.write(f"relay: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {line}\n")

    return log


async def main(listen_port: int, upstream_port: int, log_path: str | None = None) -> None:
    broker_url = f"pulsar://{HOST}:{listen_port}".encode()
    log = file_log(log_path)
    server = await asyncio.start_server(
        lambda r, w: _serve(r, w, upstream_port, broker_url, log), HOST, listen_port, reuse_address=True
    )
    print("relay ready", flush=True)  # EmbeddedBroker waits for this line: the port is ours
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None))
    except KeyboardInterrupt:
        pass
