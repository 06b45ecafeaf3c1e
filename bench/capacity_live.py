"""The capacity estimator on a live worker, against an analytic answer: a one-function app (sleepy.py, a fixed
service time, thread runtime) whose capacity is parallelism / service time. Prints JSON: per parallelism, the
measured MST, the analytic capacity, their ratio, the bisection's steps and its time.

A throughput measurement on a shared machine is a benchmark, not a test: run it on a quiet machine.

    python3 bench/capacity_live.py [--service-ms 20] [--parallelism 1,2] [--out bench/results/capacity_live.json]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from report import emit  # bench/report.py (bench/ is the script's directory)

from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.planning.liveapps import sleepy_app
from pulsar_autoscale.planning.livebed import LiveTestbed, analytic_capacity
from pulsar_autoscale.planning.mst import MstSettings, measure_mst
from pulsar_autoscale.planning.testbed import Phases, TestConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--service-ms", type=float, default=20.0)
    ap.add_argument("--parallelism", default="1,2", help="comma-separated parallelisms to measure")
    ap.add_argument("--observe-s", type=float, default=8.0)
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    settings = MstSettings(
        warmup_s=6.0, phases=Phases(cooldown_s=2.0, ramp_s=3.0, observe_s=args.observe_s), step=0.03, bracket=0.1
    )
    results = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedBroker(data_dir=str(Path(tmp, "broker"))) as broker,
        WorkerServer(broker.service_url, data_dir=str(Path(tmp, "worker")), metrics_url=broker.metrics_url) as w,
    ):
        tb = LiveTestbed(sleepy_app(args.service_ms), w.url, broker.service_url, broker.metrics_url, max_rate=400.0)
        try:
            for k in (int(x) for x in args.parallelism.split(",")):
                started = time.monotonic()
                res = measure_mst(tb, TestConfig({"sleepy": k}), settings)
                expected = analytic_capacity(args.service_ms, k)
                results.append(
                    {
                        "parallelism": k,
                        "mst_per_s": round(res.mst, 1),
                        "analytic_per_s": expected,
                        "mst_over_analytic": round(res.mst / expected, 3),
                        "steps": res.runs,
                        "all_valid": all(s.valid for s in res.steps),
                        "producer_bound": res.producer_bound,
                        "seconds": round(time.monotonic() - started, 1),
                        "trace": [[round(s.rate, 1), s.passed, s.reason] for s in res.steps],
                    }
                )
        finally:
            tb.close()
    emit({"service_ms": args.service_ms, "results": results}, args.out)


if __name__ == "__main__":
    main()
