"""Child process of test_incarnations.py: one client on a Shared subscription, printing each message it acks (payload and message id).

consume URL TOPIC 0          a plain client (ids from 0), runs until killed
hold URL TOPIC N             a plain client that acks N messages, then holds what it prefetched until killed
publish-big URL TOPIC 0      a plain client that holds what it prefetched from TOPIC and publishes 512 KB
                             messages to TOPIC-big until killed (a kill lands in the middle of a frame)
incarnation URL TOPIC IDLE_S KIND
                             a lite.incarnation.incarnation_client for broker KIND (lite pads its consumer
                             ids; apache's is a plain client); prints FLOOR n, exits after IDLE_S without a
                             message or on SIGTERM (closing its client cleanly)
"""

from __future__ import annotations

import signal
import sys
import time

import pulsar


def main(mode: str, url: str, topic: str, idle_s: str, kind: str = "lite") -> None:
    terminated: list[int] = []  # a handler that takes no lock (pulsar_autoscale/stop_signals.py says why)
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(1))
    if mode == "incarnation":
        from pulsar_autoscale.broker.lite.incarnation import incarnation_client
        from pulsar_autoscale.broker.profile import APACHE, LITE

        client = incarnation_client(url, APACHE if kind == "apache" else LITE)
        print(f"FLOOR {client.floor}", flush=True)
    else:
        client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    consumer = client.subscribe(topic, "fn", consumer_type=pulsar.ConsumerType.Shared)
    print("READY", flush=True)
    if mode == "publish-big":
        producer = client.create_producer(topic + "-big", batching_enabled=False, block_if_queue_full=True)
        big = bytes(512 * 1024)
        while True:
            producer.send_async(big, None)
    last, acked = time.monotonic(), 0
    while not terminated and (mode in ("consume", "hold") or time.monotonic() - last < float(idle_s)):
        if mode == "hold" and acked >= int(idle_s):
            time.sleep(0.1)
            continue
        try:
            msg = consumer.receive(200)
        except pulsar.Timeout:
            continue
        consumer.acknowledge(msg)
        print(f"GOT {int(msg.data())} {msg.message_id()}", flush=True)
        last, acked = time.monotonic(), acked + 1
    consumer.close()
    client.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
