"""A deleted function's state topics, deleted from the broker as Apache Pulsar drops a deleted function's state.

Pulsar's functions worker deletes a function's state table when the function is deleted (ComponentImpl
deregister). Here a function's state is a set of topics (`__state-{name}-{stateId}-changelog`, its shards
`-changelog-{s}`, and on a cluster `-assignment`, `-control`, `-route-{i}`: changelog.state_topic). The worker
speaks the binary protocol to the broker, which cannot delete topics, so this needs the broker's admin REST API:
the worker's `--web-service-url` (Pulsar's functions worker setting `pulsarWebServiceUrl`). pulsar-lite has none
(B7): without the setting the topics stay and the worker says which (docs/state.md).

Every worker that ran instances of the function deletes once its own instances have drained, so the last one to
finish removes whatever the others' last writes re-created; a topic another worker deleted first (404) is fine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

import requests

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.state.changelog import state_topic

TIMEOUT_S = 10.0
# What follows a function's state prefix (changelog.state_topic, keyed_cluster.KeyedTopics), and nothing else: a
# topic of another function whose name starts with this one's name and stateId has two dashes more than these.
_WHAT = r"(changelog(-\d+)?|assignment|control|route-\d+)"


class StateTopicsError(PulsarAutoscaleError):
    """The broker's admin API did not delete them; the message names the URL and what it answered."""


def web_service_url_checked(url: str) -> str:
    """The worker's --web-service-url, refused at start when it cannot be an admin API's address."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        raise ConfigError(
            f"--web-service-url {url!r} is not the broker's admin REST address: give "
            "http(s)://HOST:PORT (Pulsar's pulsarWebServiceUrl, e.g. http://broker:8080)"
        )
    return url.rstrip("/")


def state_topic_pattern(cfg: FunctionConfig) -> re.Pattern:
    """The function's state topics (full names), of this stateId only."""
    return re.compile(re.escape(state_topic(cfg.tenant, cfg.namespace, cfg.name, cfg.stateId, "")) + _WHAT)


@dataclass
class StateTopicCleaner:
    """Lists the function's namespace (getList) and force-deletes its state topics (deleteTopic): force, because
    a consumer of another worker may still be closing (Pulsar closes it, and nothing of the function reopens it)."""

    web_service_url: str
    session: requests.Session

    def delete(self, cfg: FunctionConfig) -> list[str]:
        """The topics deleted (none when it has none), partitioned ones too: a broker whose
        allowAutoTopicCreationType is `partitioned` created them so. Raises StateTopicsError."""
        base = f"{self.web_service_url}/admin/v2/persistent/{quote(cfg.tenant, safe='')}/{quote(cfg.namespace, safe='')}"
        where = f"{cfg.tenant}/{cfg.namespace}"
        deleted = []
        # getList also names each partition (`{topic}-partition-{i}`), which the pattern leaves to the second pass.
        for listing, suffix, what in ((base, "", "topics"), (f"{base}/partitioned", "/partitions", "partitioned topics")):
            for topic in self._state_topics(cfg, listing, f"list the {what} of {where}"):
                resp = self._call(
                    "DELETE",
                    f"{base}/{quote(topic.rsplit('/', 1)[1], safe='')}{suffix}",
                    {"force": "true"},
                    f"delete {topic}",
                    missing_ok=True,
                )
                if resp.status_code != 404:
                    deleted.append(topic)
        return deleted

    def _state_topics(self, cfg: FunctionConfig, url: str, what: str) -> list[str]:
        listed = self._call("GET", url, {"includeSystemTopic": "true"}, what)
        try:
            names = [str(t) for t in listed.json()]
        except (ValueError, TypeError):
            raise StateTopicsError(f"{url}: the topic list is not a JSON array of names: {listed.text[:200]!r}") from None
        pattern = state_topic_pattern(cfg)
        return sorted(t for t in names if pattern.fullmatch(t))

    def _call(self, method: str, url: str, params: dict, what: str, missing_ok: bool = False) -> requests.Response:
        try:
            resp = self.session.request(method, url, params=params, timeout=TIMEOUT_S)
        except requests.RequestException as exc:
            raise StateTopicsError(f"could not {what}: {url} cannot be reached: {exc}") from None
        if resp.ok or (missing_ok and resp.status_code == 404):
            return resp
        try:
            reason = resp.json().get("reason") or resp.text
        except (ValueError, AttributeError):
            reason = resp.text
        raise StateTopicsError(f"could not {what}: {method} {url} answered {resp.status_code}: {reason[:200]}")
