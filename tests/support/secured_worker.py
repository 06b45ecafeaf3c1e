"""The roles and calls the security tests make against the secured worker of tests/integration/security/conftest.py."""

from __future__ import annotations

import requests

from pulsar_autoscale.admin.client import FunctionsAdmin
from pulsar_autoscale.pulsar_client import ClientSettings
from pulsar_autoscale.security import tokens

SUPERUSER, CONTROLLER, ACME_ADMIN, STRANGER = "admin", "autoscaler", "acme-admin", "nobody"


FNS = "/admin/v3/functions"


def token(keys, role: str, **kw) -> str:
    return tokens.create_token(role, secret_key=keys["secret"], **kw)


def call(worker, keys, method: str, path: str, role: str | None = None, bearer: str | None = None, **kw):
    headers = kw.pop("headers", {})
    if role is not None or bearer is not None:
        headers["Authorization"] = f"Bearer {bearer or token(keys, role)}"
    return requests.request(method, worker.url + path, headers=headers, verify=keys["ca"], timeout=30, **kw)


def admin_as(worker, keys, role: str) -> FunctionsAdmin:
    settings = ClientSettings(worker.url, "token", f"token:{token(keys, role)}", keys["ca"])
    return FunctionsAdmin(worker.url, session=settings.http_session())


def function(tenant: str, name: str, **extra) -> dict:
    return {
        "tenant": tenant,
        "namespace": "ns",
        "name": name,
        "className": "exclaim.Exclaim",
        "inputs": [f"persistent://{tenant}/ns/{name}-in"],
        "parallelism": 1,
        **extra,
    }
