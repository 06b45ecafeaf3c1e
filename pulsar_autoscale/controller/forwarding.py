"""`autoscaler why` asked of a replica that does not lead: a replica logs only the terms it led, so the
leader's records are fetched from it and merged with this replica's own."""

from __future__ import annotations

import pulsar
import requests

from pulsar_autoscale.admin.http_auth import cluster_session, host_port
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.leader import LeaderElector
from pulsar_autoscale.security.redact import redact_url


def with_leader(
    own: list[dict], fn: str, limit: int, elector: LeaderElector, config: ControllerConfig
) -> tuple[list[dict], str | None]:
    """`own` merged with the leader's records, fetched from the URL the leader advertised with its term, if
    that URL is one of the configured peers, with this controller's own credentials (the caller's never leave
    this replica). The second value says why only this replica's records could be given, else None."""
    if elector.is_leader():
        return own, None
    try:
        term = elector.latest()
    except pulsar.PulsarException as exc:
        return own, f"the broker did not say who leads ({exc}): this replica's records only"
    if term is None or term.holder == elector.identity or not term.url:
        return own, None
    if host_port(term.url) not in {host_port(u) for u in config.peers}:
        return own, (
            f"the leader {term.holder} advertises {term.url}, which is not one of this controller's "
            f"peers: this replica's records only"
        )
    try:
        session = cluster_session(config.peers, config.auth, timeout_s=5)
        resp = session.get(f"{term.url}/autoscaler/functions/{fn}/why", params={"limit": limit})
        resp.raise_for_status()
        theirs = resp.json()
    except (requests.RequestException, ValueError) as exc:
        return own, (
            f"the leader {term.holder} at {term.url} did not answer ({redact_url(str(exc))}): this replica's records only"
        )
    merged = {(r["time"], r["controller"], r.get("kind")): r for r in own + theirs}
    return sorted(merged.values(), key=lambda r: r["time"])[-limit:], None
