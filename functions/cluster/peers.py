"""Asking the other workers of the cluster, over their admin API with `?scope=local` so that each answers
for its own instances: the status and stats of instances that run elsewhere, and the state of keys whose
group another worker holds."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields
from typing import Callable
from urllib.parse import quote

import requests

from pulsar_autoscale.functions.cluster.membership import MembershipManager
from pulsar_autoscale.snapshot import FunctionCounters

PROXY_TIMEOUT_S = 2.0
MISDIRECTED = 421  # a scope=local state call to a worker that holds no instance of the key's group


class Peers:
    def __init__(self, membership: MembershipManager, me: str, http: requests.Session):
        self.membership, self.me = membership, me
        self._http = http  # with this worker's own credentials and trust

    def state_elsewhere(self, fqfn: str, key: str, state: str | None, write_here: bool = False) -> requests.Response | None:
        """querystate (state None) or putstate of a key that no group here has: the answer of the live worker that
        has it (a function may write a state key in another message key's group), each asked with scope=local so
        that it answers for itself (421: it holds no instance of the key's group). A write of a key that no
        worker has goes to its own group's worker, unless that is this one (`write_here`: None, write locally).
        A read's 404 comes from the key's own group's worker; None: no worker holds that group (moving between
        owners, or restoring after its worker died)."""
        path = f"/admin/v3/functions/{fqfn}/state/{quote(key, safe='')}"
        others = [m for m in self.membership.alive() if m.worker_id != self.me]
        missing = None
        for m in others:
            resp = self._call(m.url + path, None)
            if resp is None or resp.status_code == MISDIRECTED:
                continue
            if resp.status_code == 404:
                missing = missing or resp
                continue
            return resp if state is None or resp.status_code != 200 else self._call(m.url + path, state)
        if state is None:
            return missing
        if write_here:
            return None
        answers = (self._call(m.url + path, state) for m in others)
        return next((r for r in answers if r is not None and r.status_code != MISDIRECTED), None)

    def _call(self, url: str, state: str | None) -> requests.Response | None:
        """A scope=local call to another worker (a GET, or the POST of a putstate); None when it cannot be reached."""
        files = None if state is None else {"state": (None, state, "application/json")}
        try:
            return self._http.request(
                "GET" if state is None else "POST", url, params={"scope": "local"}, files=files, timeout=PROXY_TIMEOUT_S
            )
        except requests.RequestException:
            return None

    def _remote(self, url: str, path: str) -> object | None:
        resp = self._call(url + path, None)
        return resp.json() if resp is not None and resp.status_code == 200 else None

    def gather(self, fqfn: str, suffix: str, local: Callable[[str], object], worker_ids: set[str]) -> dict[str, object]:
        """What each worker says about its own instances of fqfn (ourselves directly, others over HTTP)."""
        members = {m.worker_id: m for m in self.membership.alive()}
        path = f"/admin/v3/functions/{fqfn}/{suffix}"
        remote = [w for w in worker_ids if w != self.me and w in members]
        with ThreadPoolExecutor(max_workers=max(len(remote), 1)) as pool:
            futures = {w: pool.submit(self._remote, members[w].url, path) for w in remote}
            out = {w: f.result() for w, f in futures.items()}
        if self.me in worker_ids:
            out[self.me] = local(fqfn)
        return out


def merge_stats(views: list[dict], owned: set[int]) -> dict:
    """One FunctionStats body from each worker's view of its own instances."""
    keys = ("receivedTotal", "processedSuccessfullyTotal", "systemExceptionsTotal", "userExceptionsTotal")

    def block(parts: list[dict]) -> dict:
        out = {k: sum((p.get(k) or 0) for p in parts) for k in keys}
        done = out["processedSuccessfullyTotal"]
        busy = sum((p.get("avgProcessLatency") or 0) * (p.get("processedSuccessfullyTotal") or 0) for p in parts)
        out["avgProcessLatency"] = (busy / done) if done else None
        return out

    counter_names = [f.name for f in fields(FunctionCounters) if f.name not in ("time", "arrived")]
    totals = {n: sum(v["autoscale"]["counters"][n] or 0 for v in views) for n in counter_names}
    counters = FunctionCounters(
        time=max((v["autoscale"]["counters"]["time"] for v in views), default=time.time()), arrived=None, **totals
    )
    instances = sorted(
        (inst for v in views for inst in v.get("instances", []) if inst["instanceId"] in owned),
        key=lambda inst: inst["instanceId"],
    )
    first: dict[int, dict] = {}  # an instance two workers report (a hand-off under way) counts once
    for inst in instances:
        first.setdefault(inst["instanceId"], inst)
    return {
        **block(views),
        "1min": block([v["1min"] for v in views]),
        "lastInvocation": max((v.get("lastInvocation") or 0 for v in views), default=0),
        "instances": list(first.values()),
        "autoscale": {"counters": asdict(counters)},
    }
