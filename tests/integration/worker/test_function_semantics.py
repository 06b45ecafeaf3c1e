"""FunctionConfig fields honoured with Pulsar's semantics on a live worker (docs/function-config.md):
retries and the dead-letter topic, a result no serde can serialize, subscriptionPosition, autoAck,
cleanupSubscription, forwardSourceMessageProperty, customSerdeInputs/outputSerdeClassName."""

from __future__ import annotations

import pickle
import signal
import subprocess
import uuid

import pytest

from pulsar_autoscale.admin.client import AdminError
from tests.support.commands import CLI
from tests.support.scenario import EXAMPLES, OutputCollector, wait_until

POISON = str(EXAMPLES / "poison.py")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create(admin, name: str, py: str = POISON, class_name: str = "poison.Poison", **fields) -> dict:
    cfg = {"tenant": "public", "namespace": "default", "name": name, "className": class_name, "inputs": [f"{name}-in"], **fields}
    admin.create(cfg, py)
    wait_until(lambda: admin.status("public", "default", name)["numRunning"] == cfg.get("parallelism", 1), 30, f"{name} running")
    return cfg


def send(client, topic: str, payloads, properties=None) -> None:
    producer = client.create_producer(topic)
    for p in payloads:
        producer.send(p.encode(), properties=properties)
    producer.close()


def status(admin, name: str) -> dict:
    return admin.status("public", "default", name)["instances"][0]["status"]


def deliveries(worker, name: str, payload: str) -> int:
    return worker.worker._functions[f"public/default/{name}"].state.get_counter(f"deliveries:{payload}")


@pytest.mark.parametrize("runtime", ["thread", "process"])
@pytest.mark.parametrize("ordering", [False, True], ids=["shared", "failover"])
def test_poison_message_is_delivered_three_times_then_dead_lettered(admin, client, worker, ordering, runtime):
    """retainOrdering: a FAILOVER subscription, whose nacks pulsar-lite never redelivers (B13) and Apache Pulsar
    redelivers without a redelivery count: the input's own redelivery (broker/lite/nack_redelivery.py) must give
    the same retries and dead letter as Shared on both brokers, in a process instance too (on Apache Pulsar it
    subscribes itself)."""
    name = unique("poison")
    out, dlq = f"persistent://public/default/{name}-out", f"persistent://public/default/{name}-dlq"
    create(admin, name, output=out, maxMessageRetries=2, deadLetterTopic=dlq, retainOrdering=ordering, instanceRuntime=runtime)
    outputs, dead = OutputCollector(client, out), OutputCollector(client, dlq)
    payloads = [f"m{i}" for i in range(10)]
    payloads.insert(3, "poison")
    send(client, f"{name}-in", payloads)
    wait_until(lambda: dead.distinct() == 1, 30, "the poison message on the dead-letter topic")
    wait_until(lambda: outputs.distinct() == 10, 30, "the 10 other messages processed")
    assert dead.counts == {b"poison": 1}
    assert deliveries(worker, name, "poison") == 3  # 1 delivery + maxMessageRetries redeliveries
    assert set(outputs.counts) == {f"m{i}!".encode() for i in range(10)} and outputs.duplicates() == 0
    # a process instance reports its figures every quarter second: they may lag its outputs
    wait_until(
        lambda: status(admin, name)["numUserExceptions"] == 3,
        10,
        lambda: f"3 user exceptions in the status: {status(admin, name)}",
    )
    assert status(admin, name)["numRestarts"] == 0
    outputs.close()
    dead.close()


def test_localrun_dead_letters_a_poison_message_under_retain_ordering(client, broker, broker_kind, tmp_path):
    """`functions localrun` opens its inputs as a worker does: a FAILOVER input's retries reach the dead-letter
    topic on both brokers (before, on Apache Pulsar it retried the poison message every second for ever), and with
    the broker's /metrics it knows pulsar-lite and fetches one message at a time there (with the default receiver
    queue, pulsar-lite delivers messages of a Failover subscription twice, B1: an extra output or delivery)."""
    name = unique("lpoison")
    out, dlq = f"persistent://public/default/{name}-out", f"persistent://public/default/{name}-dlq"
    outputs, dead = OutputCollector(client, out), OutputCollector(client, dlq)
    local = subprocess.Popen(
        [
            *CLI,
            "functions",
            "localrun",
            "--broker-service-url",
            broker.service_url,
            "--metrics-url",
            broker.metrics_url,
            "--name",
            name,
            "--py",
            POISON,
            "--classname",
            "poison.Poison",
            "-i",
            f"{name}-in",
            "-o",
            out,
            "--retain-ordering",
            "--max-message-retries",
            "2",
            "--dead-letter-topic",
            dlq,
            "--subs-position",
            "Earliest",
            "--state-dir",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = local.stdout.readline()
        assert (
            f"localrun public/default/{name}" in started
            and f"({'pulsar-lite' if broker_kind == 'lite' else 'apache'})" in started
        ), started
        send(client, f"{name}-in", ["m0", "poison", "m1"])
        wait_until(lambda: dead.distinct() == 1, 30, "the poison message on the dead-letter topic")
        wait_until(lambda: outputs.distinct() == 2, 30, "the 2 other messages processed")
        local.send_signal(signal.SIGINT)
        summary, err = local.communicate(timeout=60)
        assert local.returncode == 0, err
        assert "2 processed, 3 user exceptions" in summary, summary  # 1 delivery + 2 redeliveries
        assert dead.counts == {b"poison": 1}
    finally:
        if local.poll() is None:
            local.kill()
            local.wait()
        outputs.close()
        dead.close()


def test_default_dead_letter_topic_and_unserializable_result(admin, client, worker):
    """No deadLetterTopic: `{topic}-{subscription}-DLQ`; a result no serde can serialize is a user exception
    (retried, then dead-lettered), never an instance crash."""
    name = unique("noser")
    cfg = create(admin, name, output=f"{name}-out", maxMessageRetries=1)
    from pulsar_autoscale.functions.model.config import FunctionConfig

    (dlq,) = FunctionConfig.from_dict(cfg).dead_letter_topics()
    assert dlq == f"persistent://public/default/{name}-in-public/default/{name}-DLQ"
    dead, outputs = OutputCollector(client, dlq), OutputCollector(client, f"persistent://public/default/{name}-out")
    send(client, f"{name}-in", ["a", "object", "b"])
    wait_until(lambda: dead.distinct() == 1 and outputs.distinct() == 2, 30, "1 dead-lettered, 2 processed")
    assert dead.counts == {b"object": 1} and deliveries(worker, name, "object") == 2
    instance = status(admin, name)
    assert instance["numUserExceptions"] == 2 and instance["numRestarts"] == 0 and instance["running"]
    assert "cannot serialize" in instance["latestUserExceptions"][0]["exceptionString"]
    dead.close()
    outputs.close()


def test_subscription_position_earliest_takes_what_was_sent_before(admin, client, worker):
    name = unique("earliest")
    send(client, f"{name}-in", ["before"])
    create(admin, name, subscriptionPosition="Earliest")
    wait_until(lambda: deliveries(worker, name, "before") == 1, 30, "the message sent before the function existed")


def test_source_properties_forwarded_and_custom_serdes(admin, client, tmp_path):
    name = unique("serde")
    code = tmp_path / "pickler.py"
    code.write_text(
        "import pickle\n"
        "class Upper:\n"
        "    def serialize(self, value): return pickle.dumps(value)\n"
        "    def deserialize(self, data): return data.decode().upper()\n"
        "def echo(value): return {'got': value}\n"
    )
    out = f"persistent://public/default/{name}-out"
    create(
        admin,
        name,
        py=str(code),
        class_name="pickler.echo",
        output=out,
        customSerdeInputs={f"{name}-in": "pickler.Upper"},
        outputSerdeClassName="pickler.Upper",
    )
    outputs = OutputCollector(client, out)
    send(client, f"{name}-in", ["hi"], properties={"trace": "t1"})
    wait_until(lambda: outputs.distinct() == 1, 30, "one output")
    assert [pickle.loads(k) for k in outputs.counts] == [{"got": "HI"}]
    (props,) = outputs.properties
    assert props["trace"] == "t1" and props["__pfn_input_topic__"] == f"persistent://public/default/{name}-in"
    outputs.close()


def test_unknown_serde_class_is_refused_at_create(admin):
    with pytest.raises(AdminError, match="poison.Nope. is not a class") as err:
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": unique("bad"),
                "className": "poison.Poison",
                "inputs": ["x"],
                "outputSerdeClassName": "poison.Nope",
            },
            POISON,
        )
    assert err.value.status == 400


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"subName": 123}, "subName must be a string, got integer 123"),
        ({"receiverQueueSize": 2**31}, "receiverQueueSize must be an integer from 1 to 2147483647"),
        ({"retainOrdering": "false"}, "retainOrdering must be a boolean"),
        ({"windowConfig": {"windowLengthCount": 3}}, "windowConfig is not supported by this worker"),
    ],
)
def test_bad_types_and_refused_fields_answer_400_naming_the_field(admin, fields, needle):
    with pytest.raises(AdminError, match=needle) as err:
        admin.create(
            {
                "tenant": "public",
                "namespace": "default",
                "name": unique("bad"),
                "className": "poison.Poison",
                "inputs": ["x"],
                **fields,
            },
            POISON,
        )
    assert err.value.status == 400


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"topicsPattern": "persistent://public/default/x-.*", "inputs": []}, "topicsPattern is not supported on pulsar-lite"),
        ({"skipToLatest": True}, "skipToLatest is not supported on pulsar-lite"),
    ],
)
def test_fields_pulsar_lite_cannot_serve_are_refused_there_only(admin, broker_kind, fields, needle):
    """B5, B9: refused with a 400 naming the field on pulsar-lite; taken on Apache Pulsar."""
    config = {
        "tenant": "public",
        "namespace": "default",
        "name": unique("lim"),
        "className": "poison.Poison",
        "inputs": ["x"],
        **fields,
    }
    if broker_kind == "lite":
        with pytest.raises(AdminError, match=needle) as err:
            admin.create(config, POISON)
        assert err.value.status == 400
        return
    admin.create(config, POISON)
    admin.delete("public", "default", config["name"])


def test_delete_removes_the_subscription_unless_told_not_to(admin, client, worker):
    """cleanupSubscription (Pulsar's default true): after a delete, a recreated function with position Latest
    does not get what was sent meanwhile; with cleanupSubscription false the backlog waits for it."""
    for cleanup, expected in ((True, 0), (False, 1)):
        name = unique("cleanup")
        create(admin, name, cleanupSubscription=cleanup)
        admin.delete("public", "default", name)
        wait_until(lambda: not any(t.is_alive() for t in worker.worker._retirers), 30, "the deleted function drained")
        send(client, f"{name}-in", ["meanwhile"])
        create(admin, name, cleanupSubscription=cleanup)
        send(client, f"{name}-in", ["after"])
        wait_until(lambda: deliveries(worker, name, "after") == 1, 30, "the message sent after the recreate")
        assert deliveries(worker, name, "meanwhile") == expected, f"cleanupSubscription={cleanup}"
        admin.delete("public", "default", name)


@pytest.mark.slow
def test_auto_ack_false_and_timeout_ms(admin, client, worker, tmp_path):
    """autoAck false: the function acks with context.ack; what it leaves unacked comes back after timeoutMs
    (the client's ack timeout, at least 10 s)."""
    name = unique("manual")
    code = tmp_path / "manual.py"
    code.write_text(
        "from pulsar import Function\n"
        "class Manual(Function):\n"
        "    def process(self, input, context):\n"
        "        context.incr_counter(f'deliveries:{input}', 1)\n"
        "        if input == 'ack':\n"
        "            context.ack(context.get_message_id(), context.get_current_message_topic_name())\n"
    )
    create(admin, name, py=str(code), class_name="manual.Manual", autoAck=False, timeoutMs=10_000)
    send(client, f"{name}-in", ["keep", "ack"])
    wait_until(lambda: deliveries(worker, name, "keep") == 2, 30, "the unacked message redelivered after timeoutMs")
    assert deliveries(worker, name, "ack") == 1
