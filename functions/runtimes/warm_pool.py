"""Warm standby instances for the process runtime (Sponge's warm pool), one pool per function.

A process instance spends most of its start in things that do not depend on its instance id:
spawning an interpreter, importing pulsar and the function's code, connecting to the broker
(measured: 270-2,833 ms to the first message). A standby does all that ahead of time and then
waits on a pipe; a scale-out hands it an instance id and it starts its loop at once. The pool is
per function because what makes a start slow is the function's own imports (a model library), which
a generic per-worker interpreter could not have done in advance.

A taken standby is replaced by a new one in the background, REFILL_DELAY_S later: a replacement's
interpreter start (about a second of CPU) must not compete with the instances a scale-out has just
activated (measured on 2 cores: 4->8 max 134-181 ms with an immediate refill). A standby that cannot warm up (the code
fails to import, the broker is unreachable) is dropped, and the scale-out starts a cold instance.
Standbys are not instances: they consume no messages and do not count in parallelism; their cost
(an idle interpreter's memory) is reported as `standby` so reports can weigh it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from pulsar_autoscale.broker.profile import BrokerProfile
from pulsar_autoscale.functions.instance.instance_user import InstanceUser
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.pulsar_client import ClientSettings

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

log = logging.getLogger(__name__)
REFILL_DELAY_S = 1.0


class Standby:
    """One pre-started interpreter waiting for an instance id (runtime._standby_main)."""

    def __init__(
        self,
        ctx,
        config: FunctionConfig,
        client_settings: ClientSettings,
        broker: BrokerProfile,
        code_path: str | None,
        state_path: str,
        num_instances,
        piped_input: bool,
        user: InstanceUser | None = None,
    ):
        """`user` (default: InstanceUser.resolve(), nobody for a root worker): the standby drops to
        it, with a clean environment, before it imports the function's code."""
        from pulsar_autoscale.functions.runtimes.handles import _standby_main

        self.control, child_control = ctx.Pipe()
        self.input_parent: Connection | None  # the worker's end of the instance's input pipe
        self.input_parent, input_child = ctx.Pipe() if piped_input else (None, None)
        self.stop_event = ctx.Event()
        self.stats_queue = ctx.Queue()
        self.proc = ctx.Process(
            target=_standby_main,
            name=f"{config.fqfn}:standby",
            daemon=True,
            args=(
                config,
                client_settings,
                broker,
                code_path,
                state_path,
                num_instances,
                self.stop_event,
                self.stats_queue,
                input_child,
                child_control,
                user or InstanceUser.resolve(),
            ),
        )
        self.proc.start()
        self._state = "warming"

    def ready(self, timeout_s: float = 0.0) -> bool:
        """True once the standby said it is warm; False while warming, or for good once it failed."""
        if self._state == "warming" and self.control.poll(timeout_s):
            try:
                answer = self.control.recv()
            except (EOFError, OSError):
                answer = "failed: exited"
            self._state = "ready" if answer == "ready" else "failed"
            if self._state == "failed":
                log.warning("warm standby %s could not warm up: %s", self.proc.name, answer)
        return self._state == "ready" and self.proc.is_alive()

    def activate(self, instance_id: int, start_time_ms: int) -> None:
        self.control.send((instance_id, start_time_ms))

    def close(self) -> None:
        try:
            self.control.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(2.0)
        if self.proc.is_alive():
            self.proc.kill()


class WarmPool:
    """`size` warm standbys for one function; take() hands one over and schedules its replacement."""

    def __init__(self, size: int, factory):
        self.size = size
        self._factory = factory  # () -> Standby
        self._standbys: list[Standby] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._filling = True  # one filler at a time, so the pool never overshoots its size
        self._fill()

    def _fill(self) -> None:
        while True:
            with self._lock:
                if self._closed.is_set() or len(self._standbys) >= self.size:
                    self._filling = False
                    return
            standby = self._factory()
            with self._lock:
                if not self._closed.is_set():
                    self._standbys.append(standby)
                    continue
            standby.close()

    def _refill_later(self, delay_s: float) -> None:
        with self._lock:
            if self._filling or self._closed.is_set():
                return
            self._filling = True

        def fill_later() -> None:
            if not self._closed.wait(delay_s):
                self._fill()

        threading.Thread(target=fill_later, name="warm-pool-fill", daemon=True).start()

    def take(self) -> Standby | None:
        """A warm standby, or None (pool empty or still warming: start a cold instance)."""
        with self._lock:
            for standby in list(self._standbys):
                if standby.ready():
                    self._standbys.remove(standby)
                    break
                if not standby.proc.is_alive():
                    self._standbys.remove(standby)
            else:
                standby = None
        self._refill_later(REFILL_DELAY_S)
        return standby

    def resize(self, size: int) -> None:
        """Hold `size` standbys from now on (the controller sizes the pool): extras close, missing ones start."""
        with self._lock:
            self.size = size
            extra = self._standbys[size:]
            del self._standbys[size:]
        for standby in extra:
            standby.close()
        self._refill_later(0.0)

    @property
    def standby(self) -> int:
        """Standbys held now (warm or warming), for reports that count their cost."""
        with self._lock:
            return len(self._standbys)

    def ready_count(self) -> int:
        with self._lock:
            return sum(standby.ready() for standby in self._standbys)

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            standbys, self._standbys = self._standbys, []
        for standby in standbys:
            standby.close()
