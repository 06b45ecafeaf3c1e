"""The apps a live testbed runs: a LiveApp is its functions (upstream first, each a FunctionConfig, the py file
to upload where the worker cannot import it, the window of one that emits once per window), the topic the
producer feeds and the topic whose messages give the end-to-end latency. The built-in demo apps (sleepy, a chain of
them, the demo's image application) and the YAML spec of `plan --testbed live --app FILE` load here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pulsar_autoscale import image_app
from pulsar_autoscale.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "functions" / "examples"


@dataclass(frozen=True)
class LiveFunction:
    """One function of the app: its FunctionConfig fields (parallelism is the TestConfig's),
    for a function not importable on the worker the py file to upload, and for a function that
    emits what it gathered once per window, the window's length (its outputs arrive downstream in bursts)."""

    config: Mapping[str, Any]
    py: str | None = None
    window_s: float = 0.0

    @property
    def name(self) -> str:
        return str(self.config["name"])

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(_full(t) for t in self.config.get("inputs", ()))

    @property
    def output(self) -> str | None:
        out = self.config.get("output")
        return _full(out) if out else None

    @property
    def subscription(self) -> str:
        return str(
            self.config.get("subName")
            or f"{self.config.get('tenant', 'public')}/{self.config.get('namespace', 'default')}/{self.name}"
        )


@dataclass(frozen=True)
class LiveApp:
    """Functions upstream first; `source`: the topic the producer feeds; `sink`: the topic whose
    messages' event_timestamp gives the end-to-end latency."""

    name: str
    source: str
    sink: str
    functions: tuple[LiveFunction, ...]

    def __post_init__(self):
        if not self.functions:
            raise ConfigError(f"app {self.name}: no functions")
        names = [f.name for f in self.functions]
        if len(set(names)) != len(names):
            raise ConfigError(f"app {self.name}: function names repeat: {names}")
        if not any(self.source in f.inputs for f in self.functions):
            raise ConfigError(f"app {self.name}: no function reads the source topic {self.source}")

    def upstream(self, name: str) -> tuple[str, ...]:
        fn = next(f for f in self.functions if f.name == name)
        return tuple(g.name for g in self.functions if g.output and g.output in fn.inputs)


def _full(topic: str) -> str:
    return topic if "://" in topic else f"persistent://public/default/{topic}"


def sleepy_app(service_ms: float = 20.0, stages: int = 1, tag: str | None = None) -> LiveApp:
    """The built-in demo: a chain of sleepy.py functions with a deterministic service time, so its
    capacity is known (parallelism / service time per stage on the thread runtime: it sleeps, so
    threads scale past the cores). Topics get a fresh tag, so runs never share a backlog; function names
    are plain (sleepy, or sleepy0, sleepy1, ...) for --parallelism, and a leftover of that name is replaced."""
    tag = tag or uuid.uuid4().hex[:6]
    topics = [f"persistent://public/default/plan-{tag}-{i}" for i in range(stages + 1)]
    fns = tuple(
        LiveFunction(
            {
                "tenant": "public",
                "namespace": "default",
                "name": "sleepy" if stages == 1 else f"sleepy{i}",
                "className": "pulsar_autoscale.functions.examples.sleepy.Sleepy",
                "inputs": [topics[i]],
                "output": topics[i + 1],
                "instanceRuntime": "thread",
                "userConfig": {"service_ms": service_ms, "dist": "deterministic"},
            }
        )
        for i in range(stages)
    )
    return LiveApp(f"sleepy-{service_ms:g}ms" + (f"-x{stages}" if stages > 1 else ""), topics[0], topics[-1], fns)


def images_app(tag: str | None = None) -> LiveApp:
    """The demo's image application (pulsar_autoscale/image_app.py), its topics tagged; latency is measured on the
    longer path (images -> resize-recognize -> recognize)."""
    tag = tag or uuid.uuid4().hex[:6]

    def topic(name: str) -> str:
        return f"persistent://{image_app.NS}/plan-{tag}-{name}"

    fns = tuple(LiveFunction({**s.config(topic), "instanceRuntime": "thread"}) for s in image_app.STAGES)
    return LiveApp("images", topic(image_app.SOURCE), topic(image_app.LABELS), fns)


BUILTIN = {"sleepy": lambda: sleepy_app(20.0), "sleepy-chain": lambda: sleepy_app(20.0, stages=2), "images": images_app}


def load_live_app(spec: str) -> LiveApp:
    """A built-in demo app (sleepy, sleepy-chain, sleepy:MS for another service time, or images: the demo's) or a
    YAML file:

        name: my-app
        source: persistent://public/default/in
        sink: persistent://public/default/out
        functions:            # upstream first; FunctionConfig fields, `py` (optional) a file to upload,
                              # `window_s` (optional) the window of a function that emits once per window
          - {name: f1, className: sleepy.Sleepy, py: functions/examples/sleepy.py,
             inputs: [in], output: mid, userConfig: {service_ms: 20, dist: deterministic}}
    """
    if spec in BUILTIN:
        return BUILTIN[spec]()
    if spec.startswith("sleepy:"):
        try:
            return sleepy_app(float(spec.split(":", 1)[1]))
        except ValueError:
            raise ConfigError(f"--app {spec!r}: use sleepy:MS with MS the service time in ms") from None
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"--app {spec!r}: not a built-in live app ({', '.join(BUILTIN)}, sleepy:MS) nor a YAML file")
    import yaml

    doc = yaml.safe_load(path.read_text()) or {}
    try:
        fns = []
        for raw in doc["functions"]:
            cfg = {"tenant": "public", "namespace": "default", **{k: v for k, v in raw.items() if k not in ("py", "window_s")}}
            py = raw.get("py")
            if py and not Path(py).is_absolute():
                py = str((path.parent / py) if (path.parent / py).is_file() else Path(py))
            window = raw.get("window_s", 0)
            if isinstance(window, bool) or not isinstance(window, (int, float)) or window < 0:
                raise ConfigError(
                    f"{spec}: function {raw.get('name')!r}: window_s must be a number of seconds >= 0, got {window!r}"
                )
            fns.append(LiveFunction(cfg, py, float(window)))
        return LiveApp(str(doc.get("name", path.stem)), _full(doc["source"]), _full(doc["sink"]), tuple(fns))
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{spec}: an app needs source, sink and functions with name, className, inputs ({exc})") from None
