"""Which process uses the CPU when: a timeline of per-process CPU, sampled while another bench runs.

`record` samples every 0.1 s, for `--seconds`, the CPU of the processes a keyed-state bench starts: the
pulsar-lite broker, its relay (pulsar_autoscale.broker.relay), the workers (`pulsar_autoscale.cli.main worker`,
named by their port) and the load generator and bench (`python -c`, bench/*.py); one JSON line per sample.
`score` reads it with the `--arrivals` file of bench/state_migration.py and prints, per live change, the
cores each process used in the steady period before it and in each quarter second after the PUT, workers
named by the instances the change's placement gives them (w-i0 hosts instance 0 and the front).

    .venv/bin/python bench/cpu_timeline.py record FILE --seconds 600 &
    .venv/bin/python bench/state_migration.py --workers 3 --state-mb 50 --cycles 2 --arrivals ARRIVALS
    .venv/bin/python bench/cpu_timeline.py score FILE --arrivals ARRIVALS
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_cpu import cpu_by_pid  # noqa: E402

PERIOD_S = 0.1


def _label(pid: int) -> str | None:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    if "broker.relay" in cmd:
        return "relay"
    if "pulsar_lite/bin" in cmd:
        return "lite"
    if "pulsar_autoscale.cli.main worker" in cmd:
        return "worker:" + cmd.split("--port ", 1)[1].split()[0] if "--port " in cmd else "worker"
    if "bench/" in cmd or "python -c" in cmd:
        return "bench"
    return None


def record(path: str, seconds: float) -> None:
    labels: dict[int, str | None] = {}
    last: dict[int, float] = {}
    end = time.monotonic() + seconds
    with open(path, "w") as out:
        while time.monotonic() < end:
            now = time.time()
            row: dict = {"t": now}
            for pid, (_parent, cpu) in cpu_by_pid().items():
                if pid not in labels:
                    labels[pid] = _label(pid)
                if labels[pid] is None:
                    continue
                if pid in last:
                    row[f"{labels[pid]}:{pid}"] = round(cpu - last[pid], 3)
                last[pid] = cpu
            out.write(json.dumps(row) + "\n")
            out.flush()
            time.sleep(max(PERIOD_S - (time.time() - now), 0))


def score(path: str, arrivals: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    live = [c for c in json.load(open(arrivals))["changes"] if c["mode"] == "live"]
    instance_of = {w.rsplit("-", 1)[1]: f"w-i{i}" for c in live for i, w in c["placement"].items()}

    def cores(t0: float, t1: float) -> dict[str, float]:
        total, n = collections.Counter(), 0
        for row in rows:
            if t0 <= row["t"] < t1:
                n += 1
                for key, cpu in row.items():
                    if key != "t":
                        name = key.rsplit(":", 1)[0]
                        total[instance_of.get(name.split(":")[-1], name)] += cpu
        out = {k: round(v / (n * PERIOD_S), 2) for k, v in sorted(total.items())} if n else {}
        return {**out, "all": round(sum(out.values()), 2)}

    report = []
    for c in live:
        put, done = c["t_put"] / 1000, c["t_done"] / 1000
        report.append(
            {
                "change": c["change"],
                "duration_s": c["duration_s"],
                "steady_before": cores(put - 8, put - 0.5),
                "after_put_by_quarter_second": {
                    f"+{q / 4:.2f}": cores(put + q / 4, put + (q + 1) / 4) for q in range(int((done - put) * 4) + 1)
                },
            }
        )
    print(json.dumps(report, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="sample per-process CPU into FILE")
    rec.add_argument("file")
    rec.add_argument("--seconds", type=float, default=600.0)
    sc = sub.add_parser("score", help="cores per process around each live change")
    sc.add_argument("file")
    sc.add_argument("--arrivals", required=True, help="bench/state_migration.py --arrivals FILE")
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.file, args.seconds)
    else:
        score(args.file, args.arrivals)


if __name__ == "__main__":
    main()
