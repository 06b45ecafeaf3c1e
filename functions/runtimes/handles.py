"""How an instance runs: as a thread of the worker (sharing its client) or as a child process.

Thread is the default: instances that wait on I/O (a model server, a database) scale with
threads, start in milliseconds and share one connection. Process instances give a CPU-bound
function its own interpreter (no shared GIL) at the cost of a ~1 s start. Each thread instance
is a consumer of the function's subscription, as in Pulsar. Process instances on pulsar-lite
cannot join that subscription from their own connection (B2), so they receive through their
worker over a pipe (broker/lite/shared_input.py). A keyedState function's process instance receives through its
worker too, and its state calls go to its worker's store (functions/runtimes/remote_state.py).

A process instance (and a warm standby) opens what it needs of the worker's files as the worker's user (its
client, its state file), then drops to the instance user with a clean environment before it imports the
function's code (functions/instance/instance_user.py); the fork server itself starts without the worker's
credential variables (clean_fork_server.py).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.forkserver
import queue
import threading
from abc import ABC, abstractmethod
from dataclasses import replace
from typing import cast

import pulsar

from pulsar_autoscale.broker.lite.shared_input import SharedInput
from pulsar_autoscale.broker.profile import BrokerProfile
from pulsar_autoscale.functions.instance.instance import Instance, prepare, subscribe_fenced
from pulsar_autoscale.functions.instance.instance_user import InstanceUser, enter
from pulsar_autoscale.functions.instance.stats import InstanceFigures, InstanceStats
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.runtimes.piped_input import PipeConsumer, serve_pipe
from pulsar_autoscale.functions.runtimes.remote_state import KeyedParts, RemoteStateStore, serve_keyed
from pulsar_autoscale.functions.state.backend import StateBackend
from pulsar_autoscale.functions.state.groups import one_group
from pulsar_autoscale.functions.state.owner_calls import OwnedState, StateEndpoint, http_transport, is_state_endpoint
from pulsar_autoscale.functions.state.store import StateStore
from pulsar_autoscale.pulsar_client import ClientSettings, open_client

log = logging.getLogger(__name__)
RUNTIMES = ("thread", "process")
STATS_INTERVAL_S = 0.25


class InstanceHandle(ABC):
    """What the worker holds for one running instance."""

    instance_id: int

    @abstractmethod
    def figures(self) -> InstanceFigures: ...

    @abstractmethod
    def stop(self) -> None:
        """Begin draining; returns at once."""

    @abstractmethod
    def join(self, timeout_s: float) -> bool:
        """Wait for the drain to finish; True when the instance has exited."""

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def abandon(self) -> None:
        """Give up on a drain that did not finish: its input is closed, so its unacknowledged messages are
        redelivered to other instances."""


class ThreadInstance(InstanceHandle):
    def __init__(
        self,
        config: FunctionConfig,
        instance_id: int,
        client: pulsar.Client,
        code_path: str | None,
        state: StateBackend,
        num_instances,
        open_input=None,
    ):
        """`open_input`: where the instance's records come from instead of its own consumer (a keyed
        function's mailbox, functions/keyed/routing.py)."""
        self.instance_id = instance_id
        self._instance = Instance(config, instance_id, client, code_path, state, num_instances, open_input=open_input)
        self._thread = threading.Thread(target=self._instance.run, name=f"{config.fqfn}:{instance_id}", daemon=True)
        self._thread.start()

    def figures(self) -> InstanceFigures:
        return self._instance.stats.figures()

    def stop(self) -> None:
        self._instance.stop()

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def abandon(self) -> None:
        # A thread cannot be killed: it is left to finish (or hang) on its own, without input.
        self._instance.abandon()


def _process_main(
    config: FunctionConfig,
    instance_id: int,
    client_settings: ClientSettings,
    broker: BrokerProfile,
    code_path: str | None,
    state_path: str | StateEndpoint | None,
    num_instances,
    stop_event,
    stats_queue,
    input_conn,
    start_time_ms: int,
    user: InstanceUser,
) -> None:
    """Entry point of a process instance: run the loop in a thread, report figures until drained."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client, state, code_path = _as_instance_user(config, client_settings, code_path, state_path, input_conn, user)
    _run_instance(
        client, config, instance_id, code_path, state, num_instances, stop_event, stats_queue, input_conn, start_time_ms, broker
    )


def _as_instance_user(
    config: FunctionConfig,
    client_settings: ClientSettings,
    code_path: str | None,
    state_path: str | StateEndpoint | None,
    input_conn,
    user: InstanceUser,
):
    """What the child needs from the worker's files, opened as the worker's user (the client reads its token
    file and connects; the state file is in the worker's data dir), then the drop to the instance user with a clean
    environment (instance_user.enter), before any user code is imported. Returns (client, state, the code's
    path from the child's working directory)."""
    client = open_client(client_settings, pulsar.LoggerLevel.Warn)
    if config.inputs:  # the connection (TLS trust and client files) opened as the worker's user
        try:
            client.get_topic_partitions(config.inputs[0])
        except pulsar.PulsarException:
            pass  # the broker does not answer: the instance says so when it subscribes (a standby: it fails)
    state: RemoteStateStore | OwnedState | StateStore
    if config.keyedState:
        state = RemoteStateStore(input_conn)
    elif is_state_endpoint(state_path):  # a cluster: one copy of the state, on its owner (state/owner_calls.py)
        state = OwnedState(http_transport(state_path, client_settings.trust_loaded_now()))
    else:
        # a path: only a keyedState instance has none (its state is served over the pipe)
        state = StateStore(cast(str, state_path), config.numKeyGroups, keyed=False)
        # its one group file, opened now: the instance user cannot reach the data dir, the open file it keeps
        # (a store reuses the file it has open)
        state._file(one_group(config.numKeyGroups))
    return client, state, enter(user, code_path)


def _standby_main(
    config: FunctionConfig,
    client_settings: ClientSettings,
    broker: BrokerProfile,
    code_path: str | None,
    state_path: str,
    num_instances,
    stop_event,
    stats_queue,
    input_conn,
    control,
    user: InstanceUser,
) -> None:
    """Entry point of a warm standby (warm_pool): interpreter up, the function's code imported (as the instance
    user), the client connected to the broker, the output producer open; then it waits for an instance id and
    runs that instance like _process_main."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = None
    try:
        client, state, code_path = _as_instance_user(config, client_settings, code_path, state_path, input_conn, user)
        prepared = prepare(client, config, code_path)
        client.get_topic_partitions(config.inputs[0])  # the connection the instance will use is up
        control.send("ready")
        activation = control.recv()
    except (EOFError, OSError):
        activation = None  # the worker closed the pool
    except Exception as exc:  # cannot warm: say so; the pool then starts cold instances instead
        control.send(f"failed: {type(exc).__name__}: {exc}")
        activation = None
    if activation is None:
        if client is not None:
            client.close()
        return
    instance_id, start_time_ms = activation
    _run_instance(
        client,
        config,
        instance_id,
        code_path,
        state,
        num_instances,
        stop_event,
        stats_queue,
        input_conn,
        start_time_ms,
        broker,
        prepared,
    )


def _run_instance(
    client,
    config: FunctionConfig,
    instance_id: int,
    code_path: str | None,
    state,
    num_instances,
    stop_event,
    stats_queue,
    input_conn,
    start_time_ms: int,
    broker: BrokerProfile,
    prepared=None,
) -> None:
    """`input_conn`, a pipe to the worker: a keyedState instance's input and state calls (functions/runtimes/remote_state.py),
    else its input on pulsar-lite (lite.shared_input.SharedInput); None: it subscribes itself, fenced as the worker
    fences its inputs (`broker`: a FAILOVER input counts its nacks itself, broker/lite/nack_redelivery.py)."""
    stats = InstanceStats(instance_id, start_time_ms)
    if config.keyedState:
        open_input = state.input
    else:
        open_input = (
            (lambda: PipeConsumer(input_conn))
            if input_conn is not None
            else (lambda: subscribe_fenced(client, config, f"{config.fqfn}:{instance_id}", broker))
        )
    instance = Instance(
        config,
        instance_id,
        client,
        code_path,
        state,
        lambda: num_instances.value,
        stats,
        open_input=open_input,
        prepared=prepared,
    )
    runner = threading.Thread(target=instance.run, daemon=True)
    runner.start()
    while runner.is_alive():
        if stop_event.wait(STATS_INTERVAL_S):
            instance.stop()
        stats_queue.put(stats.figures())
    runner.join()
    stats_queue.put(stats.figures())
    client.close()


def _process_context():
    """Process instances start from a fork server that has imported this module (pulsar, the instance loop)
    and nothing else: it holds no pulsar-client threads, so forking it is safe, and a new instance starts
    without an interpreter boot and ~0.3 s of imports (spawn: each start paid both, 1-3 s under load when
    a restarted worker started all its instances at once)."""
    ctx = mp.get_context("forkserver")
    # clean_fork_server first: the server, and so every instance, starts without the worker's credentials
    ctx.set_forkserver_preload(["pulsar_autoscale.functions.runtimes.clean_fork_server", "__main__", __name__])
    return ctx


def start_process_server() -> None:
    """Boot the fork server now, in the background (a worker with process instances to restore calls
    this first thing, so the boot overlaps its own start instead of delaying the first instance)."""
    threading.Thread(target=mp.forkserver.ensure_running, name="fork-server-start", daemon=True).start()


class ProcessInstance(InstanceHandle):
    _ctx = _process_context()  # never fork the worker itself: it holds pulsar-client threads

    def __init__(
        self,
        config: FunctionConfig,
        instance_id: int,
        client_settings: ClientSettings,
        broker: BrokerProfile,
        code_path: str | None,
        state_path: str | StateEndpoint | None,
        num_instances,
        shared_input: SharedInput | None,
        standby=None,
        keyed: KeyedParts | None = None,
        user: InstanceUser | None = None,
    ):
        """`standby` (a warm_pool.Standby of this function): run in that waiting interpreter, no spawn.
        `keyed` (a keyedState function): its input and its state are served by this worker. `user`: whom the
        code runs as (default: InstanceUser.resolve(), nobody for a root worker)."""
        self.instance_id = instance_id
        self._figures = InstanceStats(instance_id).figures()
        if standby is not None:
            self._stop, self._queue, self._proc = standby.stop_event, standby.stats_queue, standby.proc
            parent_conn = standby.input_parent
        else:
            piped = shared_input is not None or keyed is not None
            parent_conn, child_conn = self._ctx.Pipe() if piped else (None, None)
            self._stop = self._ctx.Event()
            self._queue = self._ctx.Queue()
            self._proc = self._ctx.Process(
                target=_process_main,
                name=f"{config.fqfn}:{instance_id}",
                daemon=True,
                args=(
                    config,
                    instance_id,
                    client_settings,
                    broker,
                    code_path,
                    state_path,
                    num_instances,
                    self._stop,
                    self._queue,
                    child_conn,
                    self._figures.start_time_ms,
                    user or InstanceUser.resolve(),
                ),
            )
        if keyed is not None:
            serve_keyed(parent_conn, keyed, f"{config.fqfn}:{instance_id}")
        elif shared_input is not None:
            threading.Thread(
                target=serve_pipe,
                args=(parent_conn, shared_input.lease()),
                name=f"{config.fqfn}:{instance_id}:input",
                daemon=True,
            ).start()
        if standby is not None:
            standby.activate(instance_id, self._figures.start_time_ms)
        else:
            self._proc.start()
        self._reader = threading.Thread(target=self._read_stats, daemon=True)
        self._reader.start()

    def _read_stats(self) -> None:
        while True:
            try:
                self._figures = self._queue.get(timeout=0.5)
            except queue.Empty:
                if not self._proc.is_alive():
                    return
            except (EOFError, OSError):
                return

    def figures(self) -> InstanceFigures:
        figures = self._figures
        code = self._proc.exitcode
        if code is not None and (figures.running or (code != 0 and not figures.error)):
            # Killed or exited without reporting why (os._exit, a signal): never "running" with frozen figures.
            return replace(figures, running=False, error=figures.error or f"instance process exited with code {code}")
        return figures

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float) -> bool:
        self._proc.join(timeout_s)
        if self._proc.is_alive():
            return False
        self._reader.join(1.0)
        return True

    def alive(self) -> bool:
        return self._proc.is_alive()

    def abandon(self) -> None:
        self._proc.kill()  # its connection closes with it, so the broker redelivers its messages
