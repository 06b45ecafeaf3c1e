"""A worker joining its cluster: its membership (member.py) started, tried again while the broker does not open
the cluster's topics in time, and a one-line error when it never does.
"""

from __future__ import annotations

import logging

import pulsar

from pulsar_autoscale.functions.cluster.member import OPERATION_TIMEOUT_S, ClusterMember, ClusterSettings
from pulsar_autoscale.functions.model.errors import BrokerUnavailable
from pulsar_autoscale.functions.worker.worker import Worker
from pulsar_autoscale.pulsar_client import ClientSettings

log = logging.getLogger(__name__)
JOIN_TRIES = 3


def join(
    worker: Worker, url: str, settings: ClusterSettings, client: ClientSettings | str, tries: int = JOIN_TRIES
) -> ClusterMember:
    """The worker's membership, started. A broker that does not answer in time (OPERATION_TIMEOUT_S each, seen
    under CPU load; a hung broker refuses connections with ConnectError) is tried again; after `tries`, or on any other
    error from the client, a one-line error instead of a traceback from the client."""
    for attempt in range(1, tries + 1):
        try:
            return ClusterMember(worker, url, settings, client).start()
        except (pulsar.Timeout, pulsar.ConnectError) as exc:
            if attempt == tries:
                raise BrokerUnavailable(
                    f"cannot join cluster {settings.name}: the broker did not open its "
                    f"coordination topics in time ({tries} tries of {OPERATION_TIMEOUT_S} s; "
                    f"the last: {type(exc).__name__})"
                ) from None
            log.warning(
                "%s: the broker did not open the cluster's topics in time (%s); joining again (%d of %d)",
                worker.worker_id,
                type(exc).__name__,
                attempt + 1,
                tries,
            )
        except pulsar.PulsarException as exc:
            raise BrokerUnavailable(f"cannot join cluster {settings.name}: {type(exc).__name__}: {exc}") from None
    raise AssertionError("unreachable")
