"""A user's policy in about 20 lines: one instance per `per_instance` messages of backlog.

With the controller's fast path on (`fast: {enabled: true}`), decide() is also called every second
or so with `snapshot.check == "fast"`: the backlog is then the consumers' own estimate (arrival
rate x wait), fresher than the broker's gauge; only scale-outs of functions falling behind are
applied and the returned state is dropped, so this policy needs no change. Set the class
attribute `fast = False` to be asked at the regular period only.

    pulsar-autoscale controller --config c.yaml   # with  policy: examples/policy_backlog_per_instance.py
                                                  #       policy_params: {per_instance: 200}
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pulsar_autoscale.policies import Policy, Proposal


@dataclass(frozen=True)
class BacklogConfig:
    per_instance: float = 100.0  # messages of backlog one instance is expected to absorb


class BacklogPerInstance(Policy):
    name = "backlog-per-instance"
    Config = BacklogConfig

    def decide(self, graph, snapshot, current, state):
        targets, reasons = {}, {}
        for fn, k in current.items():
            q = snapshot.functions[fn].backlog if fn in snapshot.functions else None
            if q is None:
                targets[fn], reasons[fn] = k, "backlog unknown: keep"
            else:
                targets[fn] = max(1, math.ceil(q / self.config.per_instance))
                reasons[fn] = f"backlog {q:.0f} / {self.config.per_instance:g} per instance"
        return Proposal(targets, reasons, state)
