"""The demo's image application (Russo Russo et al., ICPE'21, Sec. 5), in one place for the demo and the capacity
planner: images arrive on a source topic; `resize-store` resizes and stores them (a sink), `resize-recognize`
resizes them for `recognize`, a slow recognition-like model call. Service times are emulated by waiting (like a
call to a model server), so threads scale on two cores. The paper reports no service times; we chose resize 20 ms
(lognormal, cv 0.5: image sizes vary) and recognize 150 ms (lognormal, cv 1.0: inference time depends on
content)."""

from __future__ import annotations

from dataclasses import dataclass

NS = "public/default"
SLEEPY = "pulsar_autoscale.functions.examples.sleepy.Sleepy"


@dataclass(frozen=True)
class Stage:
    name: str
    inputs: tuple[str, ...]  # topic names under NS
    output: str
    service_ms: float
    cv: float

    def config(self, topic=lambda t: f"persistent://{NS}/{t}") -> dict:
        """Its FunctionConfig fields (no parallelism), each topic named by `topic`."""
        return {
            "tenant": NS.split("/")[0],
            "namespace": NS.split("/")[1],
            "name": self.name,
            "className": SLEEPY,
            "inputs": [topic(t) for t in self.inputs],
            "output": topic(self.output),
            "userConfig": {"service_ms": self.service_ms, "dist": "lognormal", "cv": self.cv},
        }


SOURCE, STORED, LABELS = "images", "stored", "labels"
STAGES = (
    Stage("resize-store", (SOURCE,), STORED, 20.0, 0.5),
    Stage("resize-recognize", (SOURCE,), "resized", 20.0, 0.5),
    Stage("recognize", ("resized",), LABELS, 150.0, 1.0),
)
PATHS = {STORED: "images -> resize-store", LABELS: "images -> resize-recognize -> recognize"}
