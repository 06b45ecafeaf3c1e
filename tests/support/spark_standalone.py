"""A Spark standalone cluster from pyspark's pip package, for tests: a master and N workers on
free loopback ports, each process started here and stopped by its pid (and its process group,
which holds the executors a worker launched)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from pulsar_autoscale.netutil import free_port

HOST = "127.0.0.1"


def spark_env(work: Path) -> dict:
    """Loopback only, logs and scratch under `work`."""
    return {
        **os.environ,
        "SPARK_LOCAL_IP": HOST,
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_WORKER_DIR": str(work / "work"),
        "SPARK_NO_DAEMONIZE": "1",
    }


class StandaloneSpark:
    def __init__(self, work: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        import pyspark

        self.spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
        self.work, self.workers, self.cores, self.memory = Path(work), workers, cores, memory
        self.port, self.web_port = free_port(HOST), free_port(HOST)
        self.procs: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def _launch(self, name: str, *args: str) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        log = open(self.work / f"{name}.log", "w")
        self.procs.append(
            subprocess.Popen(
                [self.spark_class, *args], env=spark_env(self.work), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def state(self) -> dict:
        """The master's view (its web UI's /json/): workers, cores used, applications."""
        with urllib.request.urlopen(f"http://{HOST}:{self.web_port}/json/", timeout=5) as resp:
            return json.load(resp)

    def start(self, timeout_s: float = 240) -> "StandaloneSpark":
        self._launch(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--webui-port",
            str(self.web_port),
        )
        for i in range(self.workers):
            self._launch(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host",
                HOST,
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--webui-port",
                str(free_port(HOST)),
                "--work-dir",
                str(self.work / f"work{i}"),
            )
        deadline = time.monotonic() + timeout_s
        alive = 0
        while time.monotonic() < deadline:
            dead = [p.args[1] for p in self.procs if p.poll() is not None]
            if dead:
                self.stop()
                raise RuntimeError(f"spark {dead} exited; logs in {self.work}")
            try:
                alive = self.state().get("aliveworkers", 0)
            except OSError:
                alive = 0
            if alive >= self.workers:
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{alive} of {self.workers} Spark workers registered within {timeout_s:.0f}s; logs in {self.work}")

    def stop(self) -> None:
        for p in reversed(self.procs):  # workers first: each takes its executors down
            if p.poll() is None:
                p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            try:  # an executor a killed worker left behind, in the worker's process group
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.procs.clear()

    def __enter__(self) -> "StandaloneSpark":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
