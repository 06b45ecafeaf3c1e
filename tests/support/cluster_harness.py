"""Worker processes of one cluster, started and killed by pid (tests and bench/cluster_scale.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import requests

from pulsar_autoscale.netutil import free_port
from tests.support.commands import worker_command


@dataclass
class WorkerProc:
    worker_id: str
    port: int
    proc: subprocess.Popen
    log_path: Path
    scheme: str = "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class WorkerCluster:
    """`n` worker processes joined to one cluster on one broker; use as a context manager."""

    service_url: str
    metrics_url: str
    base_dir: Path
    n: int = 3
    runtime: str = "thread"
    heartbeat_timeout_s: float = 2.5
    name: str = field(default_factory=lambda: f"c{uuid.uuid4().hex[:8]}")
    workers: list[WorkerProc] = field(default_factory=list)
    extra_args: tuple[str, ...] = ()
    cluster: bool = True  # False: plain single workers (no --cluster), today's one-machine default
    token: str | None = None  # the workers check tokens (extra_args): wait_ready's calls carry this one
    ca: str | None = None  # the workers serve HTTPS (extra_args: --tls-cert-file ...): URLs https, checked by it

    def add(self) -> WorkerProc:
        port = free_port()
        w = self._launch(f"w{len(self.workers)}-{port}", port)
        self.workers.append(w)
        return w

    def restart(self, w: WorkerProc) -> WorkerProc:
        """Start a stopped worker again as itself: its id, port and data dir (a machine back after a crash)."""
        assert not w.alive(), f"{w.worker_id} is still running"
        again = self._launch(w.worker_id, w.port)
        self.workers[self.workers.index(w)] = again
        return again

    def _launch(self, wid: str, port: int) -> WorkerProc:
        log_path = self.base_dir / f"{wid}.log"
        cmd = worker_command(
            self.service_url,
            self.metrics_url,
            str(port),
            str(self.base_dir / wid),
            "--worker-id",
            wid,
            "--runtime",
            self.runtime,
            *self.extra_args,
        )
        if self.cluster:
            cmd += ["--cluster", self.name, "--heartbeat-timeout", str(self.heartbeat_timeout_s)]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"}
            )
        return WorkerProc(wid, port, proc, log_path, "https" if self.ca else "http")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Every live worker answers and sees every other live worker."""
        deadline = time.monotonic() + timeout_s
        want = {w.worker_id for w in self.live()}
        last = None
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        while time.monotonic() < deadline:
            try:
                views = [
                    {
                        m["workerId"]
                        for m in requests.get(
                            w.url + "/admin/v2/worker/cluster", headers=headers, timeout=2, verify=self.ca or True
                        ).json()
                    }
                    for w in self.live()
                ]
                leader = requests.get(
                    self.live()[0].url + "/admin/v2/worker/cluster/leader", headers=headers, timeout=2, verify=self.ca or True
                )
                if all(v == want for v in views) and leader.status_code == 200:
                    return
                last = views
            except requests.RequestException as exc:
                last = exc
            for w in self.workers:
                if w.proc.poll() is not None and w in self.live():
                    raise AssertionError(f"worker {w.worker_id} exited: {w.log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        raise AssertionError(f"cluster {self.name} not formed within {timeout_s:.0f}s: {last}")

    def log_tails(self, lines: int = 80) -> str:
        """The end of every worker's log (a failed test shows them: CI keeps no temporary directory)."""
        return log_tails(self.base_dir, lines)

    def live(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.alive()]

    def placement(self, name: str) -> dict[int, str]:
        """instance id -> worker id of every running instance of public/default/`name`, as each live worker
        reports its own (surplus instances of a scale-in included)."""
        out: dict[int, str] = {}
        for w in self.live():
            try:
                resp = requests.get(
                    f"{w.url}/admin/v3/functions/public/default/{name}/status",
                    params={"scope": "local"},
                    timeout=3,
                    verify=self.ca or True,
                )
            except requests.RequestException:
                continue
            if resp.status_code == 200:
                out.update({int(i): w.worker_id for i, s in resp.json().items() if s["status"]["running"]})
        return out

    def spread(self, name: str, n: int) -> dict[int, str] | None:
        """The placement once instances 0..n-1 run on n different workers, else None."""
        placed = self.placement(name)
        return placed if sorted(placed) == list(range(n)) and len(set(placed.values())) == n else None

    def by_id(self, worker_id: str) -> WorkerProc:
        return next(w for w in self.workers if w.worker_id == worker_id)

    def kill(self, w: WorkerProc) -> None:
        """kill -9 of a worker this cluster started (by pid)."""
        os.kill(w.pid, signal.SIGKILL)
        w.proc.wait(10)

    def terminate(self, w: WorkerProc, timeout_s: float = 60.0) -> None:
        os.kill(w.pid, signal.SIGTERM)
        w.proc.wait(timeout_s)

    def __enter__(self) -> "WorkerCluster":
        try:
            for _ in range(self.n):
                self.add()
            if self.workers:  # n=0: the test adds them
                self.wait_ready()
        except BaseException as exc:  # no __exit__ for a failed __enter__: stop what was started
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    def __exit__(self, *exc) -> None:
        """Stop every worker; when a test failed inside the block, print their logs' ends (pytest shows a failed
        test's output), since CI keeps no temporary directory."""
        self._stop_all()
        if exc and isinstance(exc[1], Exception):
            print(self.log_tails())

    def _stop_all(self) -> None:
        for w in self.workers:
            if w.alive():
                w.proc.send_signal(signal.SIGTERM)
        for w in self.workers:
            try:
                w.proc.wait(30)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(5)


def key_counts(cluster: WorkerCluster, name: str, keys: int) -> dict[str, int]:
    """Each key's counter (keys k0..k{keys-1}), from whichever live worker holds its key group: the one copy
    a keyed function's state has, read as an operator would, through any worker."""
    from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin

    out = {}
    for k in range(keys):
        out[f"k{k}"] = 0
        for w in cluster.live():
            try:
                out[f"k{k}"] = FunctionsAdmin(w.url).get_state("public", "default", name, f"k{k}")["numberValue"]
                break
            except (AdminError, requests.RequestException):  # another worker holds the key, or this one starts
                continue
    return out


def log_tails(log_dir: Path, lines: int = 80) -> str:
    """The end of every `*.log` in `log_dir`, each under its name."""
    return "\n".join(
        f"==== {p.name} (last {lines} lines)\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:])
        for p in sorted(log_dir.glob("*.log"))
    )
