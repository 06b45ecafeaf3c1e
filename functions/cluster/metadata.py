"""Function metadata: configs on the metadata topic, code on the package topic.

Any worker accepts a create/update/delete: it validates, publishes the code (if any) and then
a record naming the version it read. Every worker applies the records in topic order with the
same rule (create needs no such function, update and delete need the version the writer
read), so all views agree and concurrent writers cannot both win: the loser's record is
ignored everywhere and its writer answers the error (or, for an update, merges again).

Code travels through the broker (a message on the package topic, keyed by its SHA-256), not
a shared store: the cluster then needs nothing but Pulsar, and a worker on another machine
gets the code from the same place it gets the config. Pulsar's default maxMessageSize is
5 MB, so a package is limited to MAX_PACKAGE_BYTES (Python functions are small files).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, TypedDict, cast

import pulsar

from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.functions.cluster.tailer import TopicTailer
from pulsar_autoscale.functions.cluster.topics import ClusterTopics
from pulsar_autoscale.functions.instance.instance_user import InstanceUser, InstanceUsers
from pulsar_autoscale.functions.instance.validation import validate
from pulsar_autoscale.functions.model.config import FunctionConfig, with_new_state
from pulsar_autoscale.functions.model.errors import Conflict, NotFound
from pulsar_autoscale.functions.model.files import write_atomically

log = logging.getLogger(__name__)
MAX_PACKAGE_BYTES = 4 * 1024 * 1024
WRITE_TIMEOUT_S = 15.0
UPDATE_ATTEMPTS = 5


class MetadataTimeout(PulsarAutoscaleError):
    """A metadata record was written but not read back in time (broker trouble)."""

    http_status = 503


CONTROL_ACTIONS = ("start", "stop", "restart")


@dataclass(frozen=True)
class FunctionRecord:
    config: FunctionConfig
    version: int
    package: str | None = None  # SHA-256 of the code on the package topic
    filename: str | None = None
    stopped: frozenset[int] = frozenset()  # instances stopped by the start/stop API, wherever they run
    restarts: tuple[tuple[int, int], ...] = ()  # (instance, restart requests so far): its owner restarts it on each

    def restart_count(self, instance_id: int) -> int:
        return dict(self.restarts).get(instance_id, 0)


class _Kept(TypedDict, total=False):
    """What an update's record keeps of the function's current FunctionRecord."""

    stopped: frozenset[int]
    restarts: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class _Outcome:
    ok: bool
    kind: str = ""  # "exists", "missing", "version"
    reason: str = ""


class FunctionMetaDataManager:
    def __init__(
        self,
        client: pulsar.Client,
        topics: ClusterTopics,
        data_dir: Path,
        worker_id: str,
        max_parallelism: int,
        users: InstanceUsers | None = None,
    ):
        """`users`: whom the validation child of a create or update runs as (the worker's instance users)."""
        self.worker_id = worker_id
        self._users = users
        self.max_parallelism = max_parallelism
        self._packages_dir = data_dir / "packages"
        self._functions: dict[str, FunctionRecord] = {}
        self._rebalances: list[str] = []  # rebalance request ids, in topic order
        self._outcomes: dict[str, _Outcome] = {}
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)
        self._meta_producer = client.create_producer(topics.metadata, batching_enabled=False)
        self._pkg_producer = client.create_producer(topics.packages, batching_enabled=False)
        self._pkg_tailer = TopicTailer(client, topics.packages, self._store_package, f"packages-{worker_id}", self._pkg_producer)
        self._meta_tailer = TopicTailer(client, topics.metadata, self._apply, f"metadata-{worker_id}", self._meta_producer)

    def wait_caught_up(self, timeout_s: float) -> bool:
        return self._meta_tailer.caught_up.wait(timeout_s) and self._pkg_tailer.caught_up.wait(timeout_s)

    # ---- the view ---------------------------------------------------------------------------------
    def functions(self) -> dict[str, FunctionRecord]:
        with self._lock:
            return dict(self._functions)

    def get(self, fqfn: str) -> FunctionRecord:
        """The function's record. A miss first syncs with the metadata topic: a function that another
        worker has just created (and answered for) is found here too, not 404."""
        rec = self._lookup(fqfn)
        if rec is None:
            self.sync()
            rec = self._lookup(fqfn)
        if rec is None:
            raise NotFound(f"Function {fqfn} doesn't exist")
        return rec

    def _lookup(self, fqfn: str) -> FunctionRecord | None:
        with self._lock:
            return self._functions.get(fqfn)

    def sync(self) -> None:
        """Brings this worker's view up to every record written before the call (one marker's round trip)."""
        if not self._meta_tailer.sync(WRITE_TIMEOUT_S):
            raise MetadataTimeout(f"the metadata topic did not answer within {WRITE_TIMEOUT_S:.0f}s (broker trouble?)")

    def rebalances(self) -> list[str]:
        with self._lock:
            return list(self._rebalances)

    def code_path(self, rec: FunctionRecord, timeout_s: float = 10.0) -> str | None:
        """Where this worker has the function's code; waits for the package topic to deliver it."""
        if rec.package is None:
            return None
        path = self._packages_dir / rec.package / cast(str, rec.filename)  # _publish_code names both or neither
        deadline = time.monotonic() + timeout_s
        while not path.is_file():
            if time.monotonic() > deadline:
                raise MetadataTimeout(f"package {rec.package[:12]} of {rec.config.fqfn} not received within {timeout_s:.0f}s")
            time.sleep(0.05)
        return str(path)

    # ---- writes (any worker) ----------------------------------------------------------------------
    def create(self, cfg: FunctionConfig, code: bytes | None, filename: str | None) -> FunctionConfig:
        cfg = with_new_state(FunctionConfig.from_dict(cfg.to_dict(), self.max_parallelism))
        if self._lookup(cfg.fqfn) is not None:
            self.sync()  # it may have been deleted through another worker just now
            if self._lookup(cfg.fqfn) is not None:
                raise Conflict(f"Function {cfg.name} already exists")
        package, name = self._publish_code(cfg, code, filename)
        self._write({"op": "create", "fqfn": cfg.fqfn, "config": cfg.to_dict(), "package": package, "filename": name})
        return cfg

    def update(
        self,
        fqfn: str,
        changes: dict,
        code: bytes | None,
        filename: str | None,
        check: Callable[[FunctionConfig], None] = lambda _cfg: None,
    ) -> FunctionConfig:
        """`check`: refuses a merged config the broker cannot serve (raises ConfigError)."""
        synced = False
        for _ in range(UPDATE_ATTEMPTS):
            rec = self.get(fqfn)
            try:
                new = rec.config.merged(changes, self.max_parallelism)
            except ConfigError as exc:
                if str(exc) != "Update contains no change":
                    raise
                if code is None and not synced:  # no change to the version read here: maybe to the latest
                    self.sync()
                    synced = True
                    continue
                if code is None:
                    raise
                new = rec.config
            check(new)
            package, name = self._publish_code(new, code, filename) if code is not None else (rec.package, rec.filename)
            outcome = self._write(
                {
                    "op": "update",
                    "fqfn": fqfn,
                    "config": new.to_dict(),
                    "package": package,
                    "filename": name,
                    "expect": rec.version,
                },
                raise_on=("missing",),
            )
            if outcome.ok:
                return new
            log.info("update of %s raced with another writer; merging again", fqfn)
        raise Conflict(f"Function {fqfn} changed concurrently {UPDATE_ATTEMPTS} times; try again")

    def delete(self, fqfn: str) -> None:
        """Deletes the version read; one changed meanwhile (an update answered through another worker that
        this one had not read yet) is read again and deleted, as a delete on one worker would."""
        for _ in range(UPDATE_ATTEMPTS):
            rec = self.get(fqfn)
            if self._write({"op": "delete", "fqfn": fqfn, "expect": rec.version}, raise_on=("missing",)).ok:
                return
            log.info("delete of %s raced with an update; deleting the new version", fqfn)
        raise Conflict(f"Function {fqfn} changed concurrently {UPDATE_ATTEMPTS} times; try again")

    def control(self, fqfn: str, action: str, instance_id: int | None) -> None:
        """Pulsar's start/stop/restart of one instance (or all): a record every worker applies, so the
        state outlives the instance's worker and the worker that runs the instance acts on it."""
        if action not in CONTROL_ACTIONS:
            raise ConfigError(f"unknown instance action {action!r}: use one of {', '.join(CONTROL_ACTIONS)}")
        parallelism = self.get(fqfn).config.parallelism
        if instance_id is not None and not 0 <= instance_id < parallelism:
            raise NotFound(f"Function {fqfn.rsplit('/', 1)[-1]} has no instance {instance_id} (parallelism {parallelism})")
        self._write(
            {"op": "control", "fqfn": fqfn, "action": action, "instances": None if instance_id is None else [instance_id]},
            raise_on=("missing",),
        )

    def request_rebalance(self) -> str:
        return self._write({"op": "rebalance"}).reason

    def _publish_code(self, cfg: FunctionConfig, code: bytes | None, filename: str | None) -> tuple[str | None, str | None]:
        if code is None and cfg.py:
            raise ConfigError(
                f"py {cfg.py!r} names a file on the worker's host: py may only name uploaded code "
                "(send the file as the multipart `data` part)"
            )
        if code is None:
            validate(cfg.className, None, user=self._user(cfg))  # in a child process (instance/validation.py)
            return None, None
        name = Path(filename or cfg.py or f"{cfg.className.split('.')[0]}.py").name
        if not name.endswith(".py"):
            raise ConfigError(f"function package {name!r} is not a .py file (only Python files run here)")
        if len(code) > MAX_PACKAGE_BYTES:
            raise ConfigError(
                f"function package {name!r} is {len(code)} bytes; a cluster ships code through "
                f"the broker and accepts at most {MAX_PACKAGE_BYTES} bytes"
            )
        sha = hashlib.sha256(code).hexdigest()
        path = self._write_package(sha, name, code)
        validate(cfg.className, str(path), user=self._user(cfg))  # refuse what could never run, in a child process
        self._pkg_producer.send(code, properties={"sha256": sha, "filename": name})
        return sha, name

    def _user(self, cfg: FunctionConfig) -> InstanceUser | None:
        return self._users.of(cfg.fqfn) if self._users is not None else None

    def _write_package(self, sha: str, name: str, code: bytes) -> Path:
        path = self._packages_dir / sha / name
        return path if path.is_file() else write_atomically(path, code)

    def _store_package(self, msg: pulsar.Message) -> None:
        props = msg.properties()
        code = msg.data()
        if hashlib.sha256(code).hexdigest() != props.get("sha256"):
            log.error("package %s on the package topic does not match its SHA-256; ignored", props.get("sha256"))
            return
        self._write_package(props["sha256"], Path(props["filename"]).name, code)

    def _write(self, record: dict, raise_on: tuple[str, ...] = ("exists", "missing", "version")) -> _Outcome:
        request = uuid.uuid4().hex
        self._meta_producer.send(json.dumps({**record, "request": request, "writer": self.worker_id}).encode())
        with self.changed:
            if not self.changed.wait_for(lambda: request in self._outcomes, timeout=WRITE_TIMEOUT_S):
                raise MetadataTimeout(
                    f"metadata record for {record.get('fqfn', 'rebalance')} not read back "
                    f"within {WRITE_TIMEOUT_S:.0f}s (broker trouble?)"
                )
            outcome = self._outcomes.pop(request)
        if not outcome.ok and outcome.kind in raise_on:
            raise (NotFound if outcome.kind == "missing" else Conflict)(outcome.reason)
        return outcome

    # ---- applying records (every worker, in topic order) ------------------------------------------
    def _apply(self, msg: pulsar.Message) -> None:
        r = json.loads(msg.data())
        outcome = self._decide(r)
        with self.changed:
            if outcome.ok:
                self._commit(r)
            if r.get("writer") == self.worker_id:
                self._outcomes[r["request"]] = (
                    outcome if not outcome.ok or r["op"] != "rebalance" else _Outcome(True, reason=r["request"])
                )
            self.changed.notify_all()

    def _decide(self, r: dict) -> _Outcome:
        op, fqfn = r["op"], r.get("fqfn")
        with self._lock:
            cur = self._functions.get(fqfn) if fqfn else None
        if op == "create" and cur is not None:  # found: the record names fqfn
            return _Outcome(False, "exists", f"Function {cast(str, fqfn).rsplit('/', 1)[-1]} already exists")
        if op in ("update", "delete", "control"):
            if cur is None:
                return _Outcome(False, "missing", f"Function {fqfn} doesn't exist")
            if op != "control" and cur.version != r["expect"]:
                return _Outcome(False, "version", f"Function {fqfn} changed concurrently")
        return _Outcome(True)

    def _commit(self, r: dict) -> None:
        op = r["op"]
        if op == "rebalance":
            self._rebalances.append(r["request"])
        elif op == "delete":
            del self._functions[r["fqfn"]]
        elif op == "control":
            self._functions[r["fqfn"]] = controlled(self._functions[r["fqfn"]], r["action"], r["instances"])
        else:
            cur = self._functions.get(r["fqfn"])
            cfg = FunctionConfig.accepted(r["config"], max(self.max_parallelism, r["config"].get("parallelism", 1)))
            kept: _Kept = (
                {}
                if cur is None
                else {"stopped": frozenset(i for i in cur.stopped if i < cfg.parallelism), "restarts": cur.restarts}
            )
            self._functions[r["fqfn"]] = FunctionRecord(
                cfg, (cur.version if cur else 0) + 1, r.get("package"), r.get("filename"), **kept
            )

    def close(self) -> None:
        self._meta_tailer.close()
        self._pkg_tailer.close()
        self._meta_producer.close()
        self._pkg_producer.close()


def controlled(rec: FunctionRecord, action: str, instances: list[int] | None) -> FunctionRecord:
    """The record after a start/stop/restart of `instances` (None: all). Restart also starts a stopped
    instance, as on a single worker. The version stays: a control record never conflicts with an update."""
    ids = set(range(rec.config.parallelism)) if instances is None else {i for i in instances if i < rec.config.parallelism}
    if action == "stop":
        return replace(rec, stopped=rec.stopped | ids)
    restarts = dict(rec.restarts)
    if action == "restart":
        restarts.update({i: restarts.get(i, 0) + 1 for i in ids})
    return replace(rec, stopped=rec.stopped - ids, restarts=tuple(sorted(restarts.items())))
