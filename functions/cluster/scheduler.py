"""Placement of function instances on workers: pure functions, no I/O, no clocks.

A parallelism change stays a diff: every instance that still exists keeps its worker; only
instances without one (new ids, or ids whose worker died or is leaving) are placed. Scaling in
removes the highest ids. Nothing moves when a worker joins; `rebalance` moves the fewest
instances that even out the counts.
"""

from __future__ import annotations

from dataclasses import dataclass

# fqfn -> instance id -> worker id
Assignment = dict[str, dict[int, str]]
POLICIES = ("round-robin", "least-loaded")


@dataclass(frozen=True)
class WorkerLoad:
    worker_id: str
    capacity: int  # instances this worker accepts
    busy_rate: float = 0.0  # measured busy seconds per second of its instances


def counts(assignment: Assignment) -> dict[str, int]:
    out: dict[str, int] = {}
    for placed in assignment.values():
        for wid in placed.values():
            out[wid] = out.get(wid, 0) + 1
    return out


def schedule(
    current: Assignment, parallelism: dict[str, int], workers: list[WorkerLoad], policy: str = "round-robin"
) -> tuple[Assignment, int]:
    """The next assignment and how many instances found no worker (the cluster is full).

    round-robin is Apache Pulsar's default: each instance goes to the worker with the fewest
    instances. least-loaded goes by measured busy time: each instance goes to the worker with
    the lowest busy rate, counting what this pass already placed there at the cluster's mean
    busy rate per instance (so one pass does not pile everything on the idlest worker).
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown scheduler policy {policy!r}: use one of {', '.join(POLICIES)}")
    eligible = {w.worker_id: w for w in workers}
    nxt: Assignment = {}
    for fqfn, p in sorted(parallelism.items()):
        old = current.get(fqfn, {})
        nxt[fqfn] = {i: wid for i, wid in old.items() if i < p and wid in eligible}
    load = counts(nxt)
    total_busy = sum(w.busy_rate for w in workers)
    per_instance = total_busy / max(sum(load.values()), 1) or 1.0
    added: dict[str, int] = {}
    unplaced = 0
    for fqfn, p in sorted(parallelism.items()):
        for i in range(p):
            if i in nxt[fqfn]:
                continue
            free = [w for w in eligible.values() if load.get(w.worker_id, 0) < w.capacity]
            if not free:
                unplaced += 1
                continue
            if policy == "round-robin":
                best = min(free, key=lambda w: (load.get(w.worker_id, 0), w.worker_id))
            else:
                best = min(
                    free,
                    key=lambda w: (w.busy_rate + added.get(w.worker_id, 0) * per_instance, load.get(w.worker_id, 0), w.worker_id),
                )
            nxt[fqfn][i] = best.worker_id
            load[best.worker_id] = load.get(best.worker_id, 0) + 1
            added[best.worker_id] = added.get(best.worker_id, 0) + 1
    return nxt, unplaced


def rebalance(current: Assignment, workers: list[WorkerLoad], pinned: frozenset[str] = frozenset()) -> Assignment:
    """Even out instance counts (within capacity) by moving as few instances as possible; `pinned`
    functions' instances (keyedState: a move hands their key groups over) stay where they are."""
    if not workers:
        return current
    nxt = {fqfn: dict(placed) for fqfn, placed in current.items()}
    load = {w.worker_id: 0 for w in workers} | counts(nxt)
    cap = {w.worker_id: w.capacity for w in workers}
    while True:
        src = max(load, key=lambda wid: (load[wid], wid))
        dst = min((wid for wid in cap if load[wid] < cap[wid]), key=lambda wid: (load[wid], wid), default=None)
        if dst is None or load[src] - load[dst] <= 1:
            return nxt
        movable = [(f, i) for f, placed in nxt.items() if f not in pinned for i, wid in placed.items() if wid == src]
        if not movable:
            return nxt
        fqfn, i = max(movable)
        nxt[fqfn][i] = dst
        load[src] -= 1
        load[dst] += 1


def capacity(workers: list[WorkerLoad]) -> int:
    return sum(w.capacity for w in workers)
