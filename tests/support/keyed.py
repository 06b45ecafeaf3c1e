"""The keyed count (functions/examples/keyed_count.py) in the scenarios several test modules share: a worker
process restarted in place, the counts the function's state holds, a keyed load, the admin calls that create,
wait for and check it, and a cluster's view of its key groups while they move."""

from __future__ import annotations

import subprocess
import uuid
from contextlib import contextmanager
from pathlib import Path

import requests

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from pulsar_autoscale.netutil import free_port
from tests.support.cluster_harness import WorkerCluster, log_tails
from tests.support.commands import worker_command
from tests.support.scenario import KEYED_COUNT, keyed_count, keyed_settled, start_keyed_load, wait_until

# Subscales of 1 group, each followed by a pause 3x as long as it took (a duty of 25%): a migration of 42 groups goes
# on for 15 s and more, long enough for a test to act in its middle, short enough not to hold the test after that
PACED = '{"keyedMigration": {"subscaleSize": 1, "duty": 0.25}}'
LOAD_KEYS, LOAD_RECORDS, LOAD_RATE = 30, 3000, 100.0  # keyed_load: up to 100 rounds of 30 keys, 100 records/s
PER_KEY_KEYS = 12  # send_per_key: over 128 groups, every instance of 2 or 3 owns some of them


class WorkerProcess:
    """`pulsar-autoscale worker` on a fixed port and data dir, restarted in place."""

    def __init__(self, broker, data_dir: Path):
        self.broker, self.data_dir, self.port = broker, data_dir, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.data_dir / "worker.log", "ab")
        self.proc = subprocess.Popen(
            worker_command(
                self.broker.service_url,
                self.broker.metrics_url,
                str(self.port),
                str(self.data_dir / "data"),
                "--broker-kind",
                "pulsar-lite",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        wait_until(self._healthy, 60, f"worker on {self.url} to answer")

    def __enter__(self) -> "WorkerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop(kill=False)

    def _healthy(self) -> bool:
        try:
            return requests.get(self.url + "/healthz", timeout=0.5).ok
        except requests.RequestException:
            return False

    def stop(self, kill: bool) -> None:
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(60)


def state_counts(admin: FunctionsAdmin, name: str, keys: int, prefix: str = "k") -> dict[str, int]:
    """Each key's counter as the function's state has it (a key not counted yet: 0)."""
    out = {}
    for k in range(keys):
        try:
            out[f"{prefix}{k}"] = admin.get_state("public", "default", name, f"{prefix}{k}")["numberValue"]
        except AdminError:
            out[f"{prefix}{k}"] = 0
    return out


@contextmanager
def keyed_load(broker, src: str):
    """Up to LOAD_RECORDS records over LOAD_KEYS keys at LOAD_RATE from a producer process (`finish` ends it once
    the test's changes are made), killed if the test leaves early."""
    producer = start_keyed_load(broker.service_url, src, LOAD_RECORDS, LOAD_KEYS, LOAD_RATE, batched=True)
    try:
        yield producer
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()


def send_per_key(client, topic: str, per_key: int, keys: int = PER_KEY_KEYS) -> None:
    producer = client.create_producer(topic)
    for i in range(per_key * keys):
        producer.send(b"x", partition_key=f"k{i % keys}")
    producer.close()


def expect_per_key(
    admin: FunctionsAdmin, name: str, per_key: int, why: str, keys: int = PER_KEY_KEYS, timeout_s: float = 60
) -> None:
    want = {f"k{k}": per_key for k in range(keys)}
    wait_until(
        lambda: state_counts(admin, name, keys) == want,
        timeout_s,
        lambda: f"{why}: counts {want}, got {state_counts(admin, name, keys)}",
    )


@contextmanager
def worker_admin(broker, tmp_path, cluster: bool):
    """The admin API of one worker, or of a 3-worker cluster through a worker that need not host instance 0.
    A failure prints the workers' log tails (pytest shows them; a cluster prints its own): CI keeps no temporary
    directory."""
    if cluster:
        with WorkerCluster(broker.service_url, broker.metrics_url, tmp_path) as workers:
            workers.wait_ready()
            yield FunctionsAdmin(workers.live()[1].url)
        return
    try:
        with WorkerProcess(broker, tmp_path) as worker:
            yield FunctionsAdmin(worker.url)
    except BaseException:
        print(log_tails(tmp_path))
        raise


def create_counting(admin: FunctionsAdmin, name: str, src: str, parallelism: int = 3, code: str | None = None, **fields) -> None:
    """The keyed count, created and running at `parallelism`."""
    admin.create(keyed_count(name, src, parallelism=parallelism, **fields), code or str(KEYED_COUNT))
    wait_running(admin, name, set(range(parallelism)), "created")


@contextmanager
def keyed_count_under_load(broker, tmp_path, cluster: bool, prefix: str, **fields):
    """A keyed count at parallelism 3 (or `fields`' parallelism) under `keyed_load` (`producer.finish` ends it
    once the test's changes are made): (admin, name, src, producer)."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    src = f"persistent://public/default/{name}-in"
    with worker_admin(broker, tmp_path, cluster) as admin:
        create_counting(admin, name, src, **fields)
        with keyed_load(broker, src) as producer:
            wait_until(lambda: state_counts(admin, name, 1)["k0"], 30, f"{name} counting the load's first key", interval_s=0.2)
            yield admin, name, src, producer


def running(admin: FunctionsAdmin, name: str) -> set[int]:
    return {i["instanceId"] for i in admin.status("public", "default", name)["instances"] if i["status"]["running"]}


def wait_running(admin: FunctionsAdmin, name: str, ids: set[int], why: str) -> None:
    wait_until(
        lambda: running(admin, name) == ids, 60, lambda: f"{why}: {sorted(ids)} running, saw {sorted(running(admin, name))}"
    )


def migrated(admin: FunctionsAdmin, name: str, groups: dict[str, int], why: str) -> None:
    """Wait until the function's key groups are where `groups` says and no migration is under way. A paced
    migration pauses after each subscale for (1 - duty) / duty times as long as it took: on a machine with every
    core busy a 1-group subscale at a duty of 10% came to 3.5 s, 147 s for 42 groups, so the bound is generous."""
    view = lambda: admin.keyed_state("public", "default", name)  # noqa: E731
    wait_until(lambda: keyed_settled(view(), groups), 300, lambda: f"{why}: {groups}, saw {view()}")


def assert_exact(admin: FunctionsAdmin, name: str, sent: int) -> None:
    """Every key counted the `sent // LOAD_KEYS` records `keyed_load` sent it, once (it sends whole rounds of keys)."""
    expect_per_key(admin, name, sent // LOAD_KEYS, "exact counts", keys=LOAD_KEYS, timeout_s=120)


def keyed_view(cluster: WorkerCluster, name: str) -> dict:
    """The front's autoscale.keyedState, asked of any live worker ({} while none answers)."""
    for w in cluster.live():
        try:
            return FunctionsAdmin(w.url).keyed_state("public", "default", name)
        except (AdminError, requests.RequestException):
            continue
    return {}


def mid_migration(cluster: WorkerCluster, name: str, instance: str, at_least: int) -> dict | None:
    """The view while a migration is under way and `instance` holds at least / at most `at_least` groups."""
    view = keyed_view(cluster, name)
    held = (view.get("groupsPerInstance") or {}).get(instance, 0)
    reached = held >= at_least if at_least > 0 else held <= -at_least
    return view if view.get("migrating") and reached else None


def create_paced(cluster: WorkerCluster, name: str, src: str, parallelism: int) -> dict[int, str]:
    """The keyed count with PACED migrations: a migration goes on for many seconds."""
    FunctionsAdmin(cluster.live()[0].url).create(
        keyed_count(
            name,
            src,
            parallelism=parallelism,
            customRuntimeOptions=PACED,
        ),
        str(KEYED_COUNT),
    )
    return wait_until(
        lambda: cluster.spread(name, parallelism), 60, f"{parallelism} instances on {parallelism} different workers"
    )
