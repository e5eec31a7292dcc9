"""Metadata as each real client asks for it: librdkafka's AdminClient.list_topics (the request
`kcat -L` sends too), kafka-python's admin client and aiokafka's admin client. Each negotiates
its own Metadata version; every one must see every topic with its partitions. librdkafka's
"all topics" Metadata v12 request carries bytes after the fields of the schema; a request that
parses whole is answered whatever follows it, as Kafka's brokers do."""

from __future__ import annotations

import struct
from pathlib import Path

import anyio
from aiokafka.admin import AIOKafkaAdminClient
from kio.schema.errors import ErrorCode
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaConsumer

from daemon_support import daemon_and_client
from test_kafka_listener import Wire, _encode_request

EXPECTED = {"alpha": 3, "beta": 1}


def confluent_list_topics(port: int) -> dict[str, int]:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    listed = admin.list_topics(timeout=20)
    assert [(b.host, b.port) for b in listed.brokers.values()] == [("127.0.0.1", port)]
    return {name: len(t.partitions) for name, t in listed.topics.items() if t.error is None}


def kafka_python_list_topics(port: int) -> dict[str, int]:
    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=20_000)
    try:
        described = admin.describe_topics()
        from_admin = {t["name"]: len(t["partitions"]) for t in described if t["error_code"] == 0}
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=20_000)
    try:
        from_consumer = {name: len(consumer.partitions_for_topic(name) or ()) for name in consumer.topics()}
    finally:
        consumer.close()
    assert from_admin == from_consumer, (from_admin, from_consumer)
    return from_admin


async def aiokafka_list_topics(port: int) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=20_000)
    await admin.start()
    try:
        described = await admin.describe_topics()
        return {t["topic"]: len(t["partitions"]) for t in described if t["error_code"] == 0}
    finally:
        await admin.close()


async def test_every_client_lists_every_topic_with_its_partitions(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        for name, partitions in EXPECTED.items():
            await client.create_topic(name, partitions)
        port = daemon.kafka_port
        assert port is not None
        assert await anyio.to_thread.run_sync(confluent_list_topics, port) == EXPECTED
        assert await anyio.to_thread.run_sync(kafka_python_list_topics, port) == EXPECTED
        assert await aiokafka_list_topics(port) == EXPECTED
        assert daemon.kafka.stats.closed_bad_frames == 0
        assert daemon.kafka.stats.errors == 0


async def test_bytes_after_a_whole_request_are_ignored(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("alpha", 3)
        payload = _encode_request(
            3,
            12,
            dict(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False),
        )
        payload += b"\x01\x00\x00"  # what librdkafka 2.x appends to this request
        wire = await Wire.connect(daemon.kafka_port)
        try:
            wire.correlation = 1  # _encode_request's correlation id
            await wire.send_raw(struct.pack(">i", len(payload)) + payload)
            response = await wire.response(3, 12)
            assert [(t.name, len(t.partitions)) for t in response.topics] == [("alpha", 3)]
        finally:
            await wire.aclose()
        assert daemon.kafka.stats.closed_bad_frames == 0


async def test_metadata_v13_answers_its_top_level_error_code(tmp_path: Path) -> None:
    """Metadata v13 (Kafka 4.0, KIP-1102) adds a top-level error code (REBOOTSTRAP_REQUIRED for a
    client whose brokers all went): none here, and the topics as v12 has them."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("alpha", 3)
        wire = await Wire.connect(daemon.kafka_port)
        try:
            response = await wire.request(
                3, 13, topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
            )
        finally:
            await wire.aclose()
    assert response.error_code == ErrorCode.none
    assert [(t.name, t.error_code, len(t.partitions)) for t in response.topics] == [
        ("alpha", ErrorCode.none, 3)
    ]
