"""A worker cluster has room for so many instances: decisions beyond it are capped, and say so.

Our worker cluster reports each worker's capacity (`/admin/v2/worker/cluster`) and where every
instance runs (`/admin/v2/worker/assignments`). A single worker and stock Pulsar report no
capacity: nothing is capped there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.controller.planner import Decision


@dataclass(frozen=True)
class ClusterCapacity:
    total: int  # instances the live workers accept
    in_use: int  # instances placed now, every function of the cluster
    workers: int


def cluster_capacity(admin) -> ClusterCapacity | None:
    """None when the admin API does not report capacities (one worker, stock Pulsar) or cannot be read."""
    if not hasattr(admin, "assignments") or not hasattr(admin, "cluster"):
        return None
    try:
        members, placed = admin.cluster(), admin.assignments()
    except AdminError:
        return None
    caps = [m.get("capacity") for m in members] if isinstance(members, list) else []
    if not caps or any(not isinstance(c, int) for c in caps):
        return None
    return ClusterCapacity(sum(caps), sum(len(v) for v in placed.values()), len(caps))


def cap_to_capacity(decisions: list[Decision], capacity: ClusterCapacity | None) -> list[Decision]:
    """Scale-outs share what is free, in decision order; a scale-in frees room only once it has drained,
    so it is not counted here."""
    if capacity is None:
        return decisions
    free = max(capacity.total - capacity.in_use, 0)
    out = []
    for d in decisions:
        grow = d.new - d.old
        if grow > free:
            new = d.old + free
            d = replace(
                d,
                new=new,
                reason=f"{d.reason}; cluster capacity: {capacity.total} instances on "
                f"{capacity.workers} workers, {capacity.in_use} in use: capped at {new}",
            )
        free -= max(d.new - d.old, 0)
        out.append(d)
    return out
