"""Read-your-writes across workers: what one worker has answered for, every worker answers the same way,
even when its metadata reader lags (CI once saw a status through worker 1 answer 404 right after a
create through worker 0)."""

from __future__ import annotations

import time
import uuid

import pulsar
import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.cluster.metadata import FunctionMetaDataManager
from pulsar_autoscale.functions.cluster.topics import ClusterTopics
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.functions.model.errors import Conflict, NotFound

LAG_S = 0.5  # what the lagging worker's reader takes per record (fault injection, not synchronisation)


@pytest.fixture
def managers(broker, tmp_path):
    """Two workers' metadata views of one cluster; the second one's reader lags LAG_S behind each record."""
    client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    topics = ClusterTopics(f"sync-{uuid.uuid4().hex[:6]}")
    fast = FunctionMetaDataManager(client, topics, tmp_path / "w0", "w0", 8)
    slow = FunctionMetaDataManager(client, topics, tmp_path / "w1", "w1", 8)
    apply = slow._meta_tailer._handle

    def lagging(msg):
        time.sleep(LAG_S)
        apply(msg)

    slow._meta_tailer._handle = lagging
    try:
        assert fast.wait_caught_up(10) and slow.wait_caught_up(10), "metadata readers did not catch up in 10 s"
        yield fast, slow
    finally:
        fast.close()
        slow.close()
        client.close()


def _config(name: str) -> FunctionConfig:
    return FunctionConfig.from_dict(
        {
            "tenant": "public",
            "namespace": "default",
            "name": name,
            "className": "pulsar_autoscale.functions.examples.exclaim.Exclaim",
            "inputs": [f"persistent://public/default/{name}-in"],
        }
    )


def test_a_function_created_through_one_worker_is_found_at_once_through_another(managers):
    fast, slow = managers
    cfg = fast.create(_config("made-on-w0"), None, None)
    assert slow.get(cfg.fqfn).config.name == "made-on-w0"


def test_a_function_deleted_through_one_worker_can_be_created_again_at_once_through_another(managers):
    fast, slow = managers
    cfg = fast.create(_config("again"), None, None)
    assert slow.get(cfg.fqfn).version == 1
    fast.delete(cfg.fqfn)
    slow.create(_config("again"), None, None)
    assert fast.get(cfg.fqfn).version == 1
    with pytest.raises(Conflict, match="already exists"):
        fast.create(_config("again"), None, None)


def test_a_function_updated_through_one_worker_can_be_deleted_at_once_through_another(managers):
    """The deleting worker has not read the update yet: its record names the version before it."""
    fast, slow = managers
    cfg = fast.create(_config("upd"), None, None)
    assert slow.get(cfg.fqfn).version == 1
    fast.update(cfg.fqfn, {"parallelism": 2}, None, None)
    slow.delete(cfg.fqfn)
    with pytest.raises(NotFound):
        fast.get(cfg.fqfn)


def test_an_update_back_to_what_this_worker_last_read_is_a_change(managers):
    """Scaled 1 -> 2 through one worker, then 2 -> 1 through another that still reads 1: not "no change"."""
    fast, slow = managers
    cfg = fast.create(_config("back"), None, None)
    assert slow.get(cfg.fqfn).config.parallelism == 1
    fast.update(cfg.fqfn, {"parallelism": 2}, None, None)
    assert slow.update(cfg.fqfn, {"parallelism": 1}, None, None).parallelism == 1
    assert fast.get(cfg.fqfn).version == 3
    with pytest.raises(ConfigError, match="no change"):
        slow.update(cfg.fqfn, {"parallelism": 1}, None, None)


def test_a_function_never_created_is_not_found_after_the_sync(managers):
    _, slow = managers
    with pytest.raises(NotFound, match="doesn't exist"):
        slow.get("public/default/never-made")
