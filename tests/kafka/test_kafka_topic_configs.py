"""Topic configs through real Kafka clients: confluent-kafka's AdminClient (DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs, CreateTopics with configs and validate_only) and
kafka-python's KafkaAdminClient; what the node enforces of them (max.message.bytes on Produce
and on HTTP, retention.bytes moving the start offset that ListOffsets earliest reports); and
topic auto-creation (`kafka.auto_create_topics`, off by default). The synchronous clients run in
worker threads; the daemon runs on the test's event loop."""

from __future__ import annotations

import random

from pathlib import Path
from typing import Any

import anyio
import pytest

from daemon_support import daemon_and_client
from levelzero.client import ApiError
from levelzero.kafka.protocol import make
from test_kafka_listener import Wire, module_of

TOPIC_CONFIG = 1  # Kafka's ConfigSource values as confluent-kafka reports them
STATIC_BROKER = 4
DEFAULT = 5


def admin(port: int) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})


def topic_resource(name: str, **kwargs: Any) -> Any:
    from confluent_kafka.admin import ConfigResource, ResourceType

    return ConfigResource(ResourceType.TOPIC, name, **kwargs)


def describe(port: int, name: str) -> dict[str, Any]:
    a = admin(port)
    resource = topic_resource(name)
    return a.describe_configs([resource], request_timeout=20)[resource].result()


def error_of(future: Any) -> str | None:
    """The Kafka error name a future failed with, or None."""
    from confluent_kafka import KafkaException

    try:
        future.result()
    except KafkaException as exc:
        return exc.args[0].name()
    return None


def confluent_create(port: int) -> dict[str, str | None]:
    from confluent_kafka.admin import NewTopic

    a = admin(port)
    futures = a.create_topics(
        [
            NewTopic("kept", 2, config={"retention.ms": "60000", "max.message.bytes": "5000"}),
            NewTopic("appendtime", 1, config={"message.timestamp.type": "LogAppendTime"}),
            NewTopic("misspelt", 1, config={"retention.msec": "1"}),
            NewTopic("gzipped", 1, config={"compression.type": "gzip"}),
        ],
        request_timeout=20,
    )
    results = {name: error_of(f) for name, f in futures.items()}
    checked = a.create_topics(
        [NewTopic("only-checked", 1, config={"retention.bytes": "1"})], validate_only=True, request_timeout=20
    )
    results.update({name: error_of(f) for name, f in checked.items()})
    return results


async def test_create_topics_stores_configs_and_refuses_what_is_not_enforced(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        port = daemon.kafka_port
        assert await anyio.to_thread.run_sync(confluent_create, port) == {
            "kept": None,
            "appendtime": "INVALID_CONFIG",  # never created with the config dropped
            "misspelt": "INVALID_CONFIG",
            "gzipped": "INVALID_CONFIG",
            "only-checked": None,
        }
        assert {t.name: t.partitions for t in await client.list_topics()} == {"kept": 2}
        assert await daemon.node.log_store.topic_configs() == {
            "kept": {"max.message.bytes": "5000", "retention.ms": "60000"}
        }
        configs = {c.name: c for c in (await client.topic_configs("kept")).configs}
        assert (configs["retention.ms"].value, configs["retention.ms"].source) == ("60000", "topic")
        assert (configs["retention.bytes"].value, configs["retention.bytes"].source) == ("-1", "default")


def confluent_create_twice(port: int) -> dict[str, str | None]:
    from confluent_kafka.admin import NewTopic

    a = admin(port)  # kept until the answers are in (a client destroyed fails them)
    futures = a.create_topics(
        [NewTopic("twice", 1), NewTopic("once", 2), NewTopic("twice", 3)], request_timeout=20
    )
    return {name: error_of(f) for name, f in futures.items()}


async def test_a_topic_named_twice_in_one_create_topics_is_made_under_neither_entry(tmp_path: Path) -> None:
    """Kafka's controller answers a duplicate name once, INVALID_REQUEST, and makes neither
    entry; the other topics are made. (Answered once per entry, librdkafka failed the whole
    request: "Broker returned topic twice multiple times".)"""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        results = await anyio.to_thread.run_sync(confluent_create_twice, daemon.kafka_port)
        assert results == {"twice": "INVALID_REQUEST", "once": None}
        assert {t.name: t.partitions for t in await client.list_topics()} == {"once": 2}


def confluent_alter(port: int) -> dict[str, Any]:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    a = admin(port)
    seen: dict[str, Any] = {}
    first = describe(port, "t")
    seen["created"] = {
        name: (first[name].value, first[name].source, first[name].is_default, first[name].is_read_only)
        for name in ("retention.ms", "retention.bytes", "segment.bytes")
    }
    seen["synonyms"] = [(s.name, s.value, s.source) for s in first["retention.ms"].synonyms.values()]

    def incremental(*entries: Any, validate_only: bool = False) -> str | None:
        (future,) = a.incremental_alter_configs(
            [topic_resource("t", incremental_configs=list(entries))],
            validate_only=validate_only,
            request_timeout=20,
        ).values()
        return error_of(future)

    set_op, delete_op = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    seen["set"] = incremental(
        ConfigEntry("retention.bytes", "1000", incremental_operation=set_op),
        ConfigEntry("retention.ms", None, incremental_operation=delete_op),
    )
    seen["validate_only"] = incremental(
        ConfigEntry("max.message.bytes", "100", incremental_operation=set_op), validate_only=True
    )
    seen["append_to_a_number"] = incremental(
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND)
    )
    seen["append_compact"] = incremental(
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        validate_only=True,  # accepted (delete + compact), not applied: t stays a delete topic
    )
    after = describe(port, "t")
    seen["after_incremental"] = {
        n: (after[n].value, after[n].source) for n in ("retention.ms", "retention.bytes")
    }
    seen["max.message.bytes"] = after["max.message.bytes"].value
    # AlterConfigs: the whole set is replaced; retention.bytes, not named, goes back
    (future,) = a.alter_configs(
        [topic_resource("t", set_config={"min.compaction.lag.ms": "5", "delete.retention.ms": "7"})],
        request_timeout=20,
    ).values()
    seen["alter"] = error_of(future)
    replaced = describe(port, "t")
    seen["after_alter"] = {
        n: (replaced[n].value, replaced[n].source)
        for n in ("retention.bytes", "min.compaction.lag.ms", "delete.retention.ms")
    }
    broker = ConfigResource(ResourceType.BROKER, "0")
    described = a.describe_configs([broker], request_timeout=20)[broker].result()
    seen["broker"] = {
        n: (described[n].value, described[n].is_read_only) for n in ("message.max.bytes", "log.retention.ms")
    }
    (future,) = a.alter_configs(
        [ConfigResource(ResourceType.BROKER, "0", set_config={"num.partitions": "3"})]
    ).values()
    seen["broker_alter"] = error_of(future)
    missing = topic_resource("missing")
    seen["missing"] = error_of(a.describe_configs([missing], request_timeout=20)[missing])
    return seen


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
async def test_confluent_describes_and_alters_topic_configs(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", housekeeper__retention_s=3600.0) as (
        daemon,
        client,
    ):
        await client.create_topic("t", 1, {"retention.ms": "60000"})
        seen = await anyio.to_thread.run_sync(confluent_alter, daemon.kafka_port)
    assert seen["created"] == {
        "retention.ms": ("60000", TOPIC_CONFIG, False, False),
        # the node keeps whatever the size: Kafka's own default, reported as such
        "retention.bytes": ("-1", DEFAULT, True, False),
        "segment.bytes": ("1073741824", DEFAULT, True, False),
    }
    assert seen["synonyms"] == [
        ("retention.ms", "60000", TOPIC_CONFIG),
        ("log.retention.ms", "3600000", STATIC_BROKER),
        ("log.retention.hours", "168", DEFAULT),
    ]
    assert (seen["set"], seen["validate_only"]) == (None, None)
    assert (seen["append_to_a_number"], seen["append_compact"]) == ("INVALID_CONFIG", None)
    assert seen["after_incremental"] == {
        "retention.ms": ("3600000", STATIC_BROKER),  # deleted: the node's retention again
        "retention.bytes": ("1000", TOPIC_CONFIG),
    }
    assert seen["max.message.bytes"] == str(4 * 1024 * 1024)  # validate_only changed nothing
    assert seen["alter"] is None
    assert seen["after_alter"] == {
        "retention.bytes": ("-1", DEFAULT),
        "min.compaction.lag.ms": ("5", TOPIC_CONFIG),
        "delete.retention.ms": ("7", TOPIC_CONFIG),
    }
    assert seen["broker"] == {
        "message.max.bytes": (str(4 * 1024 * 1024), True),
        "log.retention.ms": ("3600000", True),
    }
    assert seen["broker_alter"] == "INVALID_REQUEST"
    assert seen["missing"] == "UNKNOWN_TOPIC_OR_PART"  # librdkafka's name of the code


def confluent_synonyms(port: int) -> dict[str, Any]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    def shown(entries: dict[str, Any], name: str) -> tuple[str, int, list[tuple[str, str, int]]]:
        e = entries[name]
        return e.value, e.source, [(s.name, s.value, s.source) for s in e.synonyms.values()]

    topic = describe(port, "t")
    broker = ConfigResource(ResourceType.BROKER, "0")
    a = admin(port)  # kept until the answer is in (a client destroyed fails it)
    node = a.describe_configs([broker], request_timeout=20)[broker].result()
    names = ("retention.ms", "segment.ms", "segment.jitter.ms", "flush.ms", "remote.storage.enable")
    return {
        "topic": {name: shown(topic, name) for name in names},
        "broker": shown(node, "log.retention.ms"),
    }


async def test_describe_configs_lists_kafkas_broker_synonyms_in_kafkas_order(tmp_path: Path) -> None:
    """As Kafka's ConfigHelper: a topic config's broker synonyms (ServerTopicConfigSynonyms) that
    the node sets, then those with a Kafka default, leading ones other than the first-named
    dropped. The node keeps records forever unless configured: `log.retention.ms=-1`, set, over
    Kafka's default `log.retention.hours=168`; `log.roll.ms` has no default, so `segment.ms` has
    no synonym (Kafka drops the leading `log.roll.hours`); `remote.storage.enable` has no broker
    config at all."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("t", 1)
        seen = await anyio.to_thread.run_sync(confluent_synonyms, daemon.kafka_port)
    retention = (
        "-1",
        STATIC_BROKER,
        [("log.retention.ms", "-1", STATIC_BROKER), ("log.retention.hours", "168", DEFAULT)],
    )
    assert seen["topic"] == {
        "retention.ms": retention,
        "segment.ms": ("604800000", DEFAULT, []),
        "segment.jitter.ms": ("0", DEFAULT, []),
        "flush.ms": ("9223372036854775807", DEFAULT, []),
        "remote.storage.enable": ("false", DEFAULT, []),
    }
    assert seen["broker"] == retention


def kafka_python_describe(port: int) -> Any:
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    a = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=20_000)
    try:
        return {
            config_filter: a.describe_configs(
                [
                    ConfigResource(
                        ConfigResourceType.TOPIC, "t", {"retention.ms": None, "cleanup.policy": None}
                    ),
                    ConfigResource(ConfigResourceType.BROKER, "0"),
                ],
                config_filter=config_filter,
            )
            for config_filter in ("modified", "all")
        }
    finally:
        a.close()


async def test_kafka_python_describes_topic_and_broker_configs(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", kafka__default_partitions=3) as (
        daemon,
        client,
    ):
        await client.create_topic("t", 1, {"retention.ms": "-1"})
        seen = await anyio.to_thread.run_sync(kafka_python_describe, daemon.kafka_port)

    def shown(described: dict[str, Any]) -> dict[str, tuple[str, str, bool]]:
        return {k: (v["value"], v["config_source"], v["read_only"]) for k, v in described.items()}

    # "modified": what was set on the topic (kafka-python goes by the config source)
    assert shown(seen["modified"]["topic"]["t"]) == {"retention.ms": ("-1", "DYNAMIC_TOPIC_CONFIG", False)}
    assert seen["modified"]["broker"]["0"] == {}
    assert shown(seen["all"]["topic"]["t"]) == {
        "retention.ms": ("-1", "DYNAMIC_TOPIC_CONFIG", False),
        "cleanup.policy": ("delete", "DEFAULT_CONFIG", False),  # the node's is Kafka's default
    }
    broker = shown(seen["all"]["broker"]["0"])
    # what kafka-python's own suite reads of a broker: its advertised listener, set, read-only
    assert broker["advertised.listeners"] == (
        f"PLAINTEXT://127.0.0.1:{daemon.kafka_port}",
        "STATIC_BROKER_CONFIG",
        True,
    )
    assert broker["num.partitions"] == ("3", "STATIC_BROKER_CONFIG", True)
    assert broker["auto.create.topics.enable"] == ("false", "STATIC_BROKER_CONFIG", True)


def confluent_produce(
    port: int, topic: str, values: list[bytes], compression: str = "none"
) -> list[str | None]:
    """Each value's outcome: None (stored) or the Kafka error's name."""
    from confluent_kafka import Producer

    outcomes: list[str | None] = []
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "linger.ms": 0,
            "message.timeout.ms": 20_000,
            "compression.type": compression,
        }
    )
    for value in values:
        producer.produce(
            topic, value, partition=0, on_delivery=lambda err, _m: outcomes.append(err and err.name())
        )
        producer.flush(30)
    assert len(outcomes) == len(values)
    return outcomes


async def test_max_message_bytes_refuses_what_is_bigger_on_kafka_and_http(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("small", 1, {"max.message.bytes": "1000"})
        outcomes = await anyio.to_thread.run_sync(
            confluent_produce, daemon.kafka_port, "small", [b"a" * 500, b"b" * 2000]
        )
        assert outcomes == [None, "MSG_SIZE_TOO_LARGE"]  # the broker's MESSAGE_TOO_LARGE
        # A Kafka batch is held to it as sent, compressed, as Kafka's broker does: 3,000 bytes
        # of zeros gzip to a few dozen (refused before: the limit counted them uncompressed);
        # 2,000 random bytes stay about 2,000.
        outcomes = await anyio.to_thread.run_sync(
            confluent_produce, daemon.kafka_port, "small", [b"\0" * 3000, random.randbytes(2000)], "gzip"
        )
        assert outcomes == [None, "MSG_SIZE_TOO_LARGE"]
        assert daemon.node.partition("small", 0).state.high_watermark == 2
        await client.produce("small", 0, [b"c" * 900])
        with pytest.raises(ApiError) as refused:
            await client.produce("small", 0, [b"d" * 1000])  # 1008 bytes by the size rule
        assert refused.value.status == 413 and "max.message.bytes 1000" in str(refused.value)
        await client.change_topic_configs("small", {"max.message.bytes": None})
        await client.produce("small", 0, [b"d" * 1000])
        assert daemon.node.partition("small", 0).state.high_watermark == 4


def confluent_offsets(port: int, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "offsets"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=20)
    finally:
        consumer.close()


async def test_retention_bytes_moves_the_start_offset_and_list_offsets_earliest_follows(
    tmp_path: Path,
) -> None:
    async with daemon_and_client(
        tmp_path,
        kafka__listen="127.0.0.1:0",
        reconciler__enabled=False,
        housekeeper__enabled=False,
    ) as (daemon, client):
        node = daemon.node
        await client.create_topic("sized", 1)
        for n in range(3):  # three L1 objects, of two records each
            await client.produce("sized", 0, [b"v%d-a" % n, b"v%d-b" % n])
            assert await node.reconciler.run_round() == 1
        await node.housekeeper.run_round(force=True)
        assert await anyio.to_thread.run_sync(confluent_offsets, daemon.kafka_port, "sized") == (0, 6)
        await client.change_topic_configs("sized", {"retention.bytes": "1"})  # the newest object stays
        await node.housekeeper.run_round(force=True)
        assert node.partition("sized", 0).state.start_offset == 4
        assert await anyio.to_thread.run_sync(confluent_offsets, daemon.kafka_port, "sized") == (4, 6)


def confluent_auto_create(port: int) -> list[str | None]:
    return confluent_produce(port, "made-on-demand", [b"first"])


async def metadata_v12(port: int, topic: str, allow: bool) -> int:
    wire = await Wire.connect(port)
    try:
        m = module_of(3, 12)
        response = await wire.request(
            3,
            12,
            topics=(m.MetadataRequestTopic(topic_id=None, name=topic),),
            allow_auto_topic_creation=allow,
            include_topic_authorized_operations=False,
        )
        (shown,) = response.topics
        return int(shown.error_code.value)
    finally:
        await wire.aclose()


async def test_auto_creation_is_an_option_and_honours_the_clients_wish(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path / "off", kafka__listen="127.0.0.1:0") as (daemon, client):
        assert await metadata_v12(daemon.kafka_port, "nope", allow=True) == 3  # UNKNOWN_TOPIC_OR_PARTITION
        assert await client.list_topics() == []
    async with daemon_and_client(
        tmp_path / "on",
        kafka__listen="127.0.0.1:0",
        kafka__auto_create_topics=True,
        kafka__default_partitions=2,
    ) as (daemon, client):
        assert await metadata_v12(daemon.kafka_port, "not-wanted", allow=False) == 3
        assert await metadata_v12(daemon.kafka_port, "bad/name", allow=True) == 17  # INVALID_TOPIC_EXCEPTION
        assert await anyio.to_thread.run_sync(confluent_auto_create, daemon.kafka_port) == [None]
        assert {t.name: t.partitions for t in await client.list_topics()} == {"made-on-demand": 2}


def confluent_incremental(port: int, entries: list[tuple[str, str]]) -> str | None:
    """One IncrementalAlterConfigs SET of topic "v"'s `entries`: its error's name, or None."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    a = admin(port)  # (kept until the answer: a client destroyed first fails it, _DESTROY)
    ops = [ConfigEntry(n, v, incremental_operation=AlterConfigOpType.SET) for n, v in entries]
    (future,) = a.incremental_alter_configs(
        [topic_resource("v", incremental_configs=ops)], request_timeout=20
    ).values()
    return error_of(future)


async def test_kafka_3_9_topic_configs_are_known_and_kafkas_validators_apply(tmp_path: Path) -> None:
    """Configs of Kafka 3.8 and 3.9 (compression levels, KIP-390; remote log copy/delete,
    KIP-950) are taken; what Kafka's validators refuse is INVALID_CONFIG (a minimum compaction
    lag above the maximum, a malformed throttled replica list, tiered storage)."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("v", 1)
        port = daemon.kafka_port
        taken = [("compression.gzip.level", "5"), ("remote.log.copy.disable", "true")]
        assert await anyio.to_thread.run_sync(confluent_incremental, port, taken) is None
        for refused in (
            [("min.compaction.lag.ms", "5000"), ("max.compaction.lag.ms", "1000")],
            [("leader.replication.throttled.replicas", "garbage")],
            [("remote.storage.enable", "true")],
        ):
            assert await anyio.to_thread.run_sync(confluent_incremental, port, refused) == "INVALID_CONFIG"
        configs = {c.name: c.value for c in (await client.topic_configs("v")).configs}
    assert configs["compression.gzip.level"] == "5" and configs["remote.log.copy.disable"] == "true"
    assert configs["min.compaction.lag.ms"] == "0" and configs["remote.storage.enable"] == "false"


async def alter_raw(port: int, api_key: int, version: int, configs: list[tuple[Any, ...]]) -> tuple[int, str]:
    """AlterConfigs (33: (name, value) pairs) or IncrementalAlterConfigs (44: (name, op,
    value)) of topic "v" as raw requests (the clients refuse some of these before sending):
    the resource's error code and message."""
    wire = await Wire.connect(port)
    try:
        m = module_of(api_key, version)
        if api_key == 44:
            entries = tuple(
                make(m.AlterableConfig, name=n, config_operation=op, value=v) for n, op, v in configs
            )
        else:
            entries = tuple(make(m.AlterableConfig, name=n, value=v) for n, v in configs)
        resource = make(m.AlterConfigsResource, resource_type=2, resource_name="v", configs=entries)
        response = await wire.request(api_key, version, resources=(resource,), validate_only=False)
        (answer,) = response.responses
        return int(answer.error_code.value), str(answer.error_message)
    finally:
        await wire.aclose()


async def test_a_config_named_twice_or_a_null_value_in_an_alter_is_an_invalid_request(tmp_path: Path) -> None:
    """Kafka refuses these in any resource before it looks at the configs
    (`ConfigAdminManager.preprocess`): INVALID_REQUEST (42), not INVALID_CONFIG (40); a null
    value is allowed for a DELETE only."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("v", 1)
        port = daemon.kafka_port
        set_, delete, append = 0, 1, 2
        cases: list[tuple[int, int, list[tuple[Any, ...]], tuple[int, str]]] = [
            (
                44,
                1,
                [("retention.ms", set_, "1"), ("retention.ms", delete, None)],
                (42, "Error due to duplicate config keys"),
            ),
            (
                33,
                2,
                [("retention.ms", "1"), ("retention.ms", "2")],
                (42, "Error due to duplicate config keys"),
            ),
            (
                44,
                1,
                [
                    ("retention.ms", set_, None),
                    ("cleanup.policy", delete, None),
                    ("cleanup.policy2", append, None),
                ],
                (42, "Null value not supported for : retention.ms, cleanup.policy2"),
            ),
            (33, 2, [("retention.ms", None)], (42, "Null value not supported for : retention.ms")),
            (44, 1, [("retention.ms", delete, None)], (0, "None")),  # a DELETE's null is its value
        ]
        before = {c.name: c.value for c in (await client.topic_configs("v")).configs}
        for api_key, version, configs, expected in cases:
            assert await alter_raw(port, api_key, version, configs) == expected, (api_key, configs)
        assert await metadata_v12(port, "bad name!", allow=True) == 17  # INVALID_TOPIC_EXCEPTION
        assert await metadata_v12(port, "nope", allow=True) == 3  # UNKNOWN_TOPIC_OR_PARTITION
        after = {c.name: c.value for c in (await client.topic_configs("v")).configs}
    assert after == before  # nothing refused was applied
