"""The fastest reaction a policy can have at the controller's period, for bench/burst_bound.py.

The first period that sees load above the base rate (or any backlog) goes straight to the cap;
otherwise queueing's answer,
plus `spare` instances kept on the slowest function at all times (capacity bought in advance). No causal policy sees a burst sooner or answers it with more, so its
p99 bounds what any policy can reach on the `burst` workload at that period.
"""

from __future__ import annotations

from dataclasses import dataclass

from pulsar_autoscale.policies import Policy, Proposal, load_policy


@dataclass(frozen=True)
class ReactMaxConfig:
    base_rate: float = 4.0  # the burst workload's stable rate, msg/s
    backlog: float = 20.0  # a backlog above this is a burst too
    max_parallelism: int = 15
    spare: int = 0  # extra instances always kept on the slowest function


class ReactMax(Policy):
    name = "react-max"
    Config = ReactMaxConfig

    def decide(self, graph, snapshot, current, state):
        answer = load_policy("queueing").decide(graph, snapshot, current, state)
        targets = dict(answer.targets)
        known = {fn: fs.service_rate for fn, fs in snapshot.functions.items() if fn in current and fs.service_rate}
        if known and self.config.spare:
            slowest = min(known, key=known.get)
            targets[slowest] = min(targets[slowest] + self.config.spare, self.config.max_parallelism)
        for fn in current:
            fs = snapshot.functions.get(fn)
            if fs and ((fs.arrival_rate or 0.0) > 1.5 * self.config.base_rate or (fs.backlog or 0.0) > self.config.backlog):
                targets[fn] = self.config.max_parallelism
        return Proposal(targets, answer.reasons, answer.state)
