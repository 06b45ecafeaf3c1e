"""A simulated testbed that can be wrong the ways real deployments are, so the planner can be checked
at scales this machine cannot run live.

A fluid (rate-based) model, not a discrete-event one: a capacity-planning run asks "does this
deployment keep up with rate r", which depends on every resource's utilization at r, and a fluid
model answers it in microseconds for hundreds of instances. What it models:

- per-function parallelism; instances placed round-robin on workers (`slots_per_worker` each,
  the worker count rises with instances as task slots do), processor sharing of a worker's cores;
- the thread runtime's interpreter lock: one per worker, shared by all its instances' Python
  work (the function's CPU and the per-message overhead), with a hand-off cost that grows with
  the number of threads that contend for it; time a thread waits for the lock counts as busy time
  (as it does in a live worker), so DS2's "true rate" is biased where the lock is contended;
- keys drawn Zipf over key groups, key groups owned in contiguous blocks (the worker's
  KeyGroupAssignment.uniform): the instance with the hot key group caps the function;
- windowed functions: each instance holds its keys' state and emits it at every window's end,
  a CPU stall that shrinks with parallelism, and a burst of outputs that the next function drains
  (a backlog that comes and goes with the window phase; a p99 that includes the drain);
- fan-in joins against a broadcast side stream's window: per-message cost grows with that
  stream's rate, so the join scales like sqrt(instances).

Noise: each run's capacity and readings vary (normal, `noise` relative), the producer has a
maximum rate, and key-group counts are Poisson. Deterministic per seed: a run's random draws
depend only on (seed, config, rate), not on which runs came before.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.planning.testbed import FunctionMeasure, InstanceMeasure, Phases, RunResult, TestConfig

LN100 = math.log(100.0)


@dataclass(frozen=True)
class SimFn:
    name: str
    upstream: tuple[str, ...] = ()  # functions whose outputs feed this one
    source_share: float = 0.0  # share of the injected source rate published to its input
    selectivity: float = 1.0  # outputs per input
    cpu_s: float = 0.001  # Python CPU per message (holds the interpreter lock)
    wait_s: float = 0.0  # per message with the lock released (I/O, a model server, native code)
    overhead_s: float = 0.0002  # the runtime's per-message CPU (receive, deserialize, ack), under the lock
    key_groups: int = 0  # > 0: keyed, keys Zipf over this many key groups
    zipf_s: float = 0.0
    window_s: float = 0.0  # > 0: windowed, emits every window_s
    window_keys: int = 0  # keys held in a window's state (over all instances)
    emit_cost_s: float = 0.0  # CPU per key at a window's end
    join_with: str | None = None  # a fan-in join: matched against this function's outputs over join_window_s
    join_window_s: float = 0.0
    join_cost_s: float = 0.0  # CPU per match


@dataclass(frozen=True)
class SimCluster:
    runtime: str = "process"  # thread: one interpreter lock per worker; process: none
    cores_per_worker: int = 4
    slots_per_worker: int = 4  # instances per worker: workers = ceil(instances / slots)
    lock_contention: float = 0.05  # extra lock hand-off cost per additional thread on a worker
    producer_max_rate: float = 1e9  # the load generator's own limit, source messages/s
    noise: float = 0.004  # relative run-to-run variation of capacity and readings
    buffer_msgs: float = 2000.0  # what empty prefetch queues absorb at first (warm-up overshoot)

    def __post_init__(self):
        if self.runtime not in ("thread", "process"):
            raise ConfigError(f"runtime {self.runtime!r}: use thread or process")


@dataclass(frozen=True)
class SimPlanApp:
    name: str
    functions: tuple[SimFn, ...]
    cluster: SimCluster = field(default_factory=SimCluster)
    about: str = ""


@dataclass(frozen=True)
class _Layout:
    fn: np.ndarray  # per instance: function index
    share: np.ndarray  # per instance: share of its function's input
    worker: np.ndarray  # per instance: worker index
    threads: np.ndarray  # per worker: instances on it
    workers: int


def _zipf(groups: int, s: float, name: str) -> np.ndarray:
    """Key-group weights: Zipf over groups, hot groups at places fixed by the function's name (keys
    hash to groups, so the hot one is anywhere), not by the run's seed."""
    w = 1.0 / np.arange(1, groups + 1) ** s
    perm = np.random.default_rng(zlib.crc32(name.encode())).permutation(groups)
    out = np.empty(groups)
    out[perm] = w / w.sum()
    return out


def block_shares(weights: np.ndarray, k: int) -> np.ndarray:
    """Each instance's share when instance i owns groups [ceil(i*G/k), ceil((i+1)*G/k)) (the worker's
    KeyGroupAssignment.uniform; owner of group g is g*k//G)."""
    g = len(weights)
    owners = (np.arange(g) * k) // g
    return np.bincount(owners, weights=weights, minlength=k)


class SimTestbed:
    """The Testbed protocol over the fluid model; `true_mst` is the ground truth for validation only."""

    def __init__(self, app: SimPlanApp, seed: int = 0):
        self.app, self.seed = app, seed
        self.name = f"sim:{app.name}"
        self.max_rate = app.cluster.producer_max_rate
        self._fns = {f.name: f for f in app.functions}
        self._order = tuple(f.name for f in app.functions)
        for f in app.functions:
            for u in f.upstream + ((f.join_with,) if f.join_with else ()):
                if u not in self._fns:
                    raise ConfigError(f"{app.name}: {f.name} reads {u}, which is not a function of the app")
            if not f.upstream and f.source_share <= 0:
                raise ConfigError(f"{app.name}: {f.name} has no input (no upstream, source_share 0)")
        self._weights = {f.name: _zipf(f.key_groups, f.zipf_s, f.name) for f in app.functions if f.key_groups}
        self.runs = 0
        self.testbed_s = 0.0

    @property
    def slots_per_worker(self) -> int:
        """Instances per worker (its default placement: ceil(instances / slots) workers, round-robin);
        `TestConfig.workers` overrides the worker count (the planner's worker probe)."""
        return self.app.cluster.slots_per_worker

    # ---- Testbed protocol ----------------------------------------------------------------------------
    def functions(self) -> tuple[str, ...]:
        return self._order

    def upstream(self, function: str) -> tuple[str, ...]:
        return self._fns[function].upstream

    def window_s(self, function: str) -> float:
        return self._fns[function].window_s

    def run(self, rate: float, config: TestConfig, phases: Phases = Phases()) -> RunResult:
        self.runs += 1
        self.testbed_s += phases.total_s
        return self._run(rate, config, phases, phases.observe_s, phases.total_s, phase0=phases.cooldown_s + phases.ramp_s)

    def warmup(self, rate: float, config: TestConfig, seconds: float) -> RunResult:
        """Empty buffers absorb more than the MST at first: the observed rate overshoots by what the
        prefetch queues hold, spread over the warm-up (StreamBed's observation)."""
        self.testbed_s += seconds
        r = self._run(rate, config, Phases(0, 0, seconds), seconds, seconds, phase0=0.0)
        absorbed = min(r.injected_rate, r.processed_rate + self.app.cluster.buffer_msgs / max(seconds, 1.0))
        return RunResult(r.target_rate, r.injected_rate, absorbed, r.p99_s, seconds, seconds, r.functions, r.workers, "warm-up")

    # ---- the model -----------------------------------------------------------------------------------
    def workers_for(self, config: TestConfig) -> int:
        return config.workers or max(1, math.ceil(config.instances / self.app.cluster.slots_per_worker))

    def _layout(self, config: TestConfig) -> _Layout:
        return self._layout_cached(config.key())

    @lru_cache(maxsize=512)
    def _layout_cached(self, key: tuple) -> _Layout:
        par = dict(key[0])
        config = TestConfig(par, key[1])
        for name in self._order:
            if par.get(name, 0) < 1:
                raise ConfigError(f"{self.app.name}: {name} needs parallelism >= 1, got {par.get(name)}")
        workers = self.workers_for(config)
        fn, share = [], []
        for j, name in enumerate(self._order):
            k = par[name]
            fn += [j] * k
            share.append(block_shares(self._weights[name], k) if name in self._weights else np.full(k, 1.0 / k))
        fn_a = np.asarray(fn)
        worker = np.arange(len(fn_a)) % workers
        return _Layout(fn_a, np.concatenate(share), worker, np.bincount(worker, minlength=workers), workers)

    def rates(self, r: float) -> tuple[np.ndarray, np.ndarray]:
        """Input and output rate per function (in order) at source rate r."""
        lam: dict[str, float] = {}
        out: dict[str, float] = {}
        for f in self.app.functions:
            lam[f.name] = r * f.source_share + sum(out[u] for u in f.upstream)
            out[f.name] = lam[f.name] * f.selectivity
        return (np.array([lam[n] for n in self._order]), np.array([out[n] for n in self._order]))

    def _demands(self, r: float, lay: _Layout):
        """Per instance at source rate r: messages/s, lock-held CPU s/s, instance time s/s; per function
        the per-message service time; per worker the lock and core utilization."""
        lam, out = self.rates(r)
        idx = {n: j for j, n in enumerate(self._order)}
        lock_s = np.empty(len(self._order))
        time_s = np.empty(len(self._order))
        for j, f in enumerate(self.app.functions):
            join = f.join_cost_s * out[idx[f.join_with]] * f.join_window_s if f.join_with else 0.0
            lock_s[j] = f.cpu_s + f.overhead_s + join
            time_s[j] = lock_s[j] + f.wait_s
        x = lam[lay.fn] * lay.share
        emit = np.zeros(len(x))
        for j, f in enumerate(self.app.functions):
            if f.window_s > 0:
                sel = lay.fn == j
                emit[sel] = f.window_keys * lay.share[sel] * f.emit_cost_s / f.window_s
        lock = x * lock_s[lay.fn] + emit
        cl = self.app.cluster
        per_worker = np.bincount(lay.worker, weights=lock, minlength=lay.workers)
        core_u = per_worker / cl.cores_per_worker
        wait = np.zeros(len(x))
        if cl.runtime == "thread":
            handoff = 1 + cl.lock_contention * (lay.threads - 1)
            lock_u = per_worker * handoff
            wait = _lock_waits(x, lock_s[lay.fn] * handoff[lay.worker], lay)
        else:
            lock_u = np.zeros(lay.workers)
        # time waiting for a contended lock is spent inside process(): busy time, as in a live worker
        busy = x * (time_s[lay.fn] + wait) + emit
        return lam, out, x, lock, busy, core_u, lock_u, time_s, wait

    def utilization(self, r: float, config: TestConfig) -> tuple[float, int]:
        """The highest utilization of any resource at source rate r, and the function it binds
        (for a worker's lock or cores: the function with most lock demand there)."""
        lay = self._layout(config)
        _, _, _, lock, busy, core_u, lock_u, _, _ = self._demands(r, lay)
        worst_w = np.maximum(core_u, lock_u)
        i = int(np.argmax(busy))
        w = int(np.argmax(worst_w))
        if busy[i] >= worst_w[w]:
            return float(busy[i]), int(lay.fn[i])
        on_w = np.where(lay.worker == w)[0]
        demand = np.bincount(lay.fn[on_w], weights=lock[on_w], minlength=len(self._order))
        return float(worst_w[w]), int(np.argmax(demand))

    def true_mst(self, config: TestConfig) -> float:
        """The exact sustainable source rate of `config` (ground truth; the planner never calls it)."""
        return self._true_mst(config.key())

    @lru_cache(maxsize=4096)
    def _true_mst(self, key: tuple) -> float:
        config = TestConfig(dict(key[0]), key[1])
        hi = 1.0
        while self.utilization(hi, config)[0] < 1.0:
            hi *= 2.0
            if hi > 1e9:
                return hi
        lo = 0.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if self.utilization(mid, config)[0] < 1.0:
                lo = mid
            else:
                hi = mid
        return lo

    def _rng(self, rate: float, config: TestConfig, observe_s: float) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(repr((config.key(), round(rate, 6), observe_s)).encode())])

    def _run(
        self, rate: float, config: TestConfig, phases: Phases, observe_s: float, duration_s: float, phase0: float
    ) -> RunResult:
        cl = self.app.cluster
        rng = self._rng(rate, config, observe_s)
        noise = cl.noise
        lay = self._layout(config)
        producer = cl.producer_max_rate * (1 + rng.normal(0, 0.002))
        injected = min(rate, producer) * (1 + rng.normal(0, 0.0003))
        cap = self.true_mst(config) * (1 + rng.normal(0, noise))
        kept = min(injected, cap)
        lam_in, _ = self.rates(injected)
        lam_x, out_x = self.rates(kept)
        grow = np.zeros(len(self._order))
        downstream_of_b: set[int] = set()
        if injected > cap:
            _, b = self.utilization(injected, config)
            grow[b] = (lam_in[b] - lam_x[b]) * observe_s
            downstream_of_b = self._downstream(b)
        lam_seen = np.where([j in downstream_of_b or grow[j] > 0 for j in range(len(self._order))], lam_x, lam_in)
        _, _, x, lock, busy, core_u, lock_u, time_s, wait = self._demands(kept, lay)
        busy_s = np.minimum(busy * observe_s, observe_s)
        functions = {}
        p99 = {}
        for j, f in enumerate(self.app.functions):
            sel = lay.fn == j
            k = int(sel.sum())
            jitter = 1 + rng.normal(0, noise / 4)
            processed = lam_x[j] * jitter
            insts = tuple(
                InstanceMeasure(
                    processed=float(xi * observe_s * jitter),
                    busy_s=float(b),
                    cpu_s=float(c * observe_s),
                    arrived=float(xi * observe_s),
                )
                for xi, b, c in zip(x[sel], busy_s[sel], lock[sel])
            )
            counts = None
            if f.name in self._weights:
                counts = tuple(float(c) for c in rng.poisson(self._weights[f.name] * lam_x[j] * observe_s))
            p99[j], bursts = self._p99(j, lay, busy, time_s, wait, lam_x, out_x, observe_s)
            backlog0 = backlog1 = 0.0
            for burst, drain, window in bursts:
                backlog0 += _residual(burst, drain, phase0 % window)
                backlog1 += _residual(burst, drain, (phase0 + observe_s) % window)
            base = abs(rng.normal(0, 2.0))
            functions[f.name] = FunctionMeasure(
                parallelism=k,
                arrival_rate=float(lam_seen[j] if grow[j] == 0 else lam_in[j]),
                processed_rate=float(processed),
                output_rate=float(processed * f.selectivity),
                backlog_start=backlog0 + base,
                backlog_end=backlog1 + base + float(grow[j]) + abs(rng.normal(0, 2.0)),
                instances=insts,
                key_group_counts=counts,
            )
        path = self._longest_path(p99)
        processed_rate = kept * (1 + rng.normal(0, noise / 4))
        return RunResult(
            target_rate=rate,
            injected_rate=float(injected),
            processed_rate=float(processed_rate),
            p99_s=float(observe_s if injected > cap else path),
            observe_s=observe_s,
            duration_s=duration_s,
            functions=functions,
            workers=lay.workers,
        )

    def _bursts(self, j: int, lam_x: np.ndarray, out_x: np.ndarray, hot: float) -> list[tuple[float, float, float]]:
        """(messages, seconds to drain them, window) of each burst a windowed upstream sends function j at
        every window's end."""
        out = []
        for u in self._fns[self._order[j]].upstream:
            window = self._fns[u].window_s
            if window > 0:
                burst = out_x[self._order.index(u)] * window
                out.append((burst, burst / max(lam_x[j] / max(hot, 1e-9), 1e-9), window))
        return out

    def _p99(
        self,
        j: int,
        lay: _Layout,
        busy: np.ndarray,
        time_s: np.ndarray,
        wait: np.ndarray,
        lam_x: np.ndarray,
        out_x: np.ndarray,
        horizon_s: float,
    ) -> tuple[float, list[tuple[float, float, float]]]:
        """Function j's p99: an M/M/1 wait at its hottest instance's utilization (`horizon_s` once it cannot
        keep up), plus the drain of the bursts it receives; and those bursts (`_bursts`)."""
        sel = lay.fn == j
        hot = float(np.max(busy[sel]))
        service = float(time_s[j] + np.max(wait[sel]))
        queue = service * LN100 / max(1 - min(hot, 0.999), 1e-3) if hot < 1 else horizon_s
        bursts = self._bursts(j, lam_x, out_x, hot)
        return queue + max((drain for _, drain, _ in bursts), default=0.0), bursts

    def p99(self, rate: float, config: TestConfig, horizon_s: float = 600.0) -> float:
        """The longest path's p99 at `rate`, without run-to-run noise (ground truth; the planner never calls it)."""
        lay = self._layout(config)
        lam_x, out_x = self.rates(rate)
        _, _, _, _, busy, _, _, time_s, wait = self._demands(rate, lay)
        return self._longest_path(
            {j: self._p99(j, lay, busy, time_s, wait, lam_x, out_x, horizon_s)[0] for j in range(len(self._order))}
        )

    def _downstream(self, j: int) -> set[int]:
        name = self._order[j]
        out: set[int] = set()
        for i, f in enumerate(self.app.functions):
            if name in f.upstream:
                out |= {i} | self._downstream(i)
        return out

    def _longest_path(self, p99: dict[int, float]) -> float:
        best: dict[str, float] = {}
        for j, f in enumerate(self.app.functions):
            best[f.name] = p99[j] + max((best[u] for u in f.upstream), default=0.0)
        return max(best.values())


def _lock_waits(x: np.ndarray, hold: np.ndarray, lay: _Layout) -> np.ndarray:
    """Seconds per message each thread waits for its worker's interpreter lock, from its rate `x` and
    its hold per message. A thread that asks for the lock waits for the rest of the holder's hold (half
    of it, on average) and the whole hold of each thread waiting before it; by Little's law a thread
    holds the lock rate x hold of the time and waits for it rate x wait. A closed system: a thread
    waits at most about one hold of every other thread on its worker, never the unbounded queue of an
    open model, since there are no more contenders than threads. Solved by damped iteration."""
    wait = np.zeros(len(x))
    for _ in range(200):
        held = np.minimum(1.0, x * hold)
        waiting = np.minimum(1.0 - held, x * wait)
        ahead = held * hold / 2 + waiting * hold  # the holder's remaining half, each waiter's whole hold
        others = np.bincount(lay.worker, weights=ahead, minlength=lay.workers)[lay.worker] - ahead
        if np.allclose(others, wait, rtol=1e-6, atol=1e-9):
            break
        wait = (wait + others) / 2
    return wait


def _residual(burst: float, drain_s: float, phase: float) -> float:
    """Messages of a window's burst still waiting `phase` seconds after it arrived."""
    if drain_s <= 0 or phase >= drain_s:
        return 0.0
    return burst * (1 - phase / drain_s)


# ---- five apps that do not scale the same way -------------------------------------------------------------

APPS: dict[str, SimPlanApp] = {
    "linear": SimPlanApp(
        "linear",
        (
            SimFn("ingest", source_share=1.0, cpu_s=0.0008, wait_s=0.0010),
            SimFn("enrich", ("ingest",), cpu_s=0.0010, wait_s=0.0040),
            SimFn("store", ("enrich",), cpu_s=0.0005, wait_s=0.0030),
        ),
        SimCluster(runtime="process", cores_per_worker=8, slots_per_worker=4),
        about="control: process runtime, cores to spare, no keys: scales linearly",
    ),
    "interpreter": SimPlanApp(
        "interpreter",
        (
            SimFn("decode", source_share=1.0, cpu_s=0.0015, wait_s=0.0010),
            SimFn("score", ("decode",), cpu_s=0.0020, wait_s=0.0150),
            SimFn("publish", ("score",), cpu_s=0.0010, wait_s=0.0020),
        ),
        SimCluster(runtime="thread", cores_per_worker=4, slots_per_worker=8, lock_contention=0.06),
        about="thread runtime: one interpreter lock per worker caps what its threads do",
    ),
    "zipf": SimPlanApp(
        "zipf",
        (
            SimFn("parse", source_share=1.0, cpu_s=0.0005, wait_s=0.0005),
            SimFn("count", ("parse",), cpu_s=0.0020, wait_s=0.0060, key_groups=1024, zipf_s=0.8),
        ),
        SimCluster(runtime="process", cores_per_worker=8, slots_per_worker=4),
        about="keys Zipf over 1024 key groups: the instance with the hot group caps count",
    ),
    "windowed": SimPlanApp(
        "windowed",
        (
            SimFn("ingest", source_share=1.0, cpu_s=0.0005, wait_s=0.0005),
            SimFn(
                "aggregate",
                ("ingest",),
                selectivity=0.2,
                cpu_s=0.0010,
                wait_s=0.0005,
                window_s=10.0,
                window_keys=200_000,
                emit_cost_s=0.00003,
            ),
            SimFn("alert", ("aggregate",), cpu_s=0.0010, wait_s=0.0080),
        ),
        SimCluster(runtime="process", cores_per_worker=8, slots_per_worker=4),
        about="a 10 s window over 200k keys: emission stalls shrink with parallelism; bursts downstream",
    ),
    "fanin": SimPlanApp(
        "fanin",
        (
            SimFn("clicks", source_share=0.7, cpu_s=0.0005, wait_s=0.0010),
            SimFn("impressions", source_share=0.3, cpu_s=0.0005, wait_s=0.0010),
            SimFn(
                "join",
                ("clicks", "impressions"),
                cpu_s=0.0010,
                wait_s=0.0010,
                join_with="impressions",
                join_window_s=2.0,
                join_cost_s=0.000002,
            ),
        ),
        SimCluster(runtime="process", cores_per_worker=8, slots_per_worker=4),
        about="a fan-in join matched against the impressions of the last 2 s: cost per message grows with rate",
    ),
}


def load_app(name: str) -> SimPlanApp:
    try:
        return APPS[name]
    except KeyError:
        raise ConfigError(f"unknown planning app {name!r}: use one of {', '.join(APPS)}") from None
