"""The source's read loop in C (`_native_reader.c`), where it is built and the connection allows it.

Per message, `ranges.read_range` makes about ten calls into the client under the GIL; the C loop reads a
chunk of the range with the GIL released into column buffers that become an Arrow record batch without a
Python object per message. It is an optional extension (setup.py): where it is not built, or cannot be
loaded (Spark executors importing the package from a zip), the Python loop reads. Both follow the same
rules: (start, end] once each in id order, duplicates (B1) dropped, a stalled reader reopened after the
last message, the range lost after pollTimeoutMs.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
from typing import Iterator

from pulsar_autoscale.pulsar_client import TOKEN_PLUGINS

from .offsets import EARLIEST, Position, TopicRange
from .options import ConnectionOptions
from .ranges import RECEIVER_QUEUE, STALL_REOPEN_MS, lost

log = logging.getLogger(__name__)
MORE, DONE, TIMED_OUT = 0, 1, 2  # _native_reader.Reader.read's status


@functools.cache
def _module():
    """(the loaded extension, None) or (None, why it cannot be used)."""
    try:
        from . import _native_reader
    except ImportError as exc:
        return None, f"the C read loop is not built ({exc})"
    import _pulsar

    libs = sorted(glob.glob(os.path.join(os.path.dirname(_pulsar.__file__), "pulsar_client.libs", "libpulsar*.so*")))
    if not libs:
        return None, "pulsar-client ships no libpulsar beside _pulsar (the C read loop needs its C API)"
    try:
        _native_reader.load(libs[0])
    except OSError as exc:
        return None, f"Pulsar's C API did not load: {exc}"
    return _native_reader, None


def unavailable(connection: ConnectionOptions) -> str | None:
    """Why the C loop cannot read with these settings; None when it can."""
    why = _module()[1]
    plugin = connection.client.auth_plugin
    if why is None and plugin and plugin not in TOKEN_PLUGINS:
        why = f"it authenticates with tokens only (authPlugin {plugin!r})"
    return why


def read_batches(
    connection: ConnectionOptions, rng: TopicRange, poll_timeout_ms: int, fail_on_data_loss: bool, chunk: int, arrow_schema
) -> Iterator:
    """The messages of (start, end] as Arrow record batches of up to `chunk` rows (ranges.read_range's rules)."""
    module = _module()[0]
    if rng.empty:
        return
    client = connection.client

    def open_after(last: Position):
        start = None if last == EARLIEST else last.message_id().serialize()
        return module.Reader(
            client.service_url,
            rng.topic,
            start,
            last.key(),
            rng.end.key(),
            RECEIVER_QUEUE,
            connection.operation_timeout_s,
            client.bearer_token(),
            client.tls_trust_certs_file_path,
            client.tls_allow_insecure_connection,
            client.tls_validate_hostname,
        )

    reader = open_after(rng.start)
    waited_ms, wait_ms = 0, min(STALL_REOPEN_MS, poll_timeout_ms)
    try:
        while True:
            status, n, *buffers = reader.read(chunk, wait_ms)
            if n:
                yield _record_batch(n, buffers, rng.topic, arrow_schema)
                waited_ms, wait_ms = 0, min(STALL_REOPEN_MS, poll_timeout_ms)
            if status == DONE:
                return
            if status == TIMED_OUT:
                waited_ms += wait_ms
                wait_ms = min(STALL_REOPEN_MS, poll_timeout_ms - waited_ms)
                last = Position(*reader.last())
                if waited_ms >= poll_timeout_ms:
                    lost(rng, last, poll_timeout_ms, fail_on_data_loss)
                    return
                log.info("topic %s: nothing after %s for %d ms; reopening the reader", rng.topic, last, waited_ms)
                reader.close()
                reader = open_after(last)
    finally:
        reader.close()


def _record_batch(n: int, buffers: list[bytes], topic: str, arrow_schema):
    """The C loop's column buffers (see Reader_read) as a record batch of the source's schema, no copy."""
    import pyarrow as pa

    (
        key_valid,
        key_offsets,
        keys,
        value_offsets,
        values,
        id_offsets,
        ids,
        publish,
        event_valid,
        event,
        prop_offsets,
        prop_key_offsets,
        prop_keys,
        prop_value_offsets,
        prop_values,
    ) = map(pa.py_buffer, buffers)
    as_ms, time_type = pa.timestamp("ms", tz="UTC"), arrow_schema.field("publishTime").type
    n_props = prop_key_offsets.size // 4 - 1
    return pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(pa.string(), n, [key_valid, key_offsets, keys]),
            pa.Array.from_buffers(pa.binary(), n, [None, value_offsets, values]),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.Array.from_buffers(pa.binary(), n, [None, id_offsets, ids]),
            pa.Array.from_buffers(as_ms, n, [None, publish]).cast(time_type),
            pa.Array.from_buffers(as_ms, n, [event_valid, event]).cast(time_type),
            pa.MapArray.from_arrays(
                pa.Array.from_buffers(pa.int32(), n + 1, [None, prop_offsets]),
                pa.Array.from_buffers(pa.string(), n_props, [None, prop_key_offsets, prop_keys]),
                pa.Array.from_buffers(pa.string(), n_props, [None, prop_value_offsets, prop_values]),
                type=arrow_schema.field("properties").type,
            ),
        ],
        schema=arrow_schema,
    )
