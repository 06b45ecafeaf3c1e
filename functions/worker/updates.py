"""A hosted function's update: a change of parallelism alone is a diff of instance ids (parallelism.py); anything
else (code, userConfig, ...) restarts all its instances, as Pulsar does, once new code or a new entry point has
been validated in a child process outside the worker's lock.

A mixin of Worker (worker.py), whose lock, hosted functions, broker link, files, parallelism and warm pools it uses.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import TYPE_CHECKING

from pulsar_autoscale.broker.lite.function_limits import check_function
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.instance.validation import code_digest
from pulsar_autoscale.functions.keyed.scaler import KeyedScaler
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.model.errors import NotFound
from pulsar_autoscale.functions.worker.hosted import HostedFunction

if TYPE_CHECKING:
    from pulsar_autoscale.functions.worker.broker_link import BrokerLink
    from pulsar_autoscale.functions.worker.function_files import FunctionFiles
    from pulsar_autoscale.functions.worker.parallelism import Parallelism
    from pulsar_autoscale.functions.worker.warm_pools import WarmPools


class FunctionUpdates:
    if TYPE_CHECKING:  # Worker's (worker.py), which this mixin uses
        link: BrokerLink
        files: FunctionFiles
        max_parallelism: int
        _lock: threading.RLock
        _functions: dict[str, HostedFunction]
        _parallelism: Parallelism
        _pools: WarmPools

        def _get(self, fqfn: str) -> HostedFunction: ...

        def _validate(self, class_name: str, code_path: str | None, cfg: FunctionConfig) -> None: ...

    def update(self, fqfn: str, changes: dict, code: bytes | None = None, filename: str | None = None) -> FunctionConfig:
        self.link.require()
        with self._lock:
            fn = self._get(fqfn)
            new = self._merge(fn, changes, code)
            check_function(new, self.link.profile)  # a parallelism the broker cannot serve (B4, B11)
            if code is None and changes.get("py") not in (None, "", fn.config.py):
                raise ConfigError(
                    f"py {changes['py']!r} names a file on the worker's host: py may only name "
                    "uploaded code (send the file as the multipart `data` part)"
                )
            if code is None and new.className == fn.config.className and not fn.failure:
                return self._apply(fn, new, fn.code_path, fn.code_digest)
            code_path = fn.code_path
        # New code or a new entry point: validated in a child, outside the lock (other functions go on).
        if code is not None:
            code_path = self.files.stage_code(new, code, filename)
        try:
            self._validate(new.className, code_path, new)
        except BaseException:
            if code_path != fn.code_path:
                self.files.discard_code(new, code_path)
            raise
        with self._lock:
            if self._functions.get(fqfn) is not fn:
                self.files.discard_code(new, code_path)
                raise NotFound(f"Function {fqfn} was deleted while its update was validated")
            return self._apply(fn, self._merge(fn, changes, code), code_path, code_digest(code_path))

    def _merge(self, fn: HostedFunction, changes: dict, code: bytes | None) -> FunctionConfig:
        try:
            return fn.config.merged(changes, self.max_parallelism)
        except ConfigError as exc:
            if code is None or str(exc) != "Update contains no change":
                raise
            return fn.config

    def _apply(self, fn: HostedFunction, new: FunctionConfig, code_path: str | None, digest: str | None) -> FunctionConfig:
        """Switch the function to validated config and code (the saved config names the code: atomic)."""
        old, old_code = fn.config, fn.code_path
        only_parallelism = code_path == old_code and not fn.failure and replace(new, parallelism=old.parallelism) == old
        fn.config, fn.code_path, fn.code_digest, fn.failure = new, code_path, digest, ""
        self.files.save(fn)
        if old_code != code_path:
            self.files.discard_code(new, old_code)
        if only_parallelism:
            self._parallelism.scale(fn, new.parallelism)
        elif isinstance(fn.keyed, KeyedScaler):
            # One consumer feeds every instance: it reopens with the new config once the last old instance
            # has closed, so the new ones start then (started at once they would keep the old consumer open).
            fn.restarts = {i: n + 1 for i, n in fn.restarts.items()}
            fn.stopped = set()
            self._parallelism.drain(fn, sorted(fn.instances, reverse=True), then=lambda: self._start_after_update(fn))
        else:
            self._parallelism.scale(fn, 0)
            fn.restarts = {i: n + 1 for i, n in fn.restarts.items()}
            self._pools.renew(fn)
            self._parallelism.scale(fn, new.parallelism)
        return new

    def _start_after_update(self, fn: HostedFunction) -> None:
        with self._lock:
            if self._functions.get(fn.config.fqfn) is fn and not fn.instances and fn.config.parallelism > 0:
                self._parallelism.scale(fn, fn.config.parallelism)
