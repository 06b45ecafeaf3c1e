"""Execute: PUT the new parallelism of each function that changes, with bounded retries.

Every call carries the leader's epoch; our worker refuses an older epoch (409), which ends
the attempt at once: retrying cannot make a deposed leader right.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pulsar_autoscale.admin.api import FunctionsApi
from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.admin.http_auth import AuthError, RedirectRefused

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Execution:
    function: str
    parallelism: int  # for a burst: the messages asked
    ok: bool
    attempts: int
    error: str | None = None
    seconds: float = 0.0
    started: bool | None = None  # for a burst: False when the worker was still running one
    in_force: bool = False  # the function was at that parallelism already: nothing changed


class Executor:
    def __init__(self, admin: FunctionsApi, retries: int = 3, backoff_s: float = 0.5):
        self.admin = admin
        self.retries = retries
        self.backoff_s = backoff_s

    def apply(self, function: str, parallelism: int, epoch: int | None) -> Execution:
        tenant, namespace, name = function.split("/")
        start = time.monotonic()
        error = None
        for attempt in range(1, self.retries + 1):
            try:
                self.admin.set_parallelism(tenant, namespace, name, parallelism, epoch=epoch)
                return Execution(function, parallelism, True, attempt, seconds=time.monotonic() - start)
            except (AuthError, RedirectRefused) as exc:
                error = str(exc)
                break  # credentials or a foreign redirect: retrying cannot help
            except AdminError as exc:
                if exc.no_change:
                    # Pulsar's answer when it is at that parallelism already (the wake watcher and the period
                    # both woke it): what was decided holds, and this call changed nothing
                    return Execution(function, parallelism, True, attempt, seconds=time.monotonic() - start, in_force=True)
                error = str(exc)
                if exc.status is not None and 400 <= exc.status < 500 and exc.status != 429:
                    break  # the request itself is wrong (or the epoch stale): retrying cannot help
                log.warning("scaling %s to %d failed (attempt %d/%d): %s", function, parallelism, attempt, self.retries, exc)
                time.sleep(self.backoff_s * attempt)
        return Execution(function, parallelism, False, attempt, error, time.monotonic() - start)

    def burst(self, function: str, messages: int, partitions: int, threads: int, epoch: int | None) -> Execution:
        """One attempt, never retried: a drain whose answer was lost may have started, and a second
        one would take a slice the first was sized for."""
        tenant, namespace, name = function.split("/")
        start = time.monotonic()
        try:
            answer = self.admin.burst(tenant, namespace, name, messages, partitions, threads, epoch=epoch)
            return Execution(function, messages, True, 1, seconds=time.monotonic() - start, started=bool(answer.get("started")))
        except (AdminError, AuthError, RedirectRefused) as exc:
            return Execution(function, messages, False, 1, str(exc), time.monotonic() - start)
