"""The stateful stage (keyed counts with applyInPandasWithState) on real local Spark and the embedded broker.

Exact per-key counts across a restart (with a replayed micro-batch) and across a parallelism
change. Waits are bounded: every poll has a deadline and says what it was waiting for.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pulsar
import pytest

from pulsar_autoscale.admin.client import AdminError, FunctionsAdmin
from pulsar_autoscale.controller.config import ControllerConfig
from pulsar_autoscale.controller.loop import Controller
from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.api.server import WorkerServer
from pulsar_autoscale.functions.spark.stateful import StageStatus, StatefulStage, checkpoint_confs
from pulsar_autoscale.functions.spark.stateful_config import StatefulStageConfig
from pulsar_autoscale.spark_bridge.sink import PROP_BATCH, ReplayFilter, replay_key
from tests.support.scenario import wait_until as poll

KEYS = [f"k{i}" for i in range(10)]
MINUTE_MS = 60_000
# Event times inside one minute window, far in the past (the watermark follows event time only).
W1 = 1_700_000_000_000 // MINUTE_MS * MINUTE_MS
W2 = W1 + MINUTE_MS


def send(client, topic: str, n: int, event_ms: int | None = None, batching: bool = True) -> None:
    """n messages spread evenly over KEYS, event time event_ms + index when given."""
    producer = client.create_producer(topic, block_if_queue_full=True, batching_enabled=batching)
    for i in range(n):
        extra = {} if event_ms is None else {"event_timestamp": event_ms + i}
        producer.send_async(b"x", None, partition_key=KEYS[i % len(KEYS)], **extra)
    producer.flush()
    producer.close()


@dataclass
class Output:
    """The stage's output topic; keeps first copies only (replays dropped by their properties).

    Each poll reads with a fresh Reader from the last id seen: on pulsar-lite a Reader opened
    on a topic that has no message yet stops receiving after a few producers came and went.
    """

    client: object
    topic: str
    keep: ReplayFilter = field(default_factory=ReplayFilter)
    first: list = field(default_factory=list)
    replays: list = field(default_factory=list)
    last: object = None

    def drain(self, idle_ms: int = 300) -> None:
        reader = self.client.create_reader(self.topic, self.last or pulsar.MessageId.earliest)
        try:
            while True:
                try:
                    msg = reader.read_next(idle_ms)
                except pulsar.Timeout:
                    return
                if self.last is not None and _id(msg.message_id()) <= _id(self.last):
                    continue  # a duplicate delivery
                self.last = msg.message_id()
                (self.first if self.keep.first_time(msg.properties()) else self.replays).append(msg)
        finally:
            reader.close()

    def counts(self) -> dict[tuple[str, str | None], int]:
        """Latest count per (key, window start) among first copies."""
        out = {}
        for m in self.first:
            out[(m.partition_key(), m.properties().get("windowStart"))] = int(m.properties()["count"])
        return out

    def finals(self) -> dict[tuple[str, str], int]:
        return {
            (m.partition_key(), m.properties()["windowStart"]): int(m.properties()["count"])
            for m in self.first
            if m.properties().get("final") == "true"
        }

    def wait(self, predicate, timeout_s: float, what: str, stage: StatefulStage | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if stage is not None and stage.status(with_backlog=False).error:
                raise AssertionError(f"stage failed while waiting for {what}: {stage.status().error}")
            self.drain()
            if predicate(self):
                return
        progress = [(p["batchId"], p["numInputRows"], p["eventTime"]) for p in stage.query.recentProgress] if stage else []
        raise AssertionError(
            f"timed out after {timeout_s:.0f}s waiting for {what}; counts {self.counts()}; "
            f"batches (id, rows, event time) {progress}"
        )


def wait_until(predicate, timeout_s: float, what: str):
    """Polls the worker's REST API: each stage status asks Spark, so not too often."""
    return poll(predicate, timeout_s, what, interval_s=0.2)


def _id(message_id) -> tuple[int, int, int]:
    return (message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())


@pytest.fixture
def output(pulsar_client, topic):
    return Output(pulsar_client, topic + "-out")


def config(broker, topic, tmp_path, **kw) -> StatefulStageConfig:
    return StatefulStageConfig(
        name="counter",
        input=topic,
        output=topic + "-out",
        service_url=broker.service_url,
        checkpoint_dir=str(tmp_path / "ck"),
        state_partitions=2,
        **kw,
    )


def task_counts(spark, run_id) -> set[int]:
    """Tasks per Spark stage of one run of a query (Spark names a run's jobs by its run id)."""
    tracker = spark.sparkContext.statusTracker()
    jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(str(run_id))]
    stages = [tracker.getStageInfo(s) for job in jobs if job for s in job.stageIds]
    return {s.numTasks for s in stages if s and s.numTasks}


def assert_running_counts(messages) -> None:
    """Per key and window, first copies carry strictly increasing counts."""
    last: dict = {}
    for m in messages:
        group = (m.partition_key(), m.properties().get("windowStart"))
        count = int(m.properties()["count"])
        assert count > last.get(group, 0), f"{group}: count {count} after {last[group]}"
        last[group] = count


@pytest.mark.spark
def test_counts_exact_across_restart_with_replayed_batch(spark, broker, pulsar_client, topic, tmp_path, output):
    cfg = config(broker, topic, tmp_path, trigger="availableNow", max_records_per_trigger=100)
    stage = StatefulStage(cfg, spark)
    send(pulsar_client, topic, 300)
    stage.start()
    stage.await_termination(120)
    first_run = stage.query.id
    status = stage.status()
    assert (status.state_rows, status.backlog_entries, status.state_partitions) == (10, 0, 2), status

    # A driver that died after the sink flushed its last batch but before Spark logged the
    # commit: the restarted query replays that batch from the state of the batch before.
    commits = tmp_path / "ck" / "commits"
    replayed = str(max(int(p.name) for p in commits.iterdir() if p.name.isdigit()))
    for name in (replayed, f".{replayed}.crc"):
        (commits / name).unlink(missing_ok=True)
    send(pulsar_client, topic, 200)
    assert stage.status().backlog_entries > 0
    stage.start()
    stage.await_termination(120)
    assert stage.query.id == first_run, "a restart from the checkpoint keeps the query id"

    output.wait(lambda o: o.counts() == {(k, None): 50 for k in KEYS}, 60, "count 50 per key")
    assert output.replays and {m.properties()[PROP_BATCH] for m in output.replays} == {replayed}
    content = {replay_key(m.properties()): m.data() for m in output.first}
    assert all(content[replay_key(m.properties())] == m.data() for m in output.replays), "a replay differs"
    assert_running_counts(output.first)
    assert json.loads(output.first[-1].data()) == {"key": output.first[-1].partition_key(), "count": 50, "final": False}


@pytest.mark.spark
def test_counts_exact_across_parallelism_change_with_windows(spark, broker, pulsar_client, topic, tmp_path, output):
    cfg = config(
        broker,
        topic,
        tmp_path,
        parallelism=1,
        trigger="500 milliseconds",
        max_records_per_trigger=150,
        window="1 minute",
        allowed_lateness="0 seconds",
    )
    stage = StatefulStage(cfg, spark)
    send(pulsar_client, topic, 300, event_ms=W1)
    stage.start()
    try:
        output.wait(lambda o: o.counts() == {(k, str(W1)): 30 for k in KEYS}, 90, "count 30 per key in W1", stage)
        before = stage.query
        stage.set_parallelism(3)
        assert stage.query.id == before.id and stage.query.runId != before.runId and not before.isActive
        # Unbatched: one entry per message, so each micro-batch's range can be cut in 3.
        send(pulsar_client, topic, 200, event_ms=W1 + 300, batching=False)
        send(pulsar_client, topic, 100, event_ms=W2, batching=False)  # moves the watermark past W1: W1 closes
        output.wait(lambda o: len(o.finals()) == 10 and len(o.counts()) == 20, 90, "W1 closed and W2 counted", stage)
        # The query's progress (its state rows) is recorded after the batch's output is committed: wait for it.
        status = poll(
            lambda: (st := stage.status()).state_rows == 10 and st,
            30,
            lambda: f"the progress of the batch that closed W1 (10 state rows): {stage.status()}",
        )
        # Read stages run `parallelism` tasks, the stateful stage its 2 state partitions.
        assert task_counts(spark, before.runId) == {1, 2}
        assert task_counts(spark, stage.query.runId) == {2, 3}
    finally:
        stage.stop()
    assert output.finals() == {(k, str(W1)): 50 for k in KEYS}
    assert output.counts() == {**{(k, str(W1)): 50 for k in KEYS}, **{(k, str(W2)): 10 for k in KEYS}}
    assert_running_counts([m for m in output.first if m.properties()["final"] == "false"])
    # Parallelism is the input partitions; the state partitions stay as the checkpoint fixed them.
    assert (status.parallelism, status.state_partitions, status.running) == (3, 2, True), status
    assert checkpoint_confs(cfg.checkpoint_dir)["spark.sql.shuffle.partitions"] == "2"
    assert status.state_rows == 10 and status.backlog_entries == 0, status  # W1 evicted, W2 held
    snap = status.to_snapshot()
    assert (snap.name, snap.parallelism, snap.backlog) == ("public/default/counter", 3, 0.0)


BACKLOG_POLICY = str(Path(__file__).resolve().parents[3] / "examples" / "policy_backlog_per_instance.py")


@pytest.mark.spark
def test_the_worker_hosts_a_stage_that_the_controller_scales(spark, broker, pulsar_client, topic, tmp_path, output):
    """A stage created on the worker is a node the controller sees (backlog, parallelism) and re-scales
    through the Functions API; counts stay exact across that restart and across a worker restart."""
    name = f"counter-{uuid.uuid4().hex[:6]}"
    fqfn = f"public/default/{name}"
    stage_cfg = {
        "name": name,
        "input": topic,
        "output": topic + "-out",
        "parallelism": 1,
        "statePartitions": 2,
        "trigger": "500 milliseconds",
        "maxRecordsPerTrigger": 100,
    }
    with WorkerServer(broker.service_url, data_dir=str(tmp_path / "worker"), metrics_url=broker.metrics_url) as w:
        admin = FunctionsAdmin(w.url)
        admin.create_stage(stage_cfg)
        with pytest.raises(AdminError, match="already exists"):
            admin.create_stage(stage_cfg)
        wait_until(lambda: admin.status("public", "default", name)["numRunning"] == 1, 120, f"{name}'s query running")
        assert name in admin.list("public", "default")
        view = admin.get("public", "default", name)
        assert (view["runtime"], view["inputs"], view["parallelism"]) == ("SPARK", [topic], 1)
        with pytest.raises(AdminError, match="only parallelism can be updated"):
            admin.update({"tenant": "public", "namespace": "default", "name": name, "output": "elsewhere"})
        send(pulsar_client, topic, 2000, batching=False)
        controller = Controller(
            ControllerConfig(
                service_url=broker.service_url,
                admin_url=w.url,
                metrics_url=broker.metrics_url,
                policy=BACKLOG_POLICY,
                policy_params={"per_instance": 200},
                period_s=2.0,
                window_s=4.0,
                http_port=0,
                lock_topic=f"persistent://public/default/lock-{uuid.uuid4().hex[:6]}",
                decision_log=str(tmp_path / "decisions.jsonl"),
                plan={"bounds": [{"pattern": fqfn, "min": 1, "max": 3}]},
            )
        ).start()
        try:

            def scaled():
                return [r for r in controller.log.read() if r["function"] == fqfn and r["new"] > r["old"]]

            record = wait_until(scaled, 60, f"a scale-out of {fqfn} in the decision log")[0]
        finally:
            controller.stop()
        # The plugin asks one partition per 200 messages of backlog, within the bounds 1-3.
        scaled_to = record["new"]
        assert record["applied"] and record["inputs"]["parallelism"] == 1, record
        assert scaled_to == min(3, math.ceil(record["inputs"]["backlog"] / 200)) >= 2, record
        wait_until(
            lambda: admin.status("public", "default", name)["numRunning"] == scaled_to, 120, f"{scaled_to} input partitions"
        )
        output.wait(lambda o: o.counts() == {(k, None): 200 for k in KEYS}, 120, "count 200 per key")
        # The backlog is unknown (None) until the restarted run's first progress report, then 0; a batch's rows
        # count once its progress is reported, which Spark does after the batch's output is committed.
        stats = wait_until(
            lambda: (
                (s := admin.stats("public", "default", name))["autoscale"]["backlog"] == 0 and s["receivedTotal"] >= 2000 and s
            ),
            60,
            lambda: f"the stage to report backlog 0 and 2000 rows: {admin.stats('public', 'default', name)}",
        )
        assert stats["receivedTotal"] == stats["processedSuccessfullyTotal"], stats
        assert stats["autoscale"]["counters"]["busy_s"] > 0
    # A restarted worker brings the stage back, as it was scaled, with its state.
    with WorkerServer(broker.service_url, data_dir=str(tmp_path / "worker"), metrics_url=broker.metrics_url) as w:
        admin = FunctionsAdmin(w.url)
        wait_until(lambda: admin.status("public", "default", name)["numRunning"] == scaled_to, 120, "the restored stage")
        send(pulsar_client, topic, 100, batching=False)
        output.wait(lambda o: o.counts() == {(k, None): 210 for k in KEYS}, 120, "count 210 per key")
        admin.delete("public", "default", name)
        assert name not in admin.list("public", "default")
    assert_running_counts(output.first)


BAD_CONFIGS = [
    ({"name": "a/b"}, "name"),
    ({"output": "in"}, "also its input"),
    ({"key": "value"}, "key"),
    ({"aggregation": "sum"}, "aggregation"),
    ({"window": "1 fortnight"}, "window"),
    ({"trigger": "now"}, "trigger"),
    ({"parallelism": 0}, "parallelism"),
    ({"parallelism": 65}, "maxParallelism"),
    ({"stateStore": "memory"}, "stateStore"),
    ({"checkpointDir": ""}, "checkpointDir"),
    ({"serviceUrl": "http://x"}, "serviceUrl"),
    ({"colour": "red"}, "colour"),
]


@pytest.mark.parametrize("change,named", BAD_CONFIGS, ids=[n for _, n in BAD_CONFIGS])
def test_bad_config_names_the_field(change, named):
    data = {"name": "counter", "input": "in", "output": "out", "checkpointDir": "/tmp/ck", **change}
    with pytest.raises(ConfigError, match=named):
        StatefulStageConfig.from_dict(data)


def test_config_from_camel_case_dict_round_trips():
    cfg = StatefulStageConfig.from_dict(
        {
            "tenant": "t",
            "namespace": "ns",
            "name": "c",
            "input": "in",
            "output": "tn/other/out",
            "checkpointDir": "/ck",
            "key": "property:user",
            "maxRecordsPerTrigger": 500,
            "window": "10 seconds",
        }
    )
    assert (cfg.fqfn, cfg.input, cfg.output) == ("t/ns/c", "persistent://t/ns/in", "persistent://tn/other/out")
    assert cfg.key_property == "user" and cfg.max_records_per_trigger == 500
    assert StatefulStageConfig.from_dict(cfg.to_dict()) == cfg
    idle = StageStatus(name=cfg.fqfn, running=False, parallelism=1, state_partitions=None)
    assert idle.to_snapshot().running == 0 and idle.to_snapshot().arrival_rate is None
