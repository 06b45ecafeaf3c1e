"""Burst drain: a Spark batch job that takes a bounded slice of a function's backlog and runs it.

When a function's backlog is more than its instances can clear before a deadline (even at
their maximum parallelism, once new instances have started), the controller hands part of
it to Spark, as Sponge hands bursts to serverless instances (papers/000, "Recovery
deadline"): `pulsar_autoscale.controller.burst_plan` says how many messages (the controller asks our
worker for a drain when `burst.enabled`), `BurstDrain.run` drains them.

The slice is taken **through the function's own subscription**, so its acknowledgement is
real and the instances never see it again:

1. the driver joins the function's Shared subscription as one more consumer and receives up
   to `max_messages` (the slice);
2. the payloads, keys, properties and event times go to `partitions` Spark tasks; each runs
   the function's own `process()` (loaded with `load_callable`, with an `InstanceContext`)
   and produces every result to the output topic carrying the source message's event time
   and key, as the runtime does, then flushes and checks every send;
3. only then does the driver acknowledge, on the subscription, each message whose output is
   persisted; a message whose `process()` raised or whose send failed is negative-acked;
   if the Spark job fails, every message of the slice is negative-acked. Then it closes, and
   whatever the consumer prefetched beyond the slice goes back to the instances.

Delivery is at-least-once, like the runtime's ATLEAST_ONCE: a Spark task retried after it
produced, or a message nacked after its output was sent, yields a duplicate output; nothing
is lost. Only Shared subscriptions are drained: a Failover or Key_Shared function keeps
(per-key) order, which parallel partitions would break.

pulsar-lite (docs/dev/pulsar-lite-defects.md, B2): the driver's client is a second connection on the
subscription and its consumer ids start at 0, colliding with the worker's.
`lite.incarnation.join_shared_subscription` gives the driver consumer ids of its own; it is used only
where the broker profile asks for consumer-id floors (pulsar-lite).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, cast

import pulsar

from pulsar_autoscale.broker.lite.incarnation import LiteJoinError, join_shared_subscription
from pulsar_autoscale.broker.profile import BrokerProfile, resolve
from pulsar_autoscale.errors import ConfigError, PulsarAutoscaleError
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.model.files import write_atomically
from pulsar_autoscale.functions.runtimes.piped_input import PipedMessage
from pulsar_autoscale.pulsar_client import ClientSettings, open_client
from pulsar_autoscale.spark_bridge.offsets import _batch_size

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

    from pulsar_autoscale.functions.state.backend import StateBackend

log = logging.getLogger(__name__)

DEFAULT_RECEIVE_TIMEOUT_MS = 1000
# The first message may take longer: the broker starts dispatching to a consumer that just joined when it gets
# to it (CI, a 3-worker cluster under load: a drain asked for 2,000 of a backlog took 0 and ended after 1 s).
FIRST_RECEIVE_TIMEOUT_MS = 10_000
# Messages a consumer prefetches beyond what it has handed out; on close they go back to the
# subscription. Kept small so the drain takes little that it does not process.
DEFAULT_RECEIVER_QUEUE = 100
SEND_CHECK_TIMEOUT_S = 60.0


class BurstDrainError(PulsarAutoscaleError):
    """The drain could not run; every message it had taken was negative-acked (redelivered)."""


class BurstStateError(PulsarAutoscaleError):
    """process() used counters/state in a drain that has no state store (pass state_path)."""


@dataclass(frozen=True)
class BurstResult:
    """What one drain did: `taken` = `processed` (acked) + `failed` (negative-acked: process()
    raised or a send failed); `outputs` counts results produced to the output topic (process()
    may return None)."""

    taken: int
    processed: int
    outputs: int
    failed: int
    seconds: float
    partitions: int = 0
    timings: dict[str, float] = field(default_factory=dict)


# ---- joining the function's subscription ----------------------------------------------------------


def _subscribe(client, cfg: FunctionConfig, consumer_name: str, receiver_queue: int):
    return client.subscribe(
        list(cfg.inputs),
        cfg.subscription_name,
        consumer_type=pulsar.ConsumerType.Shared,
        receiver_queue_size=receiver_queue,
        consumer_name=consumer_name,
        negative_ack_redelivery_delay_ms=100,
    )


def _ends_entry(msg) -> bool:
    """Whether msg is the last message of its entry (or the size of its batch is unknown).

    A batched entry is acknowledged only when all its messages are (without batch-index
    acks), and Shared delivers an entry to one consumer, so the slice is completed to an
    entry boundary: a cut batch would come back whole to the instances, as duplicates.
    """
    mid = msg.message_id()
    index = mid.batch_index()
    size = _batch_size(mid.serialize())
    return index < 0 or size <= 0 or index >= size - 1


# ---- the task side: run process() on one partition ---------------------------------------------

_LOADED: dict[tuple[str, str, int], Any] = {}


def _load_process(class_name: str, code_name: str | None, code: bytes | None, slot: int):
    """process(input, context) for one thread of a task, loaded once per Python worker and slot."""
    from pulsar_autoscale.functions.instance.loader import load_callable

    digest = hashlib.sha256(code or b"").hexdigest()[:16]
    key = (class_name, digest, slot)
    fn = _LOADED.get(key)
    if fn is None:
        path: str | None = None
        if code is not None:
            # code and code_name come together: both from BurstDrain's code_path.
            target = Path(tempfile.gettempdir()) / f"pa-burst-{digest}" / cast(str, code_name)
            path = str(target if target.exists() else write_atomically(target, code))
        fn = _LOADED[key] = load_callable(class_name, path)
    return fn


class _NoState:
    """The state store of a drain started without state_path: every call says so."""

    def _refuse(self, *_args):
        raise BurstStateError(
            "burst drain: this function uses counters/state; pass state_path (the worker's "
            "state.sqlite, reachable from the Spark executors) to BurstDrain"
        )

    incr_counter = get_counter = del_counter = put_state = get_state = _refuse

    def group(self, _group: int) -> "_NoState":
        return self


@dataclass(frozen=True)
class _TaskSpec:
    """Everything a Spark task needs, pickled once with the job."""

    config: FunctionConfig
    client: ClientSettings
    code_name: str | None
    code: bytes | None
    threads: int
    state_path: str | None
    num_instances: int


def _process_chunk(
    spec: _TaskSpec, records: list[PipedMessage], slot: int, instance_id: int, client, producer, results: list
) -> None:
    """One thread: process its records with its own function object and Context."""

    from pulsar_autoscale.functions.instance.context import InstanceContext, identity_deserialize, load_serde, source_event_time
    from pulsar_autoscale.functions.instance.stats import InstanceStats
    from pulsar_autoscale.functions.state.changelog import changelog_of
    from pulsar_autoscale.functions.state.store import StateStore

    cfg = spec.config
    process = _load_process(cfg.className, spec.code_name, spec.code, slot)
    state: StateBackend
    if spec.state_path:  # outside a message scope every change is persisted in the changelog at once
        state = StateStore(spec.state_path, cfg.numKeyGroups, keyed=cfg.keyedState)
        state.attach_changelog(client, changelog_of(cfg))
    else:
        # The drain's Context only calls group() and the state verbs, which _NoState has (and refuses).
        state = cast("StateBackend", _NoState())
    ctx = InstanceContext(
        cfg,
        instance_id,
        lambda: spec.num_instances,
        client,
        InstanceStats(instance_id),
        state,
        logging.getLogger(f"function.{cfg.fqfn}.burst{instance_id}"),
    )
    serde = load_serde(cfg.outputSerdeClassName)
    try:
        for msg in records:
            ctx.set_message(msg)
            try:
                result = process(identity_deserialize(msg.data()), ctx)
            except Exception as exc:
                logging.getLogger(__name__).debug("burst drain: %s raised on message %s: %s", cfg.fqfn, msg.message_id(), exc)
                results.append([msg.key, False, 0])
                continue
            finally:
                ctx.set_message(None)
            if result is None or producer is None:
                results.append([msg.key, True, 0])
                continue
            entry = [msg.key, None, 1]  # None until the broker answers the send
            results.append(entry)

            def done(res, _mid, _entry=entry):
                _entry[1] = res == pulsar.Result.Ok

            key = msg.partition_key()
            conf: dict[str, Any] = {"event_timestamp": source_event_time(msg)}
            if key:
                conf["partition_key"] = key
            producer.send_async(serde.serialize(result), done, **conf)
        ctx.flush()  # what process() published through context.publish
    finally:
        ctx.close()
        if isinstance(state, StateStore):
            state.close()


def process_partition(spec: _TaskSpec, records: Iterable[PipedMessage]) -> Iterator[tuple[int, bool, int]]:
    """Spark task: (slice index, ok, outputs) per record; ok only once the output is persisted."""
    from pyspark import TaskContext

    records = list(records)
    if not records:
        return iter(())
    part = cast(TaskContext, TaskContext.get()).partitionId()  # a Spark task: TaskContext.get() is set
    client = open_client(spec.client)
    producer = None
    try:
        if spec.config.output:
            producer = client.create_producer(
                spec.config.output, block_if_queue_full=True, batching_enabled=True, batching_max_publish_delay_ms=1
            )
        threads = max(1, min(spec.threads, len(records)))
        chunks = [records[i::threads] for i in range(threads)]
        results: list[list] = []
        errors: list[BaseException] = []
        base = spec.config.parallelism + part * threads

        def run(i: int) -> None:
            try:
                _process_chunk(spec, chunks[i], i, base + i, client, producer, results)
            except BaseException as exc:  # a system failure fails the task (Spark retries it)
                errors.append(exc)

        workers = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        if errors:
            raise errors[0]
        if producer is not None:
            producer.flush()
        deadline = time.monotonic() + SEND_CHECK_TIMEOUT_S
        while any(r[1] is None for r in results) and time.monotonic() < deadline:
            time.sleep(0.005)  # flush returned; the last callbacks may still be on their way
        return iter([(r[0], bool(r[1]), r[2]) for r in results])
    finally:
        if producer is not None:
            producer.close()
        client.close()


# ---- the driver -----------------------------------------------------------------------------------


class BurstDrain:
    """Drain a bounded slice of one function's backlog with Spark; see the module docstring.

    `code_path` is the function's .py file (None: className is importable on the executors);
    its bytes travel with the job. `broker_kind` is a BrokerProfile, or "apache", "pulsar-lite" or
    "auto" (read from `metrics_url`, as the worker does). `state_path`: the worker's state store, when
    process() uses counters/state and the executors can reach the file.
    """

    def __init__(
        self,
        spark: "SparkSession | None",
        service_url: ClientSettings | str,
        function_config: FunctionConfig,
        code_path: str | None = None,
        *,
        broker_kind: BrokerProfile | str = "auto",
        metrics_url: str | None = None,
        receive_timeout_ms: int = DEFAULT_RECEIVE_TIMEOUT_MS,
        receiver_queue: int = DEFAULT_RECEIVER_QUEUE,
        state_path: str | None = None,
    ):
        from pulsar_autoscale.functions.instance.loader import load_callable

        cfg = function_config
        if not cfg.inputs:
            raise ConfigError(f"burst drain: function {cfg.fqfn} has no input topics")
        if cfg.subscription_type != "SHARED":
            raise ConfigError(
                f"burst drain: function {cfg.fqfn} uses a {cfg.subscription_type} subscription "
                "(retainOrdering/retainKeyOrdering/EFFECTIVELY_ONCE); draining it in parallel "
                "partitions would break its order. Only SHARED functions can burst"
            )
        client = ClientSettings.of(service_url)
        if not str(client.service_url).startswith(("pulsar://", "pulsar+ssl://")):
            raise ConfigError(f"burst drain: service_url {client.service_url!r} must start with pulsar://")
        load_callable(cfg.className, code_path)  # refuse code that cannot load before taking anything
        try:
            broker = resolve(broker_kind, metrics_url)
        except ConfigError as exc:
            raise ConfigError(f"burst drain: {exc}") from None
        self.spark = spark
        self.client = client
        self.config = cfg
        self.code_name = Path(code_path).name if code_path else None
        self.code = Path(code_path).read_bytes() if code_path else None
        self.broker = broker
        self.receive_timeout_ms = receive_timeout_ms
        self.receiver_queue = receiver_queue
        self.state_path = state_path

    @property
    def broker_kind(self) -> str:
        """The broker's kind, as --broker-kind names it (what "auto" found)."""
        return self.broker.name

    def _join(self):
        name = f"{self.config.fqfn}:burst-{uuid.uuid4().hex[:8]}"
        queue = max(1, self.receiver_queue)
        what = f"joining subscription {self.config.subscription_name!r} of {', '.join(self.config.inputs)} as consumer {name!r}"
        if self.broker.consumer_id_floors:
            try:
                return join_shared_subscription(self.client, lambda client: _subscribe(client, self.config, name, queue), what)
            except LiteJoinError as exc:
                raise BurstDrainError(f"burst drain of {self.config.fqfn}: {exc}") from exc
        client = open_client(self.client)
        try:
            return client, _subscribe(client, self.config, name, queue)
        except pulsar.PulsarException as exc:
            client.close()
            raise BurstDrainError(f"burst drain of {self.config.fqfn}: {what} failed: {type(exc).__name__} {exc}") from exc
        except Exception:
            client.close()
            raise

    def _leave(self, client, consumer) -> None:
        """Close the drain's consumer and client. A failure is logged, not raised: the slice was acked
        (or nacked) already; acks the client had not flushed yet come back as duplicates, never lost."""
        for label, close in (("consumer", consumer.close), ("client", client.close)):
            try:
                close()
            except pulsar.PulsarException as exc:
                log.warning(
                    "burst drain of %s: closing its %s on subscription %r of %s failed (%s %s); "
                    "acks not flushed yet come back as duplicates",
                    self.config.fqfn,
                    label,
                    self.config.subscription_name,
                    ", ".join(self.config.inputs),
                    type(exc).__name__,
                    exc,
                )

    def _take(self, consumer, max_messages: int) -> list:
        """Receive max_messages (completed to an entry boundary, see _ends_entry); stops early
        once none arrives within receive_timeout_ms (the first: FIRST_RECEIVE_TIMEOUT_MS)."""
        taken: list[pulsar.Message] = []
        while len(taken) < max_messages or not _ends_entry(taken[-1]):
            try:
                taken.append(
                    consumer.receive(self.receive_timeout_ms if taken else max(self.receive_timeout_ms, FIRST_RECEIVE_TIMEOUT_MS))
                )
            except pulsar.Timeout:
                break
        if self.broker.large_batches_may_stall:
            largest = max((_batch_size(m.message_id().serialize()) for m in taken), default=0)
            if largest > self.config.receiverQueueSize:
                log.warning(
                    "burst drain of %s: batches of up to %d messages, more than the receiver queue (%d); "
                    "on pulsar-lite a Shared subscription may stall after the drain leaves "
                    "(docs/spark-burst.md): make producers batch at most that many",
                    self.config.fqfn,
                    largest,
                    self.config.receiverQueueSize,
                )
        return taken

    def run(self, max_messages: int, partitions: int, threads_per_partition: int = 1) -> BurstResult:
        """Take up to max_messages from the subscription, process them in `partitions` Spark tasks
        (each with `threads_per_partition` threads: the concurrency of a waiting function), ack."""
        if max_messages < 1 or partitions < 1 or threads_per_partition < 1:
            raise ConfigError(
                f"burst drain: max_messages ({max_messages}), partitions ({partitions}) and "
                f"threads_per_partition ({threads_per_partition}) must be >= 1"
            )
        t0 = time.monotonic()
        timings: dict[str, float] = {}
        client, consumer = self._join()
        timings["join_s"] = time.monotonic() - t0
        taken: list = []
        try:
            taken = self._take(consumer, max_messages)
            timings["take_s"] = time.monotonic() - t0 - timings["join_s"]
            if not taken:
                return BurstResult(0, 0, 0, 0, time.monotonic() - t0, timings=timings)
            t1 = time.monotonic()
            try:
                statuses = self._spark_job(taken, partitions, threads_per_partition)
            except Exception as exc:
                for msg in taken:
                    consumer.negative_acknowledge(msg)
                raise BurstDrainError(
                    f"burst drain of {self.config.fqfn}: the Spark job failed ({exc}); "
                    f"all {len(taken)} messages taken were negative-acked for redelivery"
                ) from exc
            timings["spark_s"] = time.monotonic() - t1
            seen: set[int] = set()
            acked = failed = outputs = 0
            for index, ok, n_out in statuses:
                if index in seen:  # a retried task's answer: the first one stands
                    continue
                seen.add(index)
                outputs += n_out if ok else 0
                if ok:
                    consumer.acknowledge(taken[index])
                    acked += 1
                else:
                    consumer.negative_acknowledge(taken[index])
                    failed += 1
            missing = [i for i in range(len(taken)) if i not in seen]
            for i in missing:  # not reported by any task: cannot happen unless Spark lost a result
                consumer.negative_acknowledge(taken[i])
            failed += len(missing)
            return BurstResult(
                taken=len(taken),
                processed=acked,
                outputs=outputs,
                failed=failed,
                seconds=time.monotonic() - t0,
                partitions=partitions,
                timings=timings,
            )
        finally:
            t2 = time.monotonic()
            self._leave(client, consumer)  # flushes grouped acks; prefetched messages beyond the slice go back
            timings["close_s"] = time.monotonic() - t2

    def _spark_job(self, taken: list, partitions: int, threads: int) -> list[tuple[int, bool, int]]:
        records = [PipedMessage.of(i, m) for i, m in enumerate(taken)]
        spec = _TaskSpec(
            self.config,
            self.client,
            self.code_name,
            self.code,
            threads,
            self.state_path,
            self.config.parallelism + partitions * threads,
        )
        # None only until the caller sets the session (BurstRunner: before run()).
        sc = cast("SparkSession", self.spark).sparkContext
        sc.setJobDescription(f"burst drain {self.config.fqfn}: {len(records)} messages")
        try:
            rdd = sc.parallelize(records, min(partitions, len(records)))
            return rdd.mapPartitions(functools.partial(process_partition, spec)).collect()
        finally:
            # pyspark annotates `value: str`, but None (a Java null) is what clears the description.
            sc.setJobDescription(None)  # type: ignore[arg-type]
