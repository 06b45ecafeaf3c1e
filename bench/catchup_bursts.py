"""What a paced catch-up read costs another topic's records on the broker, by how the read is paced (keyed state's pre-copy).

A key group's pre-copy reads the function's changelog from its start while the function's records flow through
the same broker. This bench puts BIG MB of RECORD-KB records on one topic, then sends small probe records at
PROBE-RATE/s through another topic and measures each one's send-to-receive latency: first with nothing else
going on (the baseline), then while a reader in another process reads the big topic from its start at RATE MB/s
on average, sleeping after every PACE-EVERY records (a burst of PACE-EVERY records at full speed, then the
sleep that keeps the average). Each pacing runs after a baseline of its own, on the same broker.

    .venv/bin/python bench/catchup_bursts.py [--mb 300] [--record-kb 50] [--rate-mbps 20] [--queue 3]
        [--pace-every 50,2] [--probe-rate 300] [--seconds 15] [--no-relay]

Prints one JSON object: per pacing, the probe's p50 and p99 before and during the read and their ratios.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402

from bench.state_migration import _pct  # noqa: E402
from pulsar_autoscale.broker.embedded import EmbeddedBroker  # noqa: E402

WARM_UP_S = 2.0


def _read(
    service_url: str, topic: str, records: int, record_bytes: int, rate_mbps: float, queue: int, pace_every: int, result
) -> None:
    """Child process: read `records` from the start of `topic`, paced after every `pace_every` records."""
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    reader = client.create_reader(topic, pulsar.MessageId.earliest, receiver_queue_size=queue)
    n, t0 = 0, time.monotonic()
    while n < records:
        reader.read_next(10_000)
        n += 1
        if n % pace_every == 0:
            ahead = n * record_bytes / (rate_mbps * 1e6) - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    result.put((time.monotonic() - t0, n))
    client.close()


class Probe:
    """Small records at `rate`/s on a topic of their own; the latency of each, by its send time."""

    def __init__(self, client: pulsar.Client, rate: float):
        topic = f"persistent://public/default/probe-{uuid.uuid4().hex[:8]}"
        self._consumer = client.subscribe(topic, "probe", consumer_type=pulsar.ConsumerType.Shared)
        self._producer = client.create_producer(topic, batching_enabled=False)
        self._interval = 1 / rate
        self.latencies: list[tuple[float, float]] = []  # (sent at, ms)
        self._done = threading.Event()
        self._receiver = threading.Thread(target=self._receive, daemon=True)
        self._receiver.start()

    def _receive(self) -> None:
        while not self._done.is_set():
            try:
                msg = self._consumer.receive(200)
            except pulsar.Timeout:
                continue
            sent = float(msg.data())
            self.latencies.append((sent, (time.time() - sent) * 1000))
            self._consumer.acknowledge(msg)

    def send_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._producer.send_async(repr(time.time()).encode(), None)
            time.sleep(self._interval)  # pacing the probe, not synchronisation

    def between(self, t0: float, t1: float) -> list[float]:
        return [ms for sent, ms in self.latencies if t0 <= sent < t1]

    def close(self) -> None:
        self._done.set()
        self._receiver.join()


def measure(broker: EmbeddedBroker, probe: Probe, big: str, records: int, args, pace_every: int) -> dict:
    t_before = time.time()
    probe.send_for(args.seconds)
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    t_read = time.time()
    reader = ctx.Process(
        target=_read,
        args=(broker.service_url, big, records, args.record_kb * 1000, args.rate_mbps, args.queue, pace_every, result),
    )
    reader.start()
    while reader.is_alive() and result.empty():  # probing all through the read
        probe.send_for(0.5)
    read_s, read_n = result.get(timeout=60)
    reader.join(30)
    before = probe.between(t_before + WARM_UP_S, t_read)
    during = probe.between(t_read, t_read + read_s)
    out = {
        "pace_every_records": pace_every,
        "burst_kb": pace_every * args.record_kb,
        "read_s": round(read_s, 1),
        "read_records": read_n,
        "read_mb_per_s": round(read_n * args.record_kb / 1000 / read_s, 1),
    }
    for name, xs in (("before", before), ("during", during)):
        out[name] = {"n": len(xs), "p50_ms": round(_pct(xs, 0.5), 3), "p99_ms": round(_pct(xs, 0.99), 3)}
    out["p50_during_over_before"] = round(out["during"]["p50_ms"] / out["before"]["p50_ms"], 2)
    out["p99_during_over_before"] = round(out["during"]["p99_ms"] / out["before"]["p99_ms"], 2)
    print(
        f"pace every {pace_every} records: p99 {out['before']['p99_ms']} -> {out['during']['p99_ms']} ms",
        file=sys.stderr,
        flush=True,
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=300, help="size of the big topic the reader catches up on")
    ap.add_argument("--record-kb", type=int, default=50, help="size of its records (a 500 MB state's changelog)")
    ap.add_argument("--rate-mbps", type=float, default=20.0, help="the read's average rate")
    ap.add_argument("--queue", type=int, default=3, help="the reader's receiver queue, in records")
    ap.add_argument("--pace-every", default="50,2", help="pacings to compare: records per burst, comma-separated")
    ap.add_argument("--probe-rate", type=float, default=300.0, help="probe records per second")
    ap.add_argument("--seconds", type=float, default=15.0, help="the baseline's length before each read")
    ap.add_argument(
        "--no-relay", action="store_true", help="clients reach pulsar-lite directly (docs/dev/pulsar-lite-defects.md, B10)"
    )
    args = ap.parse_args()
    pacings = [int(p) for p in args.pace_every.split(",")]
    records = args.mb * 1000 // args.record_kb
    with (
        tempfile.TemporaryDirectory(prefix="bench-catchup-") as tmp,
        EmbeddedBroker(data_dir=tmp, log_level="warn", relay=not args.no_relay) as broker,
    ):
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        big = f"persistent://public/default/big-{uuid.uuid4().hex[:8]}"
        producer = client.create_producer(big, batching_enabled=True, batching_max_publish_delay_ms=5, block_if_queue_full=True)
        print(f"writing {args.mb} MB to the big topic...", file=sys.stderr, flush=True)
        blob = b"x" * (args.record_kb * 1000)
        for _ in range(records):
            producer.send_async(blob, None)
        producer.flush()
        producer.close()
        probe = Probe(client, args.probe_rate)
        runs = [measure(broker, probe, big, records, args, p) for p in pacings]
        probe.close()
        client.close()
    print(
        json.dumps(
            {
                "mb": args.mb,
                "record_kb": args.record_kb,
                "rate_mbps": args.rate_mbps,
                "queue": args.queue,
                "probe_rate": args.probe_rate,
                "relay": not args.no_relay,
                "runs": runs,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
