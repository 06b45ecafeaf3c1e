"""FunctionConfig's parts (resources, producerConfig), the values its enumerated fields may take, and its defaults."""

from __future__ import annotations

from dataclasses import dataclass

GUARANTEES = ("ATLEAST_ONCE", "ATMOST_ONCE", "EFFECTIVELY_ONCE", "MANUAL")
RUNTIMES = ("PYTHON", "JAVA", "GO")
SUBSCRIPTION_POSITIONS = ("Latest", "Earliest")
COMPRESSION_TYPES = ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY")
BATCH_BUILDERS = ("DEFAULT", "KEY_BASED")
# Small on purpose: messages prefetched by old instances are not given to a new one,
# so the prefetch queue bounds how soon a scale-out takes effect (docs/runtime.md, "Receiver queue").
DEFAULT_RECEIVER_QUEUE_SIZE = 100
# Pulsar's defaults for a resources object given in part (FunctionConfigUtils).
DEFAULT_RESOURCES = {"cpu": 1.0, "ram": 1073741824, "disk": 10737418240}


@dataclass(frozen=True)
class Resources:
    """Pulsar's resources: what one instance asks for (cores, bytes of RAM, bytes of disk)."""

    cpu: float = DEFAULT_RESOURCES["cpu"]
    ram: int = int(DEFAULT_RESOURCES["ram"])
    disk: int = int(DEFAULT_RESOURCES["disk"])


@dataclass(frozen=True)
class ProducerConfig:
    """Pulsar's producerConfig, for the function's output producer."""

    maxPendingMessages: int | None = None
    maxPendingMessagesAcrossPartitions: int | None = None
    compressionType: str | None = None
    batchBuilder: str | None = None
