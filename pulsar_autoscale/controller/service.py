"""The controller's HTTP service: rest.py's routes over a ControllerApi, on a thread of their own.

The loop is given one (Controller(http=...)), starts it with itself as the API and advertises the URL it
returns with each leader term; built from the config by default. The bind is checked on construction, so a
controller that may not serve on its host refuses before anything starts."""

from __future__ import annotations

import socket
import threading

from pulsar_autoscale.controller.api import ControllerApi
from pulsar_autoscale.controller.rest import build_app
from pulsar_autoscale.netutil import free_port
from pulsar_autoscale.security.httpd import HTTPServer
from pulsar_autoscale.security.serving import ServerSecurity


class HttpService:
    def __init__(self, host: str, port: int, security: ServerSecurity | None = None):
        self.security = security or ServerSecurity()
        self.security.check_bind(host)
        self.host, self.port = host, port  # port 0: a free one, chosen on start
        self._server: HTTPServer | None = None

    def start(self, api: ControllerApi) -> str:
        """Serve `api`; the URL peers reach it at."""
        self.port = self.port or free_port(self.host)
        self._server = server = self.security.make_server(self.host, self.port, build_app(api))
        threading.Thread(target=server.serve_forever, name="controller-http", daemon=True).start()
        host = self.host if self.host not in ("0.0.0.0", "::", "") else socket.getfqdn()
        return f"{self.security.scheme}://{host}:{self.port}"

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
