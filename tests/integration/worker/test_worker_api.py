"""The worker's Functions REST API: Pulsar's examples run unmodified, bad input gets a clear 4xx
and the worker keeps serving."""

from __future__ import annotations

import json
import uuid

import pytest
import requests

from pulsar_autoscale.admin.client import AdminError
from pulsar_autoscale.functions.api.server import WorkerServer
from tests.support.scenario import EXAMPLES, OutputCollector, wait_until

MAX_PARALLELISM = 16


@pytest.fixture(scope="module")
def worker(broker, tmp_path_factory):
    with WorkerServer(
        broker.service_url,
        data_dir=str(tmp_path_factory.mktemp("worker")),
        metrics_url=broker.metrics_url,
        max_parallelism=MAX_PARALLELISM,
    ) as w:
        yield w


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def config(name: str, class_name: str, inputs, output=None, **extra) -> dict:
    return {
        "tenant": "public",
        "namespace": "default",
        "name": name,
        "className": class_name,
        "inputs": inputs,
        **({"output": output} if output else {}),
        **extra,
    }


def create(admin, cfg: dict, py: str | None = None) -> None:
    """Create and wait until every instance has subscribed: as in Pulsar, a function's subscription
    starts at the latest message, so what is sent before it exists is not the function's."""
    admin.create(cfg, py)
    n = cfg.get("parallelism", 1)
    wait_until(
        lambda: admin.status("public", "default", cfg["name"])["numRunning"] == n, 30, f"{n} running instance(s) of {cfg['name']}"
    )


def send_all(client, topic: str, payloads):
    producer = client.create_producer(topic)
    for p in payloads:
        producer.send(p.encode())
    producer.close()


def test_exclaim_appends_bang(admin, client):
    name = unique("exclaim")
    src, dst = f"{name}-in", f"persistent://public/default/{name}-out"
    create(admin, config(name, "exclaim.Exclaim", [src], dst), str(EXAMPLES / "exclaim.py"))
    collector = OutputCollector(client, dst)
    send_all(client, src, ["hello", "world"])
    wait_until(lambda: collector.distinct() == 2, 30, "2 outputs from exclaim")
    assert set(collector.counts) == {b"hello!", b"world!"}
    collector.close()


def test_word_count_uses_counters(admin, client, worker):
    name = unique("wc")
    src = f"{name}-in"
    create(admin, config(name, "word_count.WordCount", [src], parallelism=2), str(EXAMPLES / "word_count.py"))
    send_all(client, src, ["a b a", "b a c"])
    store = worker.worker._functions[f"public/default/{name}"].state
    wait_until(
        lambda: store.counters() == {"a": 3, "b": 2, "c": 1}, 30, lambda: f"word counts a=3 b=2 c=1, have {store.counters()}"
    )


def test_publish_uses_user_config(admin, client):
    name = unique("pub")
    src, side = f"{name}-in", f"persistent://public/default/{name}-side"
    create(
        admin,
        config(name, "publish_tagged.PublishTagged", [src], userConfig={"tag": "blue", "publish-topic": side}),
        str(EXAMPLES / "publish_tagged.py"),
    )
    collector = OutputCollector(client, side)
    send_all(client, src, ["x", "y"])
    wait_until(lambda: collector.distinct() == 2, 30, "2 messages published through context.publish")
    assert set(collector.counts) == {b"blue:x", b"blue:y"}
    collector.close()


def test_plain_callable_from_installed_module_and_status_fields(admin, client):
    name = unique("noop")
    src, dst = f"{name}-in", f"persistent://public/default/{name}-out"
    create(admin, config(name, "pulsar_autoscale.functions.examples.noop.noop", [src], dst))
    collector = OutputCollector(client, dst)
    send_all(client, src, ["1", "2", "3"])
    wait_until(lambda: collector.distinct() == 3, 30, "3 outputs from noop")
    status = wait_until(
        lambda: (s := admin.status("public", "default", name))["instances"][0]["status"]["numSuccessfullyProcessed"] == 3 and s,
        10,
        "status to show 3 processed",
    )
    assert status["numInstances"] == 1 and status["numRunning"] == 1
    inst = status["instances"][0]["status"]
    assert inst["numReceived"] == 3 and inst["numRestarts"] == 0 and inst["numUserExceptions"] == 0
    stats = admin.stats("public", "default", name)
    assert stats["receivedTotal"] == 3 and stats["processedSuccessfullyTotal"] == 3
    assert stats["instances"][0]["metrics"]["autoscale"]["outputTotal"] == 3
    assert "1min" in stats and stats["avgProcessLatency"] >= 0
    collector.close()


def test_user_exceptions_are_counted_and_kept(admin, client, tmp_path):
    code = tmp_path / "boom.py"
    code.write_text("def boom(x):\n    raise ValueError('bad ' + str(x))\n")
    name = unique("boom")
    src = f"{name}-in"
    create(admin, config(name, "boom.boom", [src], processingGuarantees="ATMOST_ONCE"), str(code))
    send_all(client, src, ["1"])
    status = wait_until(
        lambda: (s := admin.status("public", "default", name))["instances"][0]["status"]["numUserExceptions"] >= 1 and s,
        30,
        "a user exception to be counted",
    )
    latest = status["instances"][0]["status"]["latestUserExceptions"]
    assert "ValueError: bad 1" in latest[-1]["exceptionString"]


def test_metrics_use_pulsar_names(admin, worker, client):
    name = unique("met")
    create(admin, config(name, "exclaim.Exclaim", [f"{name}-in"], f"{name}-out"), str(EXAMPLES / "exclaim.py"))
    send_all(client, f"{name}-in", ["m"])
    fqfn = f"public/default/{name}"

    def processed_line():
        text = requests.get(worker.url + "/metrics", timeout=5).text
        return [
            line
            for line in text.splitlines()
            if line.startswith("pulsar_function_processed_successfully_total{")
            and f'fqfn="{fqfn}"' in line
            and line.endswith(" 1.0")
        ]

    wait_until(processed_line, 30, "pulsar_function_processed_successfully_total 1 for the function")


def test_worker_cluster_endpoints(worker):
    cluster = requests.get(worker.url + "/admin/v2/worker/cluster", timeout=5).json()
    assert cluster[0]["workerId"] == worker.worker.worker_id
    leader = requests.get(worker.url + "/admin/v2/worker/cluster/leader", timeout=5).json()
    assert leader["workerId"] == worker.worker.worker_id


# ---- bad input: a clear 4xx, and the worker keeps serving -----------------------------------------


def post_raw(worker, name, function_config: str, files=None):
    url = f"{worker.url}/admin/v3/functions/public/default/{name}"
    return requests.post(url, files={"functionConfig": (None, function_config), **(files or {})}, timeout=10)


@pytest.mark.parametrize(
    "case, body, needle",
    [
        ("malformed", "{not json", "neither valid JSON nor YAML"),
        ("missing-inputs", json.dumps({"className": "exclaim.Exclaim"}), "No input topic"),
        (
            "parallelism-0",
            json.dumps({"className": "exclaim.Exclaim", "inputs": ["a"], "parallelism": 0}),
            "must be a positive number",
        ),
        (
            "parallelism-too-high",
            json.dumps({"className": "exclaim.Exclaim", "inputs": ["a"], "parallelism": MAX_PARALLELISM + 1}),
            "above this worker's limit",
        ),
        ("runtime-java", json.dumps({"className": "Exclaim", "inputs": ["a"], "runtime": "JAVA"}), "not supported"),
        ("bad-topic", json.dumps({"className": "exclaim.Exclaim", "inputs": ["a/b"]}), "invalid topic name"),
        ("unknown-class", json.dumps({"className": "exclaim.Nope", "inputs": ["a"]}), "has no attribute 'Nope'"),
    ],
)
def test_bad_create_is_a_clear_400(worker, case, body, needle):
    files = {"data": ("exclaim.py", (EXAMPLES / "exclaim.py").read_bytes())}
    resp = post_raw(worker, unique(case), body, files)
    assert resp.status_code == 400, resp.text
    assert needle in resp.json()["reason"]
    assert requests.get(worker.url + "/healthz", timeout=5).status_code == 200


def test_py_file_that_raises_on_import(worker):
    files = {"data": ("broken.py", b"import nonexistent_module_xyz\n")}
    resp = post_raw(worker, unique("broken"), json.dumps({"className": "broken.F", "inputs": ["a"]}), files)
    assert resp.status_code == 400
    assert "broken.py raised on import: ModuleNotFoundError" in resp.json()["reason"]


def test_duplicate_create_and_unknown_update(admin):
    name = unique("dup")
    cfg = config(name, "exclaim.Exclaim", [f"{name}-in"])
    admin.create(cfg, str(EXAMPLES / "exclaim.py"))
    with pytest.raises(AdminError, match="already exists") as dup:
        admin.create(cfg, str(EXAMPLES / "exclaim.py"))
    assert dup.value.status == 400
    with pytest.raises(AdminError, match="doesn't exist") as missing:
        admin.set_parallelism("public", "default", unique("ghost"), 2)
    assert missing.value.status == 404


def test_update_rules_follow_pulsar(admin):
    name = unique("upd")
    admin.create(config(name, "exclaim.Exclaim", [f"{name}-in"]), str(EXAMPLES / "exclaim.py"))
    with pytest.raises(AdminError, match="Update contains no change"):
        admin.set_parallelism("public", "default", name, 1)
    with pytest.raises(AdminError, match="Input Topics cannot be altered"):
        admin.update({"tenant": "public", "namespace": "default", "name": name, "inputs": ["other"]})
    with pytest.raises(AdminError, match="Processing Guarantees cannot be altered"):
        admin.update({"tenant": "public", "namespace": "default", "name": name, "processingGuarantees": "ATMOST_ONCE"})
    admin.set_parallelism("public", "default", name, 3)
    assert admin.get("public", "default", name)["parallelism"] == 3
    wait_until(lambda: admin.status("public", "default", name)["numRunning"] == 3, 20, "3 running instances")


def test_log_topic_receives_the_function_log(admin, client, tmp_path):
    code = tmp_path / "chatty.py"
    code.write_text(
        "from pulsar import Function\n\nclass Chatty(Function):\n"
        "    def process(self, input, context):\n        context.get_logger().info('saw %s', input)\n"
    )
    name = unique("chatty")
    logs = f"persistent://public/default/{name}-logs"
    collector = OutputCollector(client, logs)
    create(admin, config(name, "chatty.Chatty", [f"{name}-in"], logTopic=logs), str(code))
    send_all(client, f"{name}-in", ["hello"])
    wait_until(lambda: any(b"saw hello" in line for line in collector.counts), 30, "the log line on the log topic")
    collector.close()
