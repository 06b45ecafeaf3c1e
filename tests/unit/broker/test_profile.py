"""Which receiver queue each broker profile gives a function's input (the B1 and B18 fences)."""

from __future__ import annotations

from pulsar_autoscale.broker.profile import APACHE, LITE, SIBLING_QUEUE
from pulsar_autoscale.functions.model.config import FunctionConfig


def config(**fields) -> FunctionConfig:
    return FunctionConfig.from_dict({"tenant": "public", "namespace": "default", "name": "f",
                                     "className": "m.F", "inputs": ["in"], **fields})


def test_apache_keeps_the_functions_receiver_queue():
    for cfg in (config(), config(retainOrdering=True), config(receiverQueueSize=500)):
        assert APACHE.input_receiver_queue(cfg, beside_siblings=True) is None


def test_lite_caps_a_thread_instances_shared_input_and_only_that():
    assert LITE.input_receiver_queue(config(receiverQueueSize=500), beside_siblings=True) == SIBLING_QUEUE
    assert LITE.input_receiver_queue(config(receiverQueueSize=1), beside_siblings=True) == 1
    assert LITE.input_receiver_queue(config(receiverQueueSize=500)) is None   # the process runtime's one consumer
    assert LITE.input_receiver_queue(config(retainKeyOrdering=True), beside_siblings=True) is None
    assert LITE.input_receiver_queue(config(retainOrdering=True), beside_siblings=True) == LITE.failover_receiver_queue
