"""FunctionConfig: Pulsar's field names, derived subscription, validation messages."""

import pytest

from pulsar_autoscale.errors import ConfigError
from pulsar_autoscale.functions.model.config import FunctionConfig
from pulsar_autoscale.topics import normalize_topic

BASE = {"name": "f", "className": "m.C", "inputs": ["in"]}


def test_short_topic_names_are_normalized_like_pulsar():
    assert normalize_topic("t") == "persistent://public/default/t"
    assert normalize_topic("a/b/t") == "persistent://a/b/t"
    with pytest.raises(ConfigError, match="invalid topic name"):
        normalize_topic("a/t")


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({}, "SHARED"),
        ({"retainOrdering": True}, "FAILOVER"),
        ({"retainKeyOrdering": True}, "KEY_SHARED"),
    ],
)
def test_subscription_type_is_derived_as_pulsar_does(extra, expected):
    assert FunctionConfig.from_dict({**BASE, **extra}).subscription_type == expected


def test_default_subscription_name_is_fqfn_unless_subname():
    assert FunctionConfig.from_dict({**BASE, "tenant": "t", "namespace": "n"}).subscription_name == "t/n/f"
    assert FunctionConfig.from_dict({**BASE, "subName": "mine"}).subscription_name == "mine"


def test_input_specs_and_receiver_queue_round_trip():
    cfg = FunctionConfig.from_dict(
        {
            "name": "f",
            "className": "m.C",
            "inputSpecs": {"x": {"receiverQueueSize": 7, "serdeClassName": "m.S"}},
            "customRuntimeOptions": "k",
        }
    )
    assert cfg.inputs == ("persistent://public/default/x",) and cfg.receiverQueueSize == 7
    assert cfg.customSerdeInputs == {"persistent://public/default/x": "m.S"}
    again = FunctionConfig.from_dict(cfg.to_dict())
    assert again == cfg and again.customRuntimeOptions == "k"


FULL = {
    **BASE,
    "autoAck": True,
    "cleanupSubscription": False,
    "customRuntimeOptions": '{"a": 1}',
    "customSerdeInputs": {"in": "serde.IdentitySerDe"},
    "deadLetterTopic": "dlq",
    "maxMessageRetries": 2,
    "forwardSourceMessageProperty": False,
    "logTopic": "log",
    "output": "out",
    "outputSerdeClassName": "serde.PickleSerDe",
    "parallelism": 2,
    "processingGuarantees": "ATLEAST_ONCE",
    "producerConfig": {"maxPendingMessages": 10, "compressionType": "LZ4", "batchBuilder": "KEY_BASED"},
    "resources": {"cpu": 0.5, "ram": 1024, "disk": 2048},
    "retainKeyOrdering": True,
    "secrets": {"s": "v"},
    "skipToLatest": True,
    "subName": "sub",
    "subscriptionPosition": "Earliest",
    "timeoutMs": 30000,
    "userConfig": {"k": 1},
    "maxPendingAsyncRequests": 1000,
    "exposePulsarAdminClientEnabled": False,
    "runtime": "PYTHON",
    "fqfn": "public/default/f",
    "py": "m.py",
}


def test_every_honoured_field_round_trips_through_get():
    cfg = FunctionConfig.from_dict(FULL)
    shown = cfg.to_dict()
    assert shown["resources"] == {"cpu": 0.5, "ram": 1024, "disk": 2048}
    assert shown["deadLetterTopic"] == "persistent://public/default/dlq" and shown["maxMessageRetries"] == 2
    assert shown["producerConfig"] == {"maxPendingMessages": 10, "compressionType": "LZ4", "batchBuilder": "KEY_BASED"}
    assert (shown["subscriptionPosition"], shown["timeoutMs"], shown["skipToLatest"]) == ("Earliest", 30000, True)
    assert FunctionConfig.from_dict(shown) == cfg


def test_update_merges_like_pulsar_and_receiver_queue_shorthand_wins():
    cfg = FunctionConfig.from_dict({**BASE, "receiverQueueSize": 5})
    assert cfg.merged({"receiverQueueSize": 7}).receiverQueueSize == 7
    assert cfg.merged({"maxMessageRetries": 2}).maxMessageRetries == 2
    with pytest.raises(ConfigError, match="Subscription Name cannot be altered"):
        cfg.merged({"subName": "other"})
    with pytest.raises(ConfigError, match="autoAck must be a boolean"):
        cfg.merged({"autoAck": "no"})


def test_resources_given_in_part_get_pulsars_defaults():
    cfg = FunctionConfig.from_dict({**BASE, "resources": {"cpu": 2}})
    assert (cfg.resources.cpu, cfg.resources.ram, cfg.resources.disk) == (2.0, 1073741824, 10737418240)


def test_default_dead_letter_topic_is_derived_as_the_pulsar_client_does():
    cfg = FunctionConfig.from_dict({**BASE, "maxMessageRetries": 1})
    assert cfg.dead_letter_topics() == ["persistent://public/default/in-public/default/f-DLQ"]
    assert FunctionConfig.from_dict(BASE).dead_letter_topics() == []
    assert FunctionConfig.from_dict({**BASE, "maxMessageRetries": -1}).maxMessageRetries is None


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"subName": 123}, "subName must be a string, got integer 123"),
        ({"receiverQueueSize": 2**31}, "receiverQueueSize must be an integer from 1 to 2147483647"),
        ({"inputSpecs": {"in": {"receiverQueueSize": 2**31}}}, "inputSpecs.in.receiverQueueSize must be an integer"),
        ({"retainOrdering": "false"}, "retainOrdering must be a boolean"),
        ({"autoAck": 1}, "autoAck must be a boolean"),
        ({"inputs": "in"}, "inputs must be an array of topic names, got string"),
        ({"inputs": [1]}, r"inputs\[0\] must be a string"),
        ({"parallelism": 1.5}, "parallelism must be an integer, got number"),
        ({"userConfig": [1]}, "userConfig must be an object, got array"),
        ({"resources": {"cpu": "1"}}, "resources.cpu must be a number"),
        ({"resources": {"gpu": 1}}, "resources.gpu is not a Resources field"),
        ({"maxMessageRetries": 0}, "maxMessageRetries must be at least 1"),
        ({"timeoutMs": 500}, "timeoutMs must be at least 10000"),
        ({"subscriptionPosition": "Middle"}, "subscriptionPosition 'Middle' is unknown"),
        ({"deadLetterTopic": "d"}, "Dead Letter Topic specified, however max retries is set to infinity"),
        ({"maxMessageRetries": 1, "processingGuarantees": "ATMOST_ONCE"}, "maxMessageRetries needs ATLEAST_ONCE"),
        ({"autoAck": False, "processingGuarantees": "ATMOST_ONCE"}, "autoAck must be true"),
        ({"extra": {}}, "'extra' is not a FunctionConfig field"),
        ({"windowConfig": {"windowLengthCount": 10}}, "windowConfig is not supported by this worker"),
        ({"jar": "f.jar"}, "jar is not supported by this worker"),
        ({"outputSchemaType": "JSON"}, "outputSchemaType is not supported by this worker"),
        ({"customSchemaInputs": {"in": "AVRO"}}, "customSchemaInputs is not supported by this worker"),
        ({"runtimeFlags": "-X"}, "runtimeFlags is not supported by this worker"),
        ({"maxPendingAsyncRequests": 5}, "maxPendingAsyncRequests is not supported by this worker"),
        ({"exposePulsarAdminClientEnabled": True}, "exposePulsarAdminClientEnabled is not supported"),
        ({"producerConfig": {"cryptoConfig": {"encryptionKeys": ["k"]}}}, "producerConfig.cryptoConfig is not supported"),
        ({"inputSpecs": {"x": {"schemaType": "AVRO"}}}, "inputSpecs.x.schemaType is not supported"),
        ({"topicsPattern": "in-.*"}, "topicsPattern and inputs cannot both be set"),
        ({"topicsPattern": "(", "inputs": []}, "not a valid regular expression"),
        ({"fqfn": "a/b/c"}, "does not match"),
        ({"name": "x" * 300}, "at most 128"),
    ],
)
def test_strict_types_and_refusals_name_the_field(extra, needle):
    with pytest.raises(ConfigError, match=needle):
        FunctionConfig.from_dict({**BASE, **extra})


def test_topics_pattern_alone_is_accepted():
    cfg = FunctionConfig.from_dict({"name": "f", "className": "m.C", "topicsPattern": "persistent://public/default/in-.*"})
    assert cfg.topicsPattern == "persistent://public/default/in-.*" and cfg.inputs == ()


def test_manual_guarantees_mean_the_function_acks():
    assert not FunctionConfig.from_dict({**BASE, "processingGuarantees": "MANUAL"}).auto_ack
    assert not FunctionConfig.from_dict({**BASE, "autoAck": False}).auto_ack
    assert FunctionConfig.from_dict(BASE).auto_ack


def test_yaml_config_file(tmp_path):
    f = tmp_path / "fn.yaml"
    f.write_text("name: y\nclassName: m.C\ninputs: [a, b]\nparallelism: 2\nuserConfig: {k: v}\n")
    cfg = FunctionConfig.from_file(f)
    assert cfg.parallelism == 2 and len(cfg.inputs) == 2 and cfg.userConfig == {"k": "v"}


@pytest.mark.parametrize(
    "extra, needle",
    [
        ({"parallelism": "2"}, "parallelism must be an integer"),
        ({"processingGuarantees": "EFFECTIVELY_ONCE", "autoAck": False}, "autoAck must be true"),
        ({"processingGuarantees": "SOMETIMES"}, "is unknown"),
        ({"retainOrdering": True, "retainKeyOrdering": True}, "cannot both be set"),
        ({"output": "in"}, "also an input topic"),
        ({"name": "bad name"}, "invalid characters"),
    ],
)
def test_validation_names_the_field(extra, needle):
    with pytest.raises(ConfigError, match=needle):
        FunctionConfig.from_dict({**BASE, **extra})


@pytest.mark.parametrize(
    "payload",
    [
        b"hello",
        b"12",
        b"-3.5",
        b"1e3",
        b"2j",
        b"inf",
        b" NaN ",
        b"x1",
        b"",
        b"\xff\xfe",
        b"Infinity",
        b"0x10",
        b"(1+2j)",
        b" 7 ",
        b"nothing",
        b"-",
        b"\xd9\xa1",
        b'{"a": 1}',
        "\u00e9t\u00e9".encode(),
    ],
)
def test_identity_deserialize_matches_pulsar(payload):
    from pulsar.functions.serde import IdentitySerDe

    from pulsar_autoscale.functions.instance.context import identity_deserialize

    expected = IdentitySerDe().deserialize(payload)
    got = identity_deserialize(payload)
    assert type(got) is type(expected) and (got == expected or (got != got and expected != expected))


def test_the_table_covers_every_published_field():
    """docs/function-config.md has a row for every FunctionConfig field of the published schema copy, and
    the parser knows every one of them (nothing falls through to 'not a FunctionConfig field')."""
    import json
    import re
    from pathlib import Path

    from pulsar_autoscale.functions.model.refused_fields import OUR_FIELDS, SCHEMA_FIELDS
    from tests.support.contracts.published import FUNCTIONS_DOC

    root = Path(__file__).resolve().parents[4]
    schema = json.loads(FUNCTIONS_DOC.read_text())
    published = set(schema["definitions"]["FunctionConfig"]["properties"])
    table = (root / "docs" / "function-config.md").read_text()
    rows = {name for line in table.splitlines() if line.startswith("| `") for name in re.findall(r"`(\w+)`", line.split("|")[1])}
    assert published - rows == set(), "fields without a row in docs/function-config.md"
    assert published - SCHEMA_FIELDS == set(), "fields the parser does not know"
    assert not OUR_FIELDS & published


def test_state_id_is_the_workers_and_fixed_for_the_functions_life():
    """A created function gets a stateId of its own (its state topics' names); a user can neither give one
    at create nor change it, and a config saved before stateId existed keeps the old topic names."""
    from pulsar_autoscale.functions.model.config import with_new_state
    from pulsar_autoscale.functions.state.changelog import changelog_of

    base = {"name": "f", "className": "m.C", "inputs": ["in"], "keyedState": True}
    cfg = with_new_state(FunctionConfig.from_dict(base))
    again = with_new_state(FunctionConfig.from_dict(base))
    assert cfg.stateId and again.stateId != cfg.stateId
    assert changelog_of(cfg).topic == f"persistent://public/default/__state-f-{cfg.stateId}-changelog"
    assert FunctionConfig.from_dict(cfg.to_dict()) == cfg  # persisted and read back
    assert cfg.merged({"parallelism": 2}).stateId == cfg.stateId
    with pytest.raises(ConfigError, match="stateId cannot be altered"):
        cfg.merged({"stateId": "abc"})
    with pytest.raises(ConfigError, match="stateId is assigned by the worker"):
        with_new_state(cfg)
    with pytest.raises(ConfigError, match="stateId 'x y'"):
        FunctionConfig.from_dict({**base, "stateId": "x y"})
    assert changelog_of(FunctionConfig.from_dict(base)).topic == "persistent://public/default/__state-f-changelog"


def test_changelog_shards_are_fixed_at_create():
    """keyedState functions get a sharded changelog by default, others one topic; a config saved before the
    field existed keeps its one topic; the count is checked against numKeyGroups and cannot change."""
    from pulsar_autoscale.functions.model.config import DEFAULT_KEYED_CHANGELOG_SHARDS, with_new_state
    from pulsar_autoscale.functions.state.changelog import changelog_of

    keyed = {"name": "f", "className": "m.C", "inputs": ["in"], "keyedState": True}
    cfg = with_new_state(FunctionConfig.from_dict(keyed))
    log = changelog_of(cfg)
    assert cfg.changelogShards == log.shards == DEFAULT_KEYED_CHANGELOG_SHARDS
    assert [log.shard(g) for g in (0, 7, 8, 127)] == [0, 0, 1, 15]  # contiguous ranges of 8 of the 128 groups
    assert log.shard_topic(3) == f"{log.topic}-3"
    assert FunctionConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="changelogShards cannot be altered"):
        cfg.merged({"changelogShards": 4})
    plain = with_new_state(FunctionConfig.from_dict({**keyed, "keyedState": False}))
    assert plain.changelogShards == 1 and changelog_of(plain).shard_topic(0) == changelog_of(plain).topic
    assert with_new_state(FunctionConfig.from_dict({**keyed, "numKeyGroups": 4})).changelogShards == 4
    assert with_new_state(FunctionConfig.from_dict({**keyed, "changelogShards": 2})).changelogShards == 2
    saved_before = FunctionConfig.from_dict({**keyed, "stateId": "abc123"})
    assert saved_before.changelogShards == 0 and changelog_of(saved_before).shards == 1
    with pytest.raises(ConfigError, match=r"changelogShards \(8\) must be at most numKeyGroups \(4\)"):
        FunctionConfig.from_dict({**keyed, "numKeyGroups": 4, "changelogShards": 8})
