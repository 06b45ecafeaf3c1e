"""CPU seconds of a process tree (Linux /proc), for benches that run a broker, workers or Spark as children."""

from __future__ import annotations

import os


def tree_cpu_seconds(root: int | None = None, include_root: bool = True) -> float:
    """CPU seconds (user + system) used so far by `root` (default: this process) and its live descendants;
    `include_root=False` leaves the root's own out (a bench's load generator)."""
    root = os.getpid() if root is None else root
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parent[int(pid)], cpu[int(pid)] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
    mine, grew = {root}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in mine} - mine
        mine |= new
        grew = bool(new)
    return sum(cpu.get(p, 0.0) for p in mine if include_root or p != root)
