"""Topic configs (core/topic_configs.py): which values are taken, how a request changes a set,
what a topic enforces, and how retention moves a start offset over whole objects."""

from __future__ import annotations

import pytest

from levelzero.core import topic_configs as tc
from levelzero.core.errors import InvalidConfig
from levelzero.core.topic_configs import (
    AlterOp,
    BrokerConfigs,
    ConfigSource,
    RetainedObject,
    TopicPolicy,
    altered,
    check_configs,
    describe_topic,
    retention_start_offset,
    topic_policy,
)

BROKER = BrokerConfigs(broker_id=7, message_max_bytes=1_000_000)


def test_enforced_and_stored_configs_are_taken_and_normalised() -> None:
    given = [
        ("retention.ms", " 60000"),
        ("retention.bytes", "-1"),
        ("cleanup.policy", "delete, delete"),
        ("max.message.bytes", "2048"),
        ("min.compaction.lag.ms", "5"),
        ("delete.retention.ms", "100"),
        ("segment.bytes", "1048576"),  # no such files here: any valid value behaves alike
        ("preallocate", "TRUE"),
        ("compression.type", "producer"),  # a default-only config at its default
    ]
    assert check_configs(given, BROKER) == {
        "retention.ms": "60000",
        "retention.bytes": "-1",
        "cleanup.policy": "delete",
        "max.message.bytes": "2048",
        "min.compaction.lag.ms": "5",
        "delete.retention.ms": "100",
        "segment.bytes": "1048576",
        "preallocate": "true",
        "compression.type": "producer",
    }


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("cleanup.policy", "shred", "String must be one of: compact, delete"),
        ("retention.ms", "-2", "Value must be at least -1"),
        ("retention.ms", "soon", "Not a number of type LONG"),
        ("retention.ms", "9" * 400, "Not a number of type LONG"),  # (was OverflowError: a 500)
        ("max.message.bytes", "9" * 400, "Not a number of type INT"),
        ("min.cleanable.dirty.ratio", "9" * 400, "Not a number of type DOUBLE"),  # inf
        ("max.message.bytes", "2147483648", "Not a number of type INT"),
        ("max.message.bytes", "1000001", "above the node's limit message.max.bytes 1000000"),
        ("compression.type", "gzip", "compression.type=gzip is not supported by levelzero"),
        ("message.timestamp.type", "LogAppendTime", "is not supported by levelzero"),
        ("no.such.config", "1", "Unknown topic config name: no.such.config"),
        ("retention.ms", None, "Null value not supported for topic configs: retention.ms"),
    ],
)
def test_unknown_malformed_or_unenforced_configs_are_refused(
    name: str, value: str | None, message: str
) -> None:
    with pytest.raises(InvalidConfig, match=message):
        check_configs([(name, value)], BROKER)


def test_compaction_is_one_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_configs([("cleanup.policy", "compact")], BROKER) == {"cleanup.policy": "compact"}
    monkeypatch.setattr(tc, "COMPACTION_ENABLED", False)
    with pytest.raises(InvalidConfig, match="cleanup.policy=compact is not supported"):
        check_configs([("cleanup.policy", "delete,compact")], BROKER)


def test_a_compacted_topics_policy_carries_its_compaction_settings() -> None:
    node = BrokerConfigs(broker_id=0, retention_ms=5000, retention_bytes=-1, message_max_bytes=4096)
    stored = {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": "7",
        "delete.retention.ms": "9",
        "min.cleanable.dirty.ratio": "0.25",
        "max.compaction.lag.ms": "11",
    }
    policy = topic_policy(stored, node)
    assert policy == TopicPolicy(None, None, 4096, True, 7, 9, 0.25, 11, deletes=False)
    assert not topic_policy({}, node).compacted
    assert topic_policy({"cleanup.policy": "compact"}, node).max_compaction_lag_ms is None  # Long.MAX


def test_incremental_ops_set_delete_append_and_subtract() -> None:
    current = {"retention.ms": "1000", "leader.replication.throttled.replicas": "0:1"}
    ops = [
        (AlterOp.SET, "retention.bytes", "500"),
        (AlterOp.DELETE, "retention.ms", None),
        (AlterOp.APPEND, "leader.replication.throttled.replicas", "1:1,0:1"),
        (AlterOp.SUBTRACT, "follower.replication.throttled.replicas", "2:2"),
    ]
    assert altered(current, ops, BROKER) == {
        "retention.bytes": "500",
        "leader.replication.throttled.replicas": "0:1,1:1",
        "follower.replication.throttled.replicas": "",
    }
    with pytest.raises(
        InvalidConfig, match="Config value append is not allowed for config key: retention.ms"
    ):
        altered({}, [(AlterOp.APPEND, "retention.ms", "5")], BROKER)
    # APPEND works on the default when unset: delete + compact
    assert altered({}, [(AlterOp.APPEND, "cleanup.policy", "compact")], BROKER) == {
        "cleanup.policy": "delete,compact"
    }


def test_a_topics_policy_falls_back_to_the_node_and_delete_policy_alone_retains() -> None:
    node = BrokerConfigs(broker_id=0, retention_ms=5000, retention_bytes=-1, message_max_bytes=4096)
    assert topic_policy({}, node) == TopicPolicy(5000, None, 4096)
    assert topic_policy({"retention.ms": "-1", "retention.bytes": "10"}, node) == TopicPolicy(None, 10, 4096)
    assert topic_policy({"cleanup.policy": ""}, node) == TopicPolicy(None, None, 4096, deletes=False)
    assert topic_policy({"max.message.bytes": "100"}, node).max_message_bytes == 100


def test_describe_reports_the_topic_value_then_the_broker_synonym() -> None:
    node = BrokerConfigs(broker_id=0, retention_ms=5000, retention_bytes=100)
    entries = {e.name: e for e in describe_topic({"retention.ms": "60000"}, node)}
    set_here, from_node, kafka_default = (
        entries["retention.ms"],
        entries["retention.bytes"],
        entries["segment.ms"],
    )
    assert (set_here.value, set_here.source, set_here.read_only) == (
        "60000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG,
        False,
    )
    assert [(s.name, s.value, s.source) for s in set_here.synonyms] == [
        ("retention.ms", "60000", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("log.retention.ms", "5000", ConfigSource.STATIC_BROKER_CONFIG),
        ("log.retention.hours", "168", ConfigSource.DEFAULT_CONFIG),  # Kafka's default, in hours
    ]
    assert (from_node.value, from_node.source) == ("100", ConfigSource.STATIC_BROKER_CONFIG)
    # a node setting left at Kafka's own default reads as Kafka's default, as a broker's would
    unset = {e.name: e for e in describe_topic({}, BrokerConfigs(broker_id=0))}["retention.bytes"]
    assert (unset.value, unset.source, unset.synonyms[0].name) == (
        "-1",
        ConfigSource.DEFAULT_CONFIG,
        "log.retention.bytes",
    )
    assert (kafka_default.value, kafka_default.is_default) == ("604800000", True)
    assert [e.name for e in describe_topic({}, node, ["retention.ms", "nope"])] == ["retention.ms"]


def objects(*sizes_and_ages: tuple[int, float]) -> list[RetainedObject]:
    """Objects of 10 records each, oldest first: (size, created_at)."""
    return [RetainedObject(10 * i + 9, size, at) for i, (size, at) in enumerate(sizes_and_ages)]


def test_retention_by_time_takes_the_oldest_objects_while_each_is_expired() -> None:
    objs = objects((100, 0.0), (100, 50.0), (100, 10.0), (100, 90.0))
    # at 100 with 55 s: the objects of 0 and 10 are expired, but 10 sits after 50, which is not
    assert retention_start_offset(objs, 0, 100.0, 55.0, None) == 10
    assert retention_start_offset(objs, 0, 100.0, 45.0, None) == 30
    assert retention_start_offset(objs, 0, 100.0, 5.0, None) == 40
    assert retention_start_offset(objs, 0, 100.0, None, None) == 0


def test_retention_by_size_keeps_at_least_the_limit_as_kafka_does() -> None:
    objs = objects((100, 0.0), (200, 0.0), (300, 0.0))
    assert retention_start_offset(objs, 0, 0.0, None, 500) == 10  # 600 -> 500 left
    assert retention_start_offset(objs, 0, 0.0, None, 501) == 0  # deleting one leaves 500 < 501
    assert retention_start_offset(objs, 0, 0.0, None, 1) == 20  # the newest object always stays
    assert retention_start_offset(objs, 15, 0.0, None, 300) == 20  # what is below start is gone


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        (
            {"leader.replication.throttled.replicas": "garbage"},
            "must be the literal '*' or a list of replicas in the following format",
        ),
        ({"follower.replication.throttled.replicas": "1:x"}, "must be the literal '*'"),
        ({"message.format.version": "bogus"}, "Version `bogus` is not a valid version"),
        ({"message.format.version": "9.9"}, "Version `9.9` is not a valid version"),  # no such release
        ({"message.format.version": "3.8-IV1"}, "Version `3.8-IV1` is not a valid version"),
        ({"message.format.version": "0.10"}, "Version `0.10` is not a valid version"),
        ({"compression.gzip.level": "10"}, "Value must be between 1 and 9, or -1"),
        ({"compression.lz4.level": "0"}, "Value must be at least 1"),
        ({"remote.storage.enable": "true"}, "Tiered Storage functionality is disabled in the broker"),
        (
            {"min.compaction.lag.ms": "5000", "max.compaction.lag.ms": "1000"},
            "conflict topic config setting min.compaction.lag.ms (5000) > max.compaction.lag.ms (1000)",
        ),
    ],
)
def test_what_kafkas_validators_refuse_is_refused(configs: dict[str, str], message: str) -> None:
    """Beyond type and range, as Kafka's validators: throttled replica lists, message format
    versions, compression levels, tiered storage (disabled), and the set's compaction lags."""
    with pytest.raises(InvalidConfig) as refused:
        check_configs(configs.items(), BROKER)
    assert message in str(refused.value)


def test_what_kafkas_validators_take_is_taken() -> None:
    taken = {
        "leader.replication.throttled.replicas": "*",
        "follower.replication.throttled.replicas": "0:1,1:2",
        "message.format.version": "3.0-IV1",
        "compression.gzip.level": "-1",
        "compression.zstd.level": "-5",
        "remote.log.copy.disable": "true",  # Kafka 3.9 (KIP-950)
        "remote.log.delete.on.disable": "false",
        "remote.storage.enable": "false",
        "min.compaction.lag.ms": "1000",
        "max.compaction.lag.ms": "1000",
    }
    assert check_configs(taken.items(), BROKER) == taken
    # one lag altered past the other already set: refused, on the set as it would be
    with pytest.raises(
        InvalidConfig, match=r"min.compaction.lag.ms \(2000\) > max.compaction.lag.ms \(1000\)"
    ):
        altered(taken, [(AlterOp.SET, "min.compaction.lag.ms", "2000")], BROKER)
    (entry,) = [e for e in describe_topic({}, BROKER, ["remote.log.copy.disable"])]
    assert (entry.value, entry.source) == ("false", ConfigSource.DEFAULT_CONFIG)


@pytest.mark.parametrize(
    "version", ["0.8.0", "0.10.0-IV1", "0.10.2", "0.10.0.1", "1.0.1", "2.8-IV1", "3.0-IV1", "3.7-IV4", "3.9"]
)
def test_a_message_format_version_kafka_knows_is_taken(version: str) -> None:
    """Kafka's MetadataVersion names: a release or a release and its IV; past a release's parts
    anything is ignored ("1.0.1" is 1.0, "0.10.0.1" is 0.10.0)."""
    assert check_configs([("message.format.version", version)], BROKER) == {"message.format.version": version}
