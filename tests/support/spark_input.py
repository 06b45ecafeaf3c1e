"""The keyed input the Spark source tests read: each message carries its global index and its index within its key."""

from __future__ import annotations

KEYS = [f"k{i}" for i in range(10)]


def produce(client, topic: str, n: int, start: int = 0, batching: bool = True) -> None:
    """n messages over KEYS; each carries its global index and its index within its key."""
    producer = client.create_producer(topic, batching_enabled=batching, block_if_queue_full=True)
    for i in range(start, start + n):
        key = KEYS[i % len(KEYS)]
        producer.send_async(
            f"{key}:{i}".encode(), None, partition_key=key, properties={"i": str(i), "keySeq": str(i // len(KEYS))}
        )
    producer.flush()
    producer.close()
