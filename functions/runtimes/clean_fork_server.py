"""Imported by the process runtime's fork server only (handles._process_context preloads it): the server and
every instance forked from it start without the worker's credential variables, also in /proc/self/environ."""

import os
import signal
import threading
import time

from pulsar_autoscale.functions.instance.instance_user import scrub_environment

scrub_environment()


_WORKER = os.getppid()  # the worker that started this server


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _die_with_the_worker() -> None:
    """In every process forked from the server (an instance, a warm standby): SIGKILL itself once the worker that
    started the server is gone (even by kill -9: the server is then reparented; it stays up while its children hold
    its alive pipe). An instance left running would go on consuming beside the restarted worker's instances (on
    Apache Pulsar a process instance subscribes to its input itself; on pulsar-lite its piped input ends)."""
    server = os.getppid()

    def watch() -> None:
        while _parent_of(server) == _WORKER:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-the-worker", daemon=True).start()


os.register_at_fork(after_in_child=_die_with_the_worker)
