"""CPU seconds of processes (Linux /proc), for benches that run a broker, workers or Spark as children."""

from __future__ import annotations

import os


def cpu_by_pid() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used so far: user + system) of every live process."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        out[int(pid)] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
    return out


def tree_cpu_seconds(root: int | None = None, include_root: bool = True) -> float:
    """CPU seconds (user + system) used so far by `root` (default: this process) and its live descendants;
    `include_root=False` leaves the root's own out (a bench's load generator)."""
    root = os.getpid() if root is None else root
    procs = cpu_by_pid()
    mine, grew = {root}, True
    while grew:
        new = {p for p, (pp, _) in procs.items() if pp in mine} - mine
        mine |= new
        grew = bool(new)
    return sum(procs[p][1] for p in mine if p in procs and (include_root or p != root))
