"""What a deleted function leaves behind, removed once its instances have drained.

Its files move aside at once (its name is free again); once the instances have drained they go, with
its subscription (Pulsar's cleanupSubscription) unless a function of the same name was created
meanwhile, and its state topics, as Pulsar drops a deleted function's state (functions/state/topics.py).
"""

from __future__ import annotations

import logging
import shutil
from typing import Callable

from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.state.changelog import state_topic
from pulsar_autoscale.functions.state.topics import StateTopicCleaner, StateTopicsError, web_service_url_checked
from pulsar_autoscale.functions.worker.broker_link import BrokerLink
from pulsar_autoscale.functions.worker.function_files import FunctionFiles
from pulsar_autoscale.functions.worker.hosted import HostedFunction

log = logging.getLogger(__name__)


class Leftovers:
    def __init__(self, files: FunctionFiles, link: BrokerLink, web_service_url: str | None, hosted: Callable[[str], bool]):
        """`web_service_url`: the broker's admin REST API (Pulsar's pulsarWebServiceUrl), where state topics
        are deleted; `hosted`: whether a function of that name is hosted (again) now."""
        self._files = files
        self._link = link
        self._hosted = hosted
        self._state_topics = (
            None
            if web_service_url is None
            else StateTopicCleaner(web_service_url_checked(web_service_url), link.settings.http_session())
        )

    def remove(self, fn: HostedFunction) -> Callable[[], None]:
        """Moves the function's files aside now; returns what removes the rest once its instances drained."""
        trash = self._files.remove(fn.config)

        def then():
            if fn.keyed is not None:
                fn.keyed.stores.forget()  # their connections close before their files go
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
            if fn.config.cleanupSubscription and not self._hosted(fn.config.fqfn):
                self._link.remove_subscription(fn.config)
            self._delete_state_topics(fn.config)

        return then

    def _delete_state_topics(self, cfg: FunctionConfig) -> None:
        """A function created again under its name meanwhile has another stateId, so none of its topics."""
        prefix = state_topic(cfg.tenant, cfg.namespace, cfg.name, cfg.stateId, "")
        if self._state_topics is None:
            log.info(
                "deleted function %s: its state topics %s* stay on the broker (the worker has no "
                "--web-service-url; pulsar-admin topics delete them)",
                cfg.fqfn,
                prefix,
            )
            return
        try:
            deleted = self._state_topics.delete(cfg)
        except StateTopicsError as exc:
            log.warning("deleted function %s: its state topics %s* stay on the broker: %s", cfg.fqfn, prefix, exc)
            return
        log.info("deleted function %s: deleted its %d state topics %s*", cfg.fqfn, len(deleted), prefix)
