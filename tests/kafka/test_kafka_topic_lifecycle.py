"""DeleteTopics, CreatePartitions and DeleteRecords through real clients' admin APIs
(confluent-kafka's AdminClient, kafka-python's KafkaAdminClient) against an in-process daemon's
Kafka listener: the answers and error codes a Kafka broker gives, what Metadata, ListOffsets,
produce and fetch see afterwards, and — after one GC round driven through the HTTP API — that
no object of a deleted topic is left, in L1 or as an L0 object holding only its data."""

from __future__ import annotations

from pathlib import Path

import anyio

from daemon_support import daemon_and_client
from levelzero.core.keys import L0_ROOT, L1_ROOT
from levelzero.core.l0format import read_header
from levelzero.storage.protocols import ObjectStore, iter_objects

QUIET = {
    "gc__enabled": False,
    "gc__grace_s": 0.0,
    "reconciler__interval_s": 0.05,
    "housekeeper__enabled": False,
}
TIMEOUT_S = 30


def confluent_admin(port: int):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})


def confluent_produce(port: int, topic: str, partition_counts: dict[int, int]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 5})
    for partition, count in partition_counts.items():
        for i in range(count):
            producer.produce(topic, value=b"v%d" % i, partition=partition)
    assert producer.flush(TIMEOUT_S) == 0


def confluent_errors(futures: dict) -> dict:
    """Each future's KafkaError code name, or None where it succeeded."""
    from confluent_kafka import KafkaException

    out = {}
    for key, future in futures.items():
        try:
            future.result(timeout=TIMEOUT_S)
            out[key] = None
        except KafkaException as exc:
            out[key] = exc.args[0].name()
    return out


def confluent_lifecycle(port: int) -> dict[str, object]:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import NewPartitions, NewTopic

    admin = confluent_admin(port)
    seen: dict[str, object] = {}
    confluent_errors(admin.create_topics([NewTopic("ck", 2, 1)]))
    confluent_produce(port, "ck", {0: 10, 1: 4})

    seen["validate_only"] = confluent_errors(
        admin.create_partitions([NewPartitions("ck", 6)], validate_only=True)
    )
    seen["after_validate_only"] = len(admin.list_topics("ck", timeout=TIMEOUT_S).topics["ck"].partitions)
    seen["grow"] = confluent_errors(admin.create_partitions([NewPartitions("ck", 4)]))
    seen["shrink"] = confluent_errors(
        admin.create_partitions([NewPartitions("ck", 3), NewPartitions("missing", 3)])
    )
    seen["partitions"] = len(admin.list_topics("ck", timeout=TIMEOUT_S).topics["ck"].partitions)
    confluent_produce(port, "ck", {3: 2})

    deleted = admin.delete_records([TopicPartition("ck", 0, 6)])
    (future,) = deleted.values()
    seen["low_watermark"] = future.result(timeout=TIMEOUT_S).low_watermark
    beyond = admin.delete_records([TopicPartition("ck", 1, 99)])
    seen["beyond"] = confluent_errors(beyond)

    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "ck-g", "auto.offset.reset": "earliest"}
    )
    try:
        seen["watermarks_0"] = consumer.get_watermark_offsets(TopicPartition("ck", 0), timeout=TIMEOUT_S)
        consumer.assign([TopicPartition("ck", 0), TopicPartition("ck", 3)])
        got: list[tuple[int, int]] = []
        for _ in range(200):
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                got.append((message.partition(), message.offset()))
            if len(got) == 6:
                break
        seen["consumed"] = sorted(got)
    finally:
        consumer.close()

    seen["delete"] = confluent_errors(admin.delete_topics(["ck"], operation_timeout=TIMEOUT_S))
    seen["listed_after_delete"] = "ck" in admin.list_topics(timeout=TIMEOUT_S).topics
    seen["delete_again"] = confluent_errors(admin.delete_topics(["ck"], operation_timeout=TIMEOUT_S))
    return seen


async def test_confluent_admin_grows_a_topic_deletes_records_and_deletes_the_topic(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", **QUIET) as (daemon, client):
        assert daemon.kafka_port is not None
        seen = await anyio.to_thread.run_sync(confluent_lifecycle, daemon.kafka_port)
        assert seen["validate_only"] == {"ck": None}
        assert seen["after_validate_only"] == 2  # validate_only changed nothing
        assert seen["grow"] == {"ck": None}
        assert seen["shrink"] == {"ck": "INVALID_PARTITIONS", "missing": "UNKNOWN_TOPIC_OR_PART"}
        assert seen["partitions"] == 4
        assert seen["low_watermark"] == 6
        assert list(seen["beyond"].values()) == ["OFFSET_OUT_OF_RANGE"]  # type: ignore[union-attr]
        assert seen["watermarks_0"] == (6, 10)  # ListOffsets earliest follows
        assert seen["consumed"] == [(0, 6), (0, 7), (0, 8), (0, 9), (3, 0), (3, 1)]
        assert seen["delete"] == {"ck": None}
        assert seen["listed_after_delete"] is False
        assert seen["delete_again"] == {"ck": "UNKNOWN_TOPIC_OR_PART"}
        assert "ck" not in {t.name for t in (await client.list_topics())}


def confluent_twice(port: int) -> dict[str, object]:
    from confluent_kafka.admin import NewPartitions, NewTopic

    admin = confluent_admin(port)
    seen: dict[str, object] = {}
    confluent_errors(admin.create_topics([NewTopic("d1", 1), NewTopic("d2", 1)]))
    seen["grow"] = confluent_errors(
        admin.create_partitions([NewPartitions("d1", 3), NewPartitions("d2", 2), NewPartitions("d1", 4)])
    )
    seen["delete"] = confluent_errors(admin.delete_topics(["d1", "d2", "d1"], operation_timeout=TIMEOUT_S))
    return seen


async def test_a_topic_named_twice_in_delete_topics_or_create_partitions_is_answered_once(
    tmp_path: Path,
) -> None:
    """As Kafka's controller: the name answered once, INVALID_REQUEST, and nothing done under
    either entry; the others done (answered once per entry, librdkafka failed the response)."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", **QUIET) as (daemon, client):
        seen = await anyio.to_thread.run_sync(confluent_twice, daemon.kafka_port)
        assert seen == {
            "grow": {"d1": "INVALID_REQUEST", "d2": None},
            "delete": {"d1": "INVALID_REQUEST", "d2": None},
        }
        assert {t.name: t.partitions for t in await client.list_topics()} == {"d1": 1}


def kafka_python_lifecycle(port: int) -> dict[str, object]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
    from kafka.errors import (
        InvalidPartitionsError,
        InvalidReplicationAssignmentError,
        InvalidRequestError,
        OffsetOutOfRangeError,
        UnknownTopicOrPartitionError,
    )

    bootstrap = f"127.0.0.1:{port}"
    seen: dict[str, object] = {}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20_000)
    try:
        admin.create_topics([NewTopic("kp", 1, 1)])
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        try:
            for i in range(5):
                producer.send("kp", value=b"old%d" % i, partition=0)
            producer.flush(timeout=TIMEOUT_S)
        finally:
            producer.close()
        admin.create_partitions({"kp": NewPartitions(3)})
        seen["described"] = len(admin.describe_topics(["kp"])[0]["partitions"])
        try:
            admin.create_partitions({"kp": NewPartitions(2)})
            seen["shrink"] = None
        except InvalidPartitionsError:
            seen["shrink"] = "INVALID_PARTITIONS"
        # a manual assignment naming the one broker, one per new partition, is what a node
        # alone does anyway (kafka-python's own suite sends one); any other is refused
        admin.create_partitions({"kp": NewPartitions(5, [[0], [0]])})
        seen["assigned"] = len(admin.describe_topics(["kp"])[0]["partitions"])
        refused = []
        for assignment in ([[7]], [[0], [0]], [[0, 0]]):
            try:
                admin.create_partitions({"kp": NewPartitions(6, assignment)})
                refused.append(None)
            except InvalidReplicationAssignmentError:
                refused.append("INVALID_REPLICA_ASSIGNMENT")
        seen["bad_assignments"] = refused
        # CreateTopics with an assignment (`kafka-topics --replica-assignment`): refused
        # outright before; taken as Kafka's controller takes it, or refused with its errors
        admin.create_topics([NewTopic("ka", -1, -1, replica_assignments={0: [0], 1: [0], 2: [0]})])
        seen["created_assigned"] = len(admin.describe_topics(["ka"])[0]["partitions"])
        refused = []
        for topic in (
            NewTopic("kb", -1, -1, replica_assignments={0: [5]}),  # no such broker
            NewTopic("kb", -1, -1, replica_assignments={0: [0], 2: [0]}),  # not 0..n-1
            NewTopic("kb", -1, -1, replica_assignments={0: [0, 0]}),  # the broker twice
            NewTopic("kb", 2, -1, replica_assignments={0: [0], 1: [0]}),  # a count too
            NewTopic("kb", -1, 1, replica_assignments={0: [0]}),  # a factor too
        ):
            try:
                admin.create_topics([topic])
                refused.append(None)
            except InvalidReplicationAssignmentError:
                refused.append("INVALID_REPLICA_ASSIGNMENT")
            except InvalidRequestError:
                refused.append("INVALID_REQUEST")
        seen["bad_topic_assignments"] = refused
        seen["kb_listed"] = "kb" in admin.list_topics()
        deleted = admin.delete_records({TopicPartition("kp", 0): 3})
        seen["low_watermark"] = deleted[TopicPartition("kp", 0)]["low_watermark"]

        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, auto_offset_reset="none", enable_auto_commit=False
        )
        try:
            tp = TopicPartition("kp", 0)
            consumer.assign([tp])
            seen["beginning"] = consumer.beginning_offsets([tp])[tp]
            consumer.seek(tp, 1)  # below the start offset
            try:
                for _ in range(50):
                    consumer.poll(timeout_ms=100)
                seen["fetch_below_start"] = None
            except OffsetOutOfRangeError:
                seen["fetch_below_start"] = "OFFSET_OUT_OF_RANGE"
        finally:
            consumer.close()

        admin.delete_topics(["kp"], timeout_ms=20_000)
        seen["listed_after_delete"] = "kp" in admin.list_topics()
        try:
            admin.delete_topics(["kp"], timeout_ms=20_000)
            seen["delete_again"] = None
        except UnknownTopicOrPartitionError:
            seen["delete_again"] = "UNKNOWN_TOPIC_OR_PARTITION"
        admin.create_topics([NewTopic("kp", 1, 1)])  # made again: it starts empty
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        try:
            tp = TopicPartition("kp", 0)
            seen["recreated_offsets"] = (consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp])
        finally:
            consumer.close()
    finally:
        admin.close()
    return seen


async def test_kafka_python_admin_grows_deletes_records_and_recreates_a_topic_empty(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", **QUIET) as (daemon, _client):
        assert daemon.kafka_port is not None
        seen = await anyio.to_thread.run_sync(kafka_python_lifecycle, daemon.kafka_port)
    assert seen == {
        "described": 3,
        "shrink": "INVALID_PARTITIONS",
        "assigned": 5,
        "bad_assignments": ["INVALID_REPLICA_ASSIGNMENT"] * 3,
        "created_assigned": 3,
        "bad_topic_assignments": ["INVALID_REPLICA_ASSIGNMENT"] * 3 + ["INVALID_REQUEST"] * 2,
        "kb_listed": False,
        "low_watermark": 3,
        "beginning": 3,
        "fetch_below_start": "OFFSET_OUT_OF_RANGE",
        "listed_after_delete": False,
        "delete_again": "UNKNOWN_TOPIC_OR_PARTITION",
        "recreated_offsets": (0, 0),
    }


async def object_keys(store: ObjectStore, prefix: str) -> list[str]:
    return [obj.key async for obj in iter_objects(store, prefix)]


async def l0_partitions(store: ObjectStore) -> dict[str, set[int]]:
    """Every L0 object -> the partition ids whose extents it holds."""
    out = {}
    for key in await object_keys(store, L0_ROOT):
        data = await store.get(key)
        out[key] = {extent.pid for extent in read_header(data, key).extents}
    return out


async def test_after_delete_topics_and_a_gc_round_no_object_of_the_topic_is_left(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", **QUIET) as (daemon, client):
        assert daemon.kafka_port is not None
        node = daemon.node
        assert node is not None
        port = daemon.kafka_port

        def setup() -> None:
            from confluent_kafka.admin import NewTopic

            admin = confluent_admin(port)
            created = confluent_errors(admin.create_topics([NewTopic("gone", 2, 1), NewTopic("kept", 1, 1)]))
            assert created == {"gone": None, "kept": None}
            confluent_produce(port, "gone", {0: 50, 1: 50})
            confluent_produce(port, "kept", {0: 20})

        await anyio.to_thread.run_sync(setup)
        with anyio.fail_after(TIMEOUT_S):
            while (await client.status()).reconciler.lag_offsets:
                await anyio.sleep(0.02)
        await anyio.to_thread.run_sync(confluent_produce, port, "gone", {0: 5})  # only in L0
        gone = {actor.row.pid for actor in node.partitions() if actor.row.topic == "gone"}
        store = node.object_store
        print("KEYS", await object_keys(store, ""), (await client.status()).reconciler)
        assert await object_keys(store, f"{L1_ROOT}gone/")
        assert any(pids <= gone for pids in (await l0_partitions(store)).values())

        admin = confluent_admin(port)  # kept: a client destroyed early fails its futures
        errors = await anyio.to_thread.run_sync(
            lambda: confluent_errors(admin.delete_topics(["gone"], operation_timeout=TIMEOUT_S))
        )
        assert errors == {"gone": None}
        for _ in range(2):  # every partition left passes the epochs written before
            await client.advance_epoch()
            await client.run_housekeeper(force=True)
        report = await client.gc_run()
        assert report.m is not None
        assert await object_keys(store, f"{L1_ROOT}gone/") == []
        assert [key for key, pids in (await l0_partitions(store)).items() if pids <= gone] == []
        assert await object_keys(store, f"{L1_ROOT}kept/")  # the other topic keeps its data
        fetched = await client.fetch("kept", 0, offset=0)
        assert [r.value for r in fetched.records] == [b"v%d" % i for i in range(20)]
