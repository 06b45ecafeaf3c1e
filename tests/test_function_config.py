"""FunctionConfig: Pulsar's field names, derived subscription, validation messages."""

import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.config import FunctionConfig, normalize_topic

BASE = {"name": "f", "className": "m.C", "inputs": ["in"]}


def test_short_topic_names_are_normalized_like_pulsar():
    assert normalize_topic("t") == "persistent://public/default/t"
    assert normalize_topic("a/b/t") == "persistent://a/b/t"
    with pytest.raises(ConfigError, match="invalid topic name"):
        normalize_topic("a/t")


@pytest.mark.parametrize("extra, expected", [
    ({}, "SHARED"),
    ({"retainOrdering": True}, "FAILOVER"),
    ({"retainKeyOrdering": True}, "KEY_SHARED"),
])
def test_subscription_type_is_derived_as_pulsar_does(extra, expected):
    assert FunctionConfig.from_dict({**BASE, **extra}).subscription_type == expected


def test_default_subscription_name_is_fqfn_unless_subname():
    assert FunctionConfig.from_dict({**BASE, "tenant": "t", "namespace": "n"}).subscription_name == "t/n/f"
    assert FunctionConfig.from_dict({**BASE, "subName": "mine"}).subscription_name == "mine"


def test_input_specs_and_receiver_queue_round_trip():
    cfg = FunctionConfig.from_dict({"name": "f", "className": "m.C",
                                    "inputSpecs": {"x": {"receiverQueueSize": 7}}, "customRuntimeOptions": "k"})
    assert cfg.inputs == ("persistent://public/default/x",) and cfg.receiverQueueSize == 7
    again = FunctionConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.extra == {"customRuntimeOptions": "k"}


def test_yaml_config_file(tmp_path):
    f = tmp_path / "fn.yaml"
    f.write_text("name: y\nclassName: m.C\ninputs: [a, b]\nparallelism: 2\nuserConfig: {k: v}\n")
    cfg = FunctionConfig.from_file(f)
    assert cfg.parallelism == 2 and len(cfg.inputs) == 2 and cfg.userConfig == {"k": "v"}


@pytest.mark.parametrize("extra, needle", [
    ({"parallelism": "2"}, "parallelism must be an integer"),
    ({"processingGuarantees": "EFFECTIVELY_ONCE"}, "not supported"),
    ({"processingGuarantees": "SOMETIMES"}, "is unknown"),
    ({"retainOrdering": True, "retainKeyOrdering": True}, "cannot both be set"),
    ({"output": "in"}, "also an input topic"),
    ({"name": "bad name"}, "invalid characters"),
])
def test_validation_names_the_field(extra, needle):
    with pytest.raises(ConfigError, match=needle):
        FunctionConfig.from_dict({**BASE, **extra})


@pytest.mark.parametrize("payload", [b"hello", b"12", b"-3.5", b"1e3", b"2j", b"inf", b" NaN ", b"x1", b"", b"\xff\xfe",
                                     b"Infinity", b"0x10", b"(1+2j)", b" 7 ", b"nothing", b"-", b"\xd9\xa1", b'{"a": 1}', "\u00e9t\u00e9".encode()])
def test_identity_deserialize_matches_pulsar(payload):
    from pulsar.functions.serde import IdentitySerDe

    from pulsar_autoscale.functions.context import identity_deserialize
    expected = IdentitySerDe().deserialize(payload)
    got = identity_deserialize(payload)
    assert type(got) is type(expected) and (got == expected or (got != got and expected != expected))
