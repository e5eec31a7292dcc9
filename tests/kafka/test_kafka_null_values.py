"""A null value (Kafka's tombstone) and an empty value are different records, end to end.

confluent-kafka (librdkafka) and kafka-python each produce a tombstone (`value=None`) and an
empty value (`value=b""`); both consumers read back None and b"" respectively, first from L0
(the reconciler off), then, after a restart with the reconciler on, from L1. The HTTP API shows
the same records with JSON `null` and `""`."""

from __future__ import annotations

from pathlib import Path

import anyio

from daemon_support import daemon_and_client, raw

TOPIC = "tombstones"
POLLS_MAX = 60  # each poll waits at most a second
WAIT_S = 30.0
KAFKA = {"kafka__listen": "127.0.0.1:0"}

# (key, value) as each producer sends them, partition 0, in this order.
FROM_LIBRDKAFKA = [(b"c-null", None), (b"c-empty", b""), (b"c-data", b"x"), (None, b"")]
FROM_KAFKA_PYTHON = [(b"k-null", None), (b"k-empty", b""), (None, b"y")]
EXPECTED = FROM_LIBRDKAFKA + FROM_KAFKA_PYTHON


def librdkafka_produce(port: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 5})
    errors: list[str] = []

    def on_delivery(err, _message) -> None:
        if err is not None:
            errors.append(str(err))

    for key, value in FROM_LIBRDKAFKA:
        producer.produce(TOPIC, key=key, value=value, partition=0, on_delivery=on_delivery)
    assert producer.flush(60) == 0
    assert errors == []


def kafka_python_produce(port: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        futures = [producer.send(TOPIC, key=k, value=v, partition=0) for k, v in FROM_KAFKA_PYTHON]
        producer.flush(timeout=60)
        for future in futures:
            future.get(timeout=60)
    finally:
        producer.close()


def librdkafka_consume(port: int) -> list[tuple[int, bytes | None, bytes | None]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "unused", "enable.auto.commit": False}
    )
    got: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        for _ in range(POLLS_MAX):
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append((message.offset(), message.key(), message.value()))
            if len(got) >= len(EXPECTED):
                break
    finally:
        consumer.close()
    return got


def kafka_python_consume(port: int) -> list[tuple[int, bytes | None, bytes | None]]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{port}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    got: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0)])
        for message in consumer:
            got.append((message.offset, message.key, message.value))
            if len(got) >= len(EXPECTED):
                break
    finally:
        consumer.close()
    return got


async def read_back_everywhere(daemon, client, tier: str) -> None:
    """Both Kafka consumers and the HTTP API read every record as it was sent, from `tier`."""
    expected = [(offset, key, value) for offset, (key, value) in enumerate(EXPECTED)]
    assert await anyio.to_thread.run_sync(librdkafka_consume, daemon.kafka_port) == expected
    assert await anyio.to_thread.run_sync(kafka_python_consume, daemon.kafka_port) == expected
    fetched = await client.fetch(TOPIC, 0, 0)
    assert fetched.tier == tier
    assert [(r.offset, r.key, r.value) for r in fetched.records] == expected
    response = await raw(client, "GET", f"/v1/topics/{TOPIC}/partitions/0/records")
    shown = [(r["key"], r["value"]) for r in response.json()["records"]]
    assert shown[:2] == [("Yy1udWxs", None), ("Yy1lbXB0eQ==", "")]  # JSON null vs ""


async def test_null_and_empty_values_from_kafka_clients_read_back_distinct_from_l0_and_l1(
    tmp_path: Path,
) -> None:
    async with daemon_and_client(tmp_path, **KAFKA, reconciler__enabled=False) as (daemon, client):
        await client.create_topic(TOPIC, 1)
        await anyio.to_thread.run_sync(librdkafka_produce, daemon.kafka_port)
        await anyio.to_thread.run_sync(kafka_python_produce, daemon.kafka_port)
        await read_back_everywhere(daemon, client, "l0")
    async with daemon_and_client(tmp_path, **KAFKA, reconciler__interval_s=0.05) as (daemon, client):
        with anyio.fail_after(WAIT_S):
            while (await client.status()).reconciler.lag_offsets:
                await anyio.sleep(0.02)
        await read_back_everywhere(daemon, client, "l1")
