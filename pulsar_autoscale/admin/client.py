"""A small client for the Functions admin REST API (ours or a stock Pulsar worker's).

Same paths and multipart form as pulsar-admin; errors become AdminError carrying Pulsar's
"reason" text and the HTTP status, never a raw traceback.
"""

from __future__ import annotations

import builtins
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import requests

from pulsar_autoscale.errors import PulsarAutoscaleError
from pulsar_autoscale.headers import EPOCH_HEADER
from pulsar_autoscale.security.redact import redact_url

NO_CHANGE_REASON = "Update contains no change"
log = logging.getLogger(__name__)


def admin_urls(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """One URL, a comma-separated string of them, or a list."""
    urls = [u.strip() for u in (value.split(",") if isinstance(value, str) else value) if u.strip()]
    if not urls:
        raise PulsarAutoscaleError("admin_url names no worker")
    return urls


class AdminError(PulsarAutoscaleError):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status

    @property
    def no_change(self) -> bool:
        """Pulsar's 400 for an update to what is in force already (a parallelism it runs at): done, not failed."""
        return self.status == 400 and NO_CHANGE_REASON.lower() in str(self).lower()


@dataclass
class FunctionsAdmin:
    """`admin_url`: one worker, or several workers of one cluster (a list, or comma-separated): a call
    that cannot reach the current one goes to the next (any worker answers for the whole cluster)."""

    admin_url: str | list[str] | tuple[str, ...]
    timeout_s: float = 30.0
    session: requests.Session | None = None

    def __post_init__(self):
        self.admin_urls = [u.strip().rstrip("/") for u in admin_urls(self.admin_url)]
        self.admin_url = self.admin_urls[0]
        self.session = self.session or requests.Session()

    def _url(self, tenant: str, namespace: str, name: str | None = None, suffix: str = "") -> str:
        base = f"{self.admin_url}/admin/v3/functions/{tenant}/{namespace}"
        return base + (f"/{name}" if name else "") + suffix

    def _send(self, method: str, url: str, **kwargs) -> requests.Response:
        """Fail over along admin_urls when a worker cannot be reached."""
        # Both are set by __post_init__: admin_url to one of admin_urls, session to a Session.
        session = cast(requests.Session, self.session)
        path = url[len(self.admin_url) :]
        for _ in self.admin_urls:
            current = cast(str, self.admin_url)
            try:
                return session.request(method, current + path, timeout=self.timeout_s, **kwargs)
            except requests.exceptions.SSLError as exc:  # the worker is up: failing over would not help
                raise AdminError(
                    f"cannot reach the functions admin API at {redact_url(current)}: the TLS "
                    f"handshake failed (trusted CA, client certificate?): {redact_url(str(exc))}"
                ) from None
            except requests.ConnectionError:
                if len(self.admin_urls) == 1:
                    break
                nxt = self.admin_urls[(self.admin_urls.index(current) + 1) % len(self.admin_urls)]
                log.warning("cannot reach %s; failing over to %s", redact_url(current), redact_url(nxt))
                self.admin_url = nxt
        raise AdminError(
            f"cannot reach the functions admin API at {redact_url(', '.join(self.admin_urls))} (is the worker running?)"
        ) from None

    def _call(self, method: str, url: str, **kwargs) -> Any:
        resp = self._request(method, url, **kwargs)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise AdminError(f"{method} {redact_url(url)} answered a body that is not JSON: {resp.text[:200]!r}") from None

    def _request(self, method: str, url: str, **kwargs) -> requests.Response:
        """The response of a successful call; AdminError with the server's reason otherwise."""
        shown = redact_url(url)  # messages reach logs and /status: no user-info
        try:
            resp = self._send(method, url, **kwargs)
        except requests.Timeout:
            raise AdminError(f"{method} {shown} timed out after {self.timeout_s:.0f}s") from None
        if resp.status_code >= 400:
            try:
                reason = resp.json().get("reason", resp.text)
            except ValueError:
                reason = resp.text.strip() or resp.reason
            raise AdminError(f"{method} {shown} -> {resp.status_code}: {reason}", resp.status_code)
        return resp

    @staticmethod
    def _form(config: dict, py_file: str | None) -> dict:
        files: dict[str, tuple[str | None, str | bytes, str]] = {"functionConfig": (None, json.dumps(config), "application/json")}
        if py_file:
            path = Path(py_file)
            if not path.is_file():
                raise AdminError(f"py file {py_file} does not exist")
            files["data"] = (path.name, path.read_bytes(), "application/octet-stream")
        return files

    def create(self, config: dict, py_file: str | None = None) -> None:
        self._call("POST", self._url(config["tenant"], config["namespace"], config["name"]), files=self._form(config, py_file))

    def update(self, config: dict, py_file: str | None = None, epoch: int | None = None) -> None:
        # The epoch fences a deposed controller leader out (our worker answers 409; stock Pulsar ignores it).
        headers = {EPOCH_HEADER: str(epoch)} if epoch is not None else None
        self._call(
            "PUT",
            self._url(config["tenant"], config["namespace"], config["name"]),
            files=self._form(config, py_file),
            headers=headers,
        )

    def set_parallelism(self, tenant: str, namespace: str, name: str, parallelism: int, epoch: int | None = None) -> None:
        self.update({"tenant": tenant, "namespace": namespace, "name": name, "parallelism": parallelism}, epoch=epoch)

    def get(self, tenant: str, namespace: str, name: str) -> dict:
        return self._call("GET", self._url(tenant, namespace, name))

    def list(self, tenant: str, namespace: str) -> list[str]:
        return self._call("GET", self._url(tenant, namespace))

    def delete(self, tenant: str, namespace: str, name: str) -> None:
        self._call("DELETE", self._url(tenant, namespace, name))

    def status(self, tenant: str, namespace: str, name: str) -> dict:
        return self._call("GET", self._url(tenant, namespace, name, "/status"))

    def keyed_state(self, tenant: str, namespace: str, name: str) -> dict:
        """The status's autoscale.keyedState (groupsPerInstance, migrating, lastMigration...); {} for a function
        without keyedState."""
        return (self.status(tenant, namespace, name).get("autoscale") or {}).get("keyedState") or {}

    def stats(self, tenant: str, namespace: str, name: str) -> dict:
        return self._call("GET", self._url(tenant, namespace, name, "/stats"))

    # ---- pulsar-admin parity: trigger, state, upload, download -----------------------------------
    def trigger(
        self, tenant: str, namespace: str, name: str, value: str | None = None, file: str | None = None, topic: str | None = None
    ) -> bytes | None:
        """The function's output for the value (None: it has no output topic)."""
        form: dict = {}
        if value is not None:
            form["data"] = (None, value)
        if file is not None:
            form["dataStream"] = (Path(file).name, _read(file), "application/octet-stream")
        if topic:
            form["topic"] = (None, topic)
        resp = self._request("POST", self._url(tenant, namespace, name, "/trigger"), files=form or None)
        return resp.content if resp.status_code == 200 else None

    def get_state(self, tenant: str, namespace: str, name: str, key: str) -> dict:
        return self._call("GET", self._url(tenant, namespace, name, f"/state/{key}"))

    def put_state(self, tenant: str, namespace: str, name: str, state: dict) -> None:
        self._call(
            "POST",
            self._url(tenant, namespace, name, f"/state/{state['key']}"),
            files={"state": (None, json.dumps(state), "application/json")},
        )

    def upload(self, source_file: str, path: str) -> None:
        self._call(
            "POST",
            f"{self.admin_url}/admin/v3/functions/upload",
            files={"data": (Path(source_file).name, _read(source_file), "application/octet-stream"), "path": (None, path)},
        )

    def download(self, path: str | None = None, function: tuple[str, str, str] | None = None) -> bytes:
        """A file uploaded at `path`, or a function's code."""
        if function is not None:
            return self._request("GET", self._url(*function, "/download")).content
        return self._request("GET", f"{self.admin_url}/admin/v3/functions/download", params={"path": path}).content

    # ---- our worker only: Spark stateful stages (a StatefulStageConfig as a dict) -----------------
    def _stage_url(self, tenant: str, namespace: str, name: str | None = None) -> str:
        return f"{self.admin_url}/admin/v3/stages/{tenant}/{namespace}" + (f"/{name}" if name else "")

    def create_stage(self, config: dict) -> None:
        self._call(
            "POST",
            self._stage_url(config.get("tenant", "public"), config.get("namespace", "default"), config["name"]),
            json=config,
        )

    def get_stage(self, tenant: str, namespace: str, name: str) -> dict:
        return self._call("GET", self._stage_url(tenant, namespace, name))

    def list_stages(self, tenant: str, namespace: str) -> builtins.list[str]:
        return self._call("GET", self._stage_url(tenant, namespace))

    def delete_stage(self, tenant: str, namespace: str, name: str) -> None:
        self._call("DELETE", self._stage_url(tenant, namespace, name))

    def burst(
        self, tenant: str, namespace: str, name: str, messages: int, partitions: int, threads: int = 1, epoch: int | None = None
    ) -> dict:
        """Our worker only: start a Spark burst drain of up to `messages` of the function's backlog."""
        headers = {EPOCH_HEADER: str(epoch)} if epoch is not None else None
        return self._call(
            "POST",
            self._url(tenant, namespace, name, "/burst"),
            json={"messages": messages, "partitions": partitions, "threadsPerPartition": threads},
            headers=headers,
        )

    def set_warm_pool(self, tenant: str, namespace: str, name: str, standbys: int, epoch: int | None = None) -> dict:
        """Our worker only: keep `standbys` warm standbys for a process-runtime function."""
        headers = {EPOCH_HEADER: str(epoch)} if epoch is not None else None
        return self._call("PUT", self._url(tenant, namespace, name, "/warm-pool"), json={"standbys": standbys}, headers=headers)

    def warm_pool(self, tenant: str, namespace: str, name: str) -> dict:
        return self._call("GET", self._url(tenant, namespace, name, "/warm-pool"))

    def burst_report(self, tenant: str, namespace: str, name: str) -> dict:
        return self._call("GET", self._url(tenant, namespace, name, "/burst"))

    # ---- the worker API v2 (pulsar-admin functions-worker) ------------------------------------------
    def cluster(self) -> builtins.list[dict]:
        return self._call("GET", f"{self.admin_url}/admin/v2/worker/cluster")

    def cluster_leader(self) -> dict:
        return self._call("GET", f"{self.admin_url}/admin/v2/worker/cluster/leader")

    def assignments(self) -> dict:
        return self._call("GET", f"{self.admin_url}/admin/v2/worker/assignments")

    def rebalance(self) -> None:
        self._call("PUT", f"{self.admin_url}/admin/v2/worker/rebalance")

    def action(self, tenant: str, namespace: str, name: str, action: str, instance_id: int | None = None) -> None:
        suffix = (f"/{instance_id}" if instance_id is not None else "") + f"/{action}"
        self._call("POST", self._url(tenant, namespace, name, suffix))


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise AdminError(f"cannot read {path}: {exc.strerror}") from None
