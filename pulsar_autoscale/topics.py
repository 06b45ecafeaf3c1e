"""Pulsar topic names as users write them, made whole: shared by the worker, the controller and the adapters."""

from __future__ import annotations

import re

from pulsar_autoscale.errors import ConfigError

# The local names of this project's coordination topics (leader lock and epochs, controls, cluster membership and
# assignments, consumer-id slots) start with this: no function may read or write them.
INTERNAL_PREFIX = "__pulsar_autoscale"
_TOPIC_RE = re.compile(r"^(persistent|non-persistent)://[^/\s]+/[^/\s]+/[^/\s]+$")


def normalize_topic(topic: str, tenant: str = "public", namespace: str = "default") -> str:
    """Pulsar's short topic names: `t` -> persistent://public/default/t, `tn/ns/t` -> persistent://tn/ns/t."""
    if not isinstance(topic, str) or not topic.strip():
        raise ConfigError(f"invalid topic name {topic!r}: must be a non-empty string")
    topic = topic.strip()
    if "://" not in topic:
        parts = topic.split("/")
        if len(parts) == 1:
            topic = f"persistent://{tenant}/{namespace}/{topic}"
        elif len(parts) == 3:
            topic = f"persistent://{topic}"
        else:
            raise ConfigError(f"invalid topic name {topic!r}: use 'name', 'tenant/namespace/name' or a full persistent:// URL")
    if not _TOPIC_RE.match(topic):
        raise ConfigError(f"invalid topic name {topic!r}: expected persistent://tenant/namespace/topic")
    return topic


def is_internal(topic: str) -> bool:
    return topic.rsplit("/", 1)[-1].startswith(INTERNAL_PREFIX)
