"""The isolation, bad-input and status scenarios against a real worker and pulsar-lite, with the
worker's default bounds (validation 30 s, drain 30 s, stall 30 s). Prints one JSON object:
each scenario's status code and timings (docs/reliability.md).

    python bench/isolation_scenarios.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pulsar
import requests

from pulsar_autoscale.broker.embedded import EmbeddedBroker
from pulsar_autoscale.functions.api.server import WorkerServer

EXAMPLES = Path(__file__).resolve().parents[1] / "functions" / "examples"
EXCLAIM = (EXAMPLES / "exclaim.py").read_bytes()
HANGS = (
    "import threading\nfrom pulsar import Function\n\nclass Hang(Function):\n"
    "    def process(self, input, context):\n        threading.Event().wait()\n"
)
EXITS = "import os\nos._exit(1)\n"


def fn_url(w, name, suffix=""):
    return f"{w.url}/admin/v3/functions/public/default/{name}{suffix}"


def send(w, method, name, cfg=None, code=None, **kw):
    files = {"functionConfig": (None, json.dumps(cfg or {}))}
    if code is not None:
        files["data"] = code
    started = time.monotonic()
    resp = requests.request(method, fn_url(w, name), files=files, timeout=120, **kw)
    return resp, round(time.monotonic() - started, 3)


def cfg(name, cls, **extra):
    return {"className": cls, "inputs": [f"{name}-in"], **extra}


def wait(pred, timeout_s):
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        value = pred()
        if value:
            return round(time.monotonic() - started, 2), value
        time.sleep(0.1)
    return None, None


def status(w, name):
    return requests.get(fn_url(w, name, "/status"), timeout=10).json()


def scenarios(w, client, data_dir) -> dict:
    out = {}
    r, _ = send(w, "POST", "exits", cfg("exits", "exits.F"), ("exits.py", EXITS))
    out["create_os_exit_at_import"] = {
        "code": r.status_code,
        "reason": r.json()["reason"],
        "healthz": requests.get(w.url + "/healthz", timeout=5).status_code,
        "left_behind": (Path(data_dir) / "functions/public/default/exits").exists(),
    }
    send(w, "POST", "good", cfg("good", "exclaim.Exclaim"), ("exclaim.py", EXCLAIM))
    code_path = Path(w.worker._functions["public/default/good"].code_path)
    r1, _ = send(w, "PUT", "good", {}, ("exclaim.py", "def broken(:\n"))
    r2, _ = send(w, "PUT", "good", {}, ("exclaim.py", EXITS))
    out["update_refused_keeps_code"] = {
        "syntax_error_code": r1.status_code,
        "os_exit_code": r2.status_code,
        "code_unchanged": code_path.read_bytes() == EXCLAIM,
    }

    # A 20 s import: the create waits for its child; the API answers meanwhile.
    latencies, done = [], threading.Event()

    def poll():
        while not done.is_set():
            t = time.monotonic()
            requests.get(w.url + "/healthz", timeout=30)
            latencies.append(time.monotonic() - t)
            time.sleep(0.2)

    poller = threading.Thread(target=poll)
    poller.start()
    r, took = send(
        w, "POST", "slow", cfg("slow", "slow.f"), ("slow.py", "import time\ntime.sleep(20)\n\ndef f(x):\n    return x\n")
    )
    done.set()
    poller.join()
    out["import_sleeps_20s"] = {
        "code": r.status_code,
        "create_s": took,
        "healthz_polls": len(latencies),
        "healthz_max_s": round(max(latencies), 3),
    }

    # process() that never returns, thread and process runtimes.
    for runtime in ("thread", "process"):
        name = f"hang-{runtime}"
        send(w, "POST", name, cfg(name, "hang.Hang", parallelism=2, instanceRuntime=runtime), ("hang.py", HANGS))
        wait(lambda: status(w, name)["numRunning"] == 2, 30)
        p = client.create_producer(f"persistent://public/default/{name}-in")
        for _ in range(4):
            p.send(b"x")
        p.close()
        busy_s, _ = wait(
            lambda: any(f.stalled_since_ms for f in w.worker.instance_figures(f"public/default/{name}")[1].values()), 30
        )
        r_scale, scale_s = send(w, "PUT", name, {"parallelism": 1})
        other_created = send(w, "POST", f"other-{runtime}", cfg(f"other-{runtime}", "exclaim.Exclaim"), ("exclaim.py", EXCLAIM))
        stalled_s, st = wait(lambda: (s := status(w, name))["numRunning"] == 0 and s, 40)
        abandoned_s, _ = wait(lambda: status(w, name)["autoscale"]["abandonedInstances"] == 1, 40)
        t = time.monotonic()
        r_del = requests.delete(fn_url(w, name), timeout=120)
        out[f"process_never_returns_{runtime}"] = {
            "busy_seen_s": busy_s,
            "scale_in_code": r_scale.status_code,
            "scale_in_s": scale_s,
            "other_function_create": [other_created[0].status_code, other_created[1]],
            "stalled_status_after_s": stalled_s,
            "stalled_error": st["instances"][0]["status"]["error"][:60] if st else None,
            "abandoned_after_s": abandoned_s,
            "delete_code": r_del.status_code,
            "delete_s": round(time.monotonic() - t, 3),
        }

    bad = {}
    for case, c, code in [
        ("os_system", {"className": "os.system", "inputs": ["a"]}, None),
        ("etc_passwd", {"className": "passwd.x", "inputs": ["a"], "py": "/etc/passwd"}, None),
        ("imported_builtin", {"className": "evil.system", "inputs": ["a"]}, ("evil.py", "from os import system\n")),
    ]:
        r, _ = send(w, "POST", case.replace("_", "-"), c, code)
        bad[case] = [r.status_code, r.json()["reason"][:90]]
    for case, body in [("json_array", "[1]"), ("json_null", "null")]:
        r = requests.post(fn_url(w, "body"), data=body, headers={"Content-Type": "application/json"}, timeout=10)
        bad[case] = [r.status_code, r.json()["reason"][:90]]
    for case, method, path in [
        ("name_256", "POST", "/admin/v3/functions/public/default/" + "n" * 256),
        ("unknown_tenant_list", "GET", "/admin/v3/functions/nosuch/ns"),
        ("unknown_tenant_status", "GET", "/admin/v3/functions/nosuch/ns/f/status"),
        ("instance_minus_1", "GET", "/admin/v3/functions/public/default/good/-1/status"),
        ("instance_99", "GET", "/admin/v3/functions/public/default/good/99/status"),
        ("wrong_method", "PATCH", "/admin/v3/functions/public/default/good"),
    ]:
        files = (
            {"functionConfig": (None, json.dumps(cfg("x", "exclaim.Exclaim"))), "data": ("exclaim.py", EXCLAIM)}
            if method == "POST"
            else None
        )
        r = requests.request(method, w.url + path, files=files, timeout=10)
        bad[case] = [r.status_code, r.text[:90]]
    out["bad_input"] = bad
    return out


def broker_outage(tmp: str) -> dict:
    b = EmbeddedBroker(data_dir=f"{tmp}/outage-broker").start()
    try:
        with WorkerServer(b.service_url, data_dir=f"{tmp}/outage-worker", metrics_url=b.metrics_url) as w:
            send(w, "POST", "o", cfg("o", "exclaim.Exclaim"), ("exclaim.py", EXCLAIM))
            wait(lambda: status(w, "o")["numRunning"] == 1, 30)
            os.kill(b._proc.pid, signal.SIGKILL)
            b._proc.wait(10)
            down_s, st = wait(lambda: (s := status(w, "o"))["numRunning"] == 0 and s, 30)
            b.stop()  # its relay (pulsar_autoscale.broker.relay) still holds the port
            b = EmbeddedBroker(port=b.port, metrics_port=b.metrics_port, data_dir=b.data_dir).start()
            up_s, _ = wait(lambda: status(w, "o")["numRunning"] == 1, 90)
            return {
                "running_false_after_s": down_s,
                "error": st["instances"][0]["status"]["error"] if st else None,
                "running_true_after_restart_s": up_s,
            }
    finally:
        b.stop()


def restart_after_bad_update(service_url: str, metrics_url: str, tmp: str) -> dict:
    data = f"{tmp}/restart-worker"
    with WorkerServer(service_url, data_dir=data, metrics_url=metrics_url) as w:
        send(w, "POST", "r", cfg("r", "exclaim.Exclaim"), ("exclaim.py", EXCLAIM))
        code = send(w, "PUT", "r", {}, ("exclaim.py", EXITS))[0].status_code
    t = time.monotonic()
    with WorkerServer(service_url, data_dir=data, metrics_url=metrics_url) as w:
        running_s, _ = wait(lambda: status(w, "r")["numRunning"] == 1, 30)
        return {
            "bad_update_code": code,
            "worker_started_s": round(time.monotonic() - t - (running_s or 0), 2),
            "running_after_s": running_s,
        }


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()  # --help, and no stray options
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(data_dir=f"{tmp}/broker") as broker:
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
        with WorkerServer(broker.service_url, data_dir=f"{tmp}/worker", metrics_url=broker.metrics_url) as w:
            result = scenarios(w, client, f"{tmp}/worker")
        client.close()
        result["restart_after_os_exit_update"] = restart_after_bad_update(broker.service_url, broker.metrics_url, tmp)
        result["broker_kill_9"] = broker_outage(tmp)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
