"""Per-function autoscaler controls: pause, bounds, policy, dry run, scale-to-zero idle time.

Three layers, the later wins field by field:

1. controller.yaml: `plan` defaults and `bounds` patterns, `policy`, `dry_run`;
2. the function's own config: `customRuntimeOptions` is a JSON string (Pulsar's free-form field),
   its key `autoscale` holds controls, e.g. `{"autoscale": {"min": 0, "max": 4}}`. They travel
   with the function (export, re-create, another cluster) and change with `functions update`;
3. what an operator set through the controller's API (`pulsar-autoscale autoscaler set|pause`).

Operator controls are kept on a Pulsar topic (`<lock_topic>-controls`, one JSON record per change,
keyed by function), read from the start by every replica, like the leader epochs: a replica that
takes over after a failover sees every pause and override. Not in the function's config: on stock
Pulsar any function update restarts all its instances, and a pause must not cost a restart.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

import pulsar

from pulsar_autoscale.configparse import from_mapping
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.pulsar_client import open_client

log = logging.getLogger(__name__)
READ_TIMEOUT_MS = 50  # a caught-up reader waits this long to learn there is nothing more
FIRST_READ_TIMEOUT_MS = 500  # the first read of a topic may have to create it


@dataclass(frozen=True)
class FunctionControls:
    """One layer of controls for one function; None: not set here, a lower layer decides."""

    paused: bool | None = None  # left as it is, whatever the policy says
    min: int | None = None  # 0 allows scale to zero (our worker only)
    max: int | None = None
    policy: str | None = None  # another policy for this function: entry-point name or .py path
    policy_params: dict | None = None
    dry_run: bool | None = None  # recommend only, for this function
    idle_s: float | None = None  # scale to zero after this long with an empty backlog (min 0)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str) -> "FunctionControls":
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: controls must be a mapping of option: value, got {data!r}")
        controls = from_mapping(cls, data, source)
        for name in ("min", "max"):
            value = getattr(controls, name)
            if value is not None and value < 0:
                raise ConfigError(f"{source}: {name} must be >= 0, got {value}")
        if controls.max is not None and controls.max < 1:
            raise ConfigError(f"{source}: max must be >= 1, got {controls.max}")
        if controls.min is not None and controls.max is not None and controls.min > controls.max:
            raise ConfigError(f"{source}: min {controls.min} is above max {controls.max}")
        if controls.idle_s is not None and controls.idle_s < 0:
            raise ConfigError(f"{source}: idle_s must be >= 0 seconds, got {controls.idle_s}")
        return controls

    def over(self, lower: "FunctionControls") -> "FunctionControls":
        """This layer on top of a lower one."""
        return FunctionControls(
            **{
                f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(lower, f.name)
                for f in fields(self)
            }
        )

    def changed(self, update: Mapping[str, Any], source: str) -> "FunctionControls":
        """These controls with `update` applied: a given value replaces, None clears the field."""
        FunctionControls.from_mapping(update, source)  # names and types of the update itself
        merged = self.set_fields()
        for key, value in update.items():
            key = str(key).replace("-", "_")
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return FunctionControls.from_mapping(merged, source)

    def set_fields(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def declared(config: Mapping[str, Any]) -> FunctionControls:
    """The controls a function's config declares in customRuntimeOptions' `autoscale` key."""
    fqfn = f"{config.get('tenant')}/{config.get('namespace')}/{config.get('name')}"
    raw = config.get("customRuntimeOptions")
    if not raw:
        return FunctionControls()
    try:
        options = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{fqfn}: customRuntimeOptions is not JSON ({exc}), so its autoscale controls cannot be read") from exc
    if not isinstance(options, dict) or "autoscale" not in options:
        return FunctionControls()
    return FunctionControls.from_mapping(options["autoscale"], f"{fqfn} customRuntimeOptions.autoscale")


@dataclass(frozen=True)
class Effective:
    """What applies to one function, and which layer each value came from."""

    function: str
    paused: bool
    min: int
    max: int
    policy: str
    policy_params: dict
    dry_run: bool
    idle_s: float
    sources: dict = field(default_factory=dict)  # field -> controller | function config | operator
    notes: tuple[str, ...] = ()


def effective(
    function: str, base: FunctionControls, config_layer: FunctionControls, operator: FunctionControls, stock: bool
) -> Effective:
    """The three layers resolved; stock Pulsar refuses parallelism 0, so there min stays at least 1."""
    layers = (("operator", operator), ("function config", config_layer), ("controller", base))
    values, sources = {}, {}
    for f in fields(FunctionControls):
        for source, layer in layers:
            if getattr(layer, f.name) is not None:
                values[f.name], sources[f.name] = getattr(layer, f.name), source
                break
    notes = []
    lo, hi = values["min"], values["max"]
    if stock and lo == 0:
        notes.append(f"min 0 ({sources['min']}) ignored: stock Pulsar refuses parallelism 0, min stays 1")
        lo = 1
    if lo > hi:
        notes.append(f"min {lo} ({sources['min']}) above max {hi} ({sources['max']}): max wins")
        lo = hi
    return Effective(
        function,
        bool(values["paused"]),
        lo,
        hi,
        values["policy"],
        dict(values["policy_params"] or {}),
        bool(values["dry_run"]),
        float(values["idle_s"]),
        sources,
        tuple(notes),
    )


class ControlStore:
    """Operator controls on a Pulsar topic: every replica reads it from the start and follows it;
    a change is produced there first, so a replica that leads later knows it."""

    def __init__(self, service_url, topic: str, identity: str):
        self.topic = topic
        self.identity = identity
        self._client = open_client(service_url, operation_timeout_seconds=5)
        self._reader: pulsar.Reader | None = None
        self._producer: pulsar.Producer | None = None
        self._controls: dict[str, FunctionControls] = {}
        self._lock = threading.Lock()

    def refresh(self) -> dict[str, FunctionControls]:
        """Read what other replicas (or this one) wrote since the last call."""
        with self._lock:
            timeout = READ_TIMEOUT_MS
            if self._reader is None:
                self._reader = self._client.create_reader(self.topic, pulsar.MessageId.earliest)
                timeout = FIRST_READ_TIMEOUT_MS
            try:
                while True:
                    self._apply(self._reader.read_next(timeout_millis=timeout))
                    timeout = READ_TIMEOUT_MS
            except pulsar.Timeout:
                pass
            return dict(self._controls)

    def _apply(self, msg) -> None:
        try:
            record = json.loads(msg.data())
            self._controls[record["function"]] = FunctionControls.from_mapping(record["controls"], self.topic)
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            log.error("skipping an unreadable record on %s: %s", self.topic, exc)

    def known(self) -> dict[str, FunctionControls]:
        """As last read, without reading."""
        with self._lock:
            return dict(self._controls)

    def get(self, function: str) -> FunctionControls:
        return self.refresh().get(function, FunctionControls())

    def put(self, function: str, controls: FunctionControls) -> None:
        record = {"function": function, "controls": controls.set_fields(), "by": self.identity, "time": time.time()}
        with self._lock:
            if self._producer is None:
                self._producer = self._client.create_producer(self.topic)
            self._producer.send(json.dumps(record).encode(), partition_key=function)
        self.refresh()

    def close(self) -> None:
        try:
            self._client.close()
        except pulsar.PulsarException:
            pass
