"""What a Kafka broker refuses, refused here with Kafka's error, seen through real clients
(confluent-kafka's Producer and AdminClient, kafka-python's producer and admin client) against an
in-process daemon's Kafka listener: a produce with acks other than -1, 0 or 1; levelzero's one
reserved record header; CreateTopics' replication factor; topic names that collide ('.' against
'_') and Kafka's internal topic names, refused by the one rule over Kafka and HTTP alike."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import anyio
import pytest
from kio.schema.errors import ErrorCode

from daemon_support import assert_error, daemon_and_client, raw
from levelzero.core.errors import ShuttingDown, StorageError
from levelzero.kafka.produce import ProduceApi

KAFKA = {"kafka__listen": "127.0.0.1:0"}
TIMEOUT_S = 30


def produce_with_acks(port: int, topic: str, acks: int) -> list[str | None]:
    """Each record's delivery error code name (None: delivered), produced with `acks`."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "acks": acks, "retries": 0, "linger.ms": 5}
    )
    seen: list[str | None] = []
    for i in range(3):
        producer.produce(
            topic,
            value=b"v%d" % i,
            partition=i % 2,
            on_delivery=lambda err, _msg: seen.append(None if err is None else err.name()),
        )
    assert producer.flush(TIMEOUT_S) == 0
    return seen


async def test_a_produce_with_acks_2_is_refused_for_every_partition_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    """As Kafka's ReplicaManager: acks other than -1, 0 or 1 is INVALID_REQUIRED_ACKS (21) for
    every partition of the request, and nothing is stored; acks=1 still stores."""
    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        await client.create_topic("acks", 2)
        refused = await anyio.to_thread.run_sync(produce_with_acks, daemon.kafka_port, "acks", 2)
        assert refused == ["INVALID_REQUIRED_ACKS"] * 3
        for partition in (0, 1):
            assert (await client.fetch("acks", partition, 0)).high_watermark == 0
        stored = await anyio.to_thread.run_sync(produce_with_acks, daemon.kafka_port, "acks", 1)
        assert stored == [None] * 3
        assert (await client.fetch("acks", 0, 0)).high_watermark == 2


def produce_headers(port: int, topic: str, names: list[str]) -> list[int | str]:
    """Each record's offset, or the error's message, produced by kafka-python with one header
    (librdkafka cuts a header name at its first NUL)."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", retries=0, enable_idempotence=False)
    out: list[int | str] = []
    try:
        for name in names:
            try:
                out.append(producer.send(topic, value=b"v", headers=[(name, b"h")]).get(TIMEOUT_S).offset)
            except KafkaError as exc:
                out.append(str(exc))
    finally:
        producer.close()
    return out


async def test_only_the_reserved_header_name_is_refused_and_the_refusal_says_so(tmp_path: Path) -> None:
    """Kafka takes any header name: one holding a NUL character is stored as sent. The one name
    refused is levelzero's transaction header, INVALID_RECORD, and the message names it (it
    said "a NUL character" while "a\\x00b" was stored)."""
    from levelzero.core.txn_marks import TXN_HEADER

    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        await client.create_topic("headers", 1)
        seen = await anyio.to_thread.run_sync(
            produce_headers, daemon.kafka_port, "headers", ["a\x00b", TXN_HEADER]
        )
        assert seen[0] == 0
        assert isinstance(seen[1], str)
        assert "InvalidRecordError" in seen[1] and f"{TXN_HEADER!r} is reserved" in seen[1]
        assert "NUL" not in seen[1]
        stored = (await client.fetch("headers", 0, 0)).records
        assert [r.headers for r in stored] == [[("a\x00b", b"h")]]


def create_with_replication_factors(port: int, factors: dict[str, int]) -> dict[str, tuple[int, str | None]]:
    """topic -> (error code, message) of kafka-python's CreateTopics (librdkafka refuses a
    factor below -1 before sending it)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        topics = {name: {"num_partitions": 1, "replication_factor": f} for name, f in factors.items()}
        result = admin.create_topics(topics, raise_errors=False)
    finally:
        admin.close()
    return {t["name"]: (t["error_code"], t["error_message"]) for t in result["topics"]}


async def test_a_replication_factor_of_0_or_below_minus_1_is_refused_as_kafka_refuses_it(
    tmp_path: Path,
) -> None:
    """Kafka's controller: INVALID_REPLICATION_FACTOR, with its message, and no topic; -1 (the
    default) and any positive factor make the topic (replicas are the object store's)."""
    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        factors = {"rf-zero": 0, "rf-minus-two": -2, "rf-default": -1, "rf-one": 1, "rf-three": 3}
        seen = await anyio.to_thread.run_sync(create_with_replication_factors, daemon.kafka_port, factors)
        message = "Replication factor must be larger than 0, or -1 to use the default value."
        assert seen == {
            "rf-zero": (38, message),  # INVALID_REPLICATION_FACTOR
            "rf-minus-two": (38, message),
            "rf-default": (0, None),
            "rf-one": (0, None),
            "rf-three": (0, None),
        }
        assert sorted(t.name for t in await client.list_topics()) == ["rf-default", "rf-one", "rf-three"]


def confluent_create(
    port: int, names: list[str], validate_only: bool = False
) -> dict[str, tuple[str, str] | None]:
    """topic -> (error name, message) of confluent-kafka's CreateTopics, or None if it was made."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    futures = admin.create_topics([NewTopic(name, 1) for name in names], validate_only=validate_only)
    out: dict[str, tuple[str, str] | None] = {}
    for name, future in futures.items():
        try:
            future.result(TIMEOUT_S)
            out[name] = None
        except KafkaException as exc:
            out[name] = (exc.args[0].name(), exc.args[0].str())
    return out


async def test_a_topic_colliding_with_an_existing_one_by_dot_and_underscore_is_refused(
    tmp_path: Path,
) -> None:
    """As Kafka's controller: a new topic that differs from an existing one only in '.' against
    '_' (one character in metric names) is INVALID_TOPIC_EXCEPTION (librdkafka's
    TOPIC_EXCEPTION), the existing topic named in the message, both ways round and with
    validate_only; over HTTP, 409 topic_collides. The same name again is still
    TOPIC_ALREADY_EXISTS, and a name colliding with nothing is made."""
    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        port = daemon.kafka_port
        assert await anyio.to_thread.run_sync(confluent_create, port, ["col_x", "dot.y"]) == {
            "col_x": None,
            "dot.y": None,
        }
        seen = await anyio.to_thread.run_sync(confluent_create, port, ["col.x", "dot_y", "col_x", "col-x"])
        assert seen["col.x"] is not None and seen["dot_y"] is not None
        assert seen["col.x"][0] == seen["dot_y"][0] == "TOPIC_EXCEPTION"
        assert "'col.x' collides with existing topic 'col_x'" in seen["col.x"][1]
        assert "'dot_y' collides with existing topic 'dot.y'" in seen["dot_y"][1]
        assert seen["col_x"] == ("TOPIC_ALREADY_EXISTS", "topic 'col_x' exists")
        assert seen["col-x"] is None
        checked = await anyio.to_thread.run_sync(
            lambda: confluent_create(port, ["col.x"], validate_only=True)
        )
        assert checked["col.x"] is not None and checked["col.x"][0] == "TOPIC_EXCEPTION"
        refused = await raw(client, "POST", "/v1/topics", json={"name": "col.x", "partitions": 1})
        assert_error(refused, 409, "topic_collides", "collides with existing topic 'col_x'")
        assert sorted(t.name for t in await client.list_topics()) == ["col-x", "col_x", "dot.y"]


async def test_kafkas_internal_topic_names_are_never_ordinary_topics(tmp_path: Path) -> None:
    """levelzero keeps group offsets and transactions in its control plane: a topic named as
    one of Kafka's internal topics would be an ordinary log clients read as Kafka's. Refused as
    Kafka's controller refuses creating its own metadata topic: INVALID_REQUEST, "Creation of
    internal topic ... is prohibited"; over HTTP, 400 internal_topic. A name merely starting
    with "__" is an ordinary topic, as in Kafka."""
    internal = ["__consumer_offsets", "__transaction_state", "__share_group_state", "__cluster_metadata"]
    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        seen = await anyio.to_thread.run_sync(confluent_create, daemon.kafka_port, [*internal, "__mine"])
        for name in internal:
            assert seen[name] is not None, name
            assert seen[name][0] == "INVALID_REQUEST"
            assert f"Creation of internal topic {name} is prohibited" in seen[name][1]
        assert seen["__mine"] is None
        for name in internal[:2]:
            refused = await raw(client, "POST", "/v1/topics", json={"name": name, "partitions": 1})
            assert_error(refused, 400, "internal_topic", f"Creation of internal topic {name} is prohibited")
        assert [t.name for t in await client.list_topics()] == ["__mine"]


def producer_metadata_error(port: int, topic: str) -> str | None:
    """The error confluent-kafka's producer (which lets Metadata create topics) is given for
    `topic`, None if it exists."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}"})
    error = producer.list_topics(topic, timeout=TIMEOUT_S).topics[topic].error
    return None if error is None else error.name()


async def test_auto_creation_never_makes_an_internal_topic(tmp_path: Path) -> None:
    """With kafka.auto_create_topics, Metadata for Kafka's internal topic (which tools ask for)
    answers it unknown and makes nothing; another topic is still made."""
    async with daemon_and_client(tmp_path, kafka__auto_create_topics=True, **KAFKA) as (daemon, client):
        port = daemon.kafka_port
        seen = await anyio.to_thread.run_sync(producer_metadata_error, port, "__consumer_offsets")
        assert seen == "UNKNOWN_TOPIC_OR_PART"
        assert await anyio.to_thread.run_sync(producer_metadata_error, port, "made") is None
        assert [t.name for t in await client.list_topics()] == ["made"]


def delete_records_of(port: int, topic: str, offset: int) -> str | int:
    """confluent-kafka's AdminClient.delete_records of `topic`/0 up to `offset`: the low
    watermark, or the error's name."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    (future,) = admin.delete_records([TopicPartition(topic, 0, offset)], request_timeout=TIMEOUT_S).values()
    try:
        return future.result().low_watermark
    except KafkaException as exc:
        return str(exc.args[0].name())


async def test_delete_records_on_a_compacted_topic_is_a_policy_violation(tmp_path: Path) -> None:
    """As Kafka's broker: the records of a topic whose cleanup.policy lacks `delete` cannot be
    deleted (POLICY_VIOLATION); with `compact,delete` they can."""
    async with daemon_and_client(tmp_path, **KAFKA) as (daemon, client):
        for name, policy in (("table", "compact"), ("both", "compact,delete")):
            await client.create_topic(name, 1, configs={"cleanup.policy": policy})
            await client.produce(name, 0, [(b"k", b"v0"), (b"k", b"v1")])
        port = daemon.kafka_port
        assert await anyio.to_thread.run_sync(delete_records_of, port, "table", 1) == "POLICY_VIOLATION"
        assert (await client.status("table")).partitions[0].start_offset == 0
        assert await anyio.to_thread.run_sync(delete_records_of, port, "both", 1) == 1


def test_a_graceful_stops_refused_produces_are_not_warnings(caplog: pytest.LogCaptureFixture) -> None:
    """A SIGTERM with producers running refused each produce in flight as shutting_down (the
    client retries, nothing lost) and logged each as a WARNING: at real partition counts a wall
    of lines that read as a fault. An operating failure stays a warning."""
    caplog.set_level(logging.INFO, logger="levelzero.kafka")
    node = types.SimpleNamespace(accepting=False)  # stopping
    api = types.SimpleNamespace(intake=types.SimpleNamespace(node=node))
    stopping = ShuttingDown("the node is not accepting requests")
    refused = ProduceApi._produce_failed(api, "t", 0, stopping)  # type: ignore[arg-type]
    failed = ProduceApi._produce_failed(api, "t", 1, StorageError("disk I/O error"))  # type: ignore[arg-type]
    node.accepting = True  # a partition that failed refuses as shutting down too: a fault
    crashed = ProduceApi._produce_failed(api, "t", 2, ShuttingDown("partition t/2 failed"))  # type: ignore[arg-type]
    assert (refused[1], failed[1], crashed[1]) == (-1, -1, -1)
    assert ErrorCode.none not in (refused[0], failed[0], crashed[0])
    levels = [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records]
    assert levels == [
        (logging.INFO, "kafka produce to t/0 refused"),
        (logging.WARNING, "kafka produce to t/1 failed"),
        (logging.WARNING, "kafka produce to t/2 failed"),
    ]


async def test_an_empty_transactional_id_and_an_unknown_coordinator_type_are_invalid_requests(
    tmp_path: Path,
) -> None:
    """As Kafka's broker answers them: InitProducerId naming the transactional id "" got a
    producer id (and "" was stored, listed by ListTransactions); FindCoordinator with a key type
    neither a group (0) nor a transaction (1) got a coordinator."""
    from test_kafka_listener import MS, Wire

    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        try:
            init = await wire.request(
                22, 4, transactional_id="", transaction_timeout=60_000 * MS, producer_id=-1, producer_epoch=-1
            )
            assert (init.error_code, init.producer_id) == (ErrorCode.invalid_request, -1)
            assert await daemon.node.log_store.transactions() == []
            for version, fields in (
                (3, dict(key="g", key_type=5)),
                (4, dict(key_type=-1, coordinator_keys=("a", "b"))),
            ):
                found = await wire.request(10, version, **fields)
                codes = [c.error_code for c in found.coordinators] if version >= 4 else [found.error_code]
                assert set(codes) == {ErrorCode.invalid_request}, found
            ok = await wire.request(10, 4, key_type=1, coordinator_keys=("tid",))
            assert ok.coordinators[0].error_code == ErrorCode.none
        finally:
            await wire.aclose()
