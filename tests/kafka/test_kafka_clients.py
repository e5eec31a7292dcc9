"""Real Kafka clients against the Kafka listener of an in-process daemon: kafka-python,
aiokafka and confluent-kafka (librdkafka) create topics, produce (gzip, several partitions,
keys, null keys, empty values) and consume every record back, byte for byte, at the offsets the
producers were told. The synchronous clients run in worker threads; the daemon runs on the
test's event loop."""

from __future__ import annotations

import random
from collections.abc import Iterator
import time
from pathlib import Path

import anyio
import httpx
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from confluent_kafka import Producer

from daemon_support import daemon_and_client

PARTITIONS = 3
Expected = list[tuple[int, bytes | None, bytes]]  # (partition, key, value), in send order


def make_records(count: int, seed: int, value_bytes_max: int = 200) -> Expected:
    rng = random.Random(seed)
    out: Expected = []
    for i in range(count):
        key = None if i % 7 == 0 else b"key-%d-" % i + rng.randbytes(rng.randint(0, 16))
        value = rng.randbytes(rng.randint(0, value_bytes_max))
        out.append((i % PARTITIONS, key, value))
    return out


def per_partition(records: Expected) -> dict[int, list[tuple[bytes | None, bytes]]]:
    out: dict[int, list[tuple[bytes | None, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for partition, key, value in records:
        out[partition].append((key, value))
    return out


def check_consumed(expected: Expected, consumed: list[tuple[int, int, bytes | None, bytes | None]]) -> None:
    """Every partition read back holds exactly what was sent to it, in order, at offsets 0.."""
    got: dict[int, list[tuple[int, bytes | None, bytes]]] = {p: [] for p in range(PARTITIONS)}
    for partition, offset, key, value in consumed:
        got[partition].append((offset, key, value or b""))
    for partition, sent in per_partition(expected).items():
        records = sorted(got[partition])
        assert [offset for offset, _, _ in records] == list(range(len(sent))), partition
        assert [(k, v) for _, k, v in records] == sent, partition


def bounded(limit: int) -> Iterator[int]:
    yield from range(limit)


# ------------------------------------------------------------------------------ kafka-python


def kafka_python_round_trip(
    port: int, topic: str, records: Expected
) -> list[tuple[int, int, bytes | None, bytes | None]]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    bootstrap = f"127.0.0.1:{port}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip", linger_ms=5)
    try:
        futures = [producer.send(topic, key=k, value=v, partition=p) for p, k, v in records]
        producer.flush(timeout=60)
        metadata = [f.get(timeout=60) for f in futures]
    finally:
        producer.close()
    # Offsets the producer was told are the offsets the records are read at.
    counters = [0] * PARTITIONS
    for (partition, _, _), meta in zip(records, metadata, strict=True):
        assert (meta.partition, meta.offset) == (partition, counters[partition])
        counters[partition] += 1
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=5000,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        assert consumer.beginning_offsets(partitions) == {tp: 0 for tp in partitions}
        assert consumer.end_offsets(partitions) == {
            TopicPartition(topic, p): n for p, n in enumerate(counters)
        }
        consumed = []
        for message in consumer:
            consumed.append((message.partition, message.offset, message.key, message.value))
            if len(consumed) == len(records):
                break
    finally:
        consumer.close()
    return consumed


async def test_kafka_python_produces_and_consumes_byte_for_byte(tmp_path: Path) -> None:
    records = make_records(3_000, seed=1)
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        assert daemon.kafka_port is not None
        consumed = await anyio.to_thread.run_sync(kafka_python_round_trip, daemon.kafka_port, "kp", records)
        # The HTTP API reads the same records (one node, one store).
        fetched = await client.fetch("kp", 1, offset=0)
        assert [(r.key, r.value) for r in fetched.records][:5] == per_partition(records)[1][:5]
    check_consumed(records, consumed)


# ------------------------------------------------------------------------------ aiokafka


async def test_aiokafka_produces_and_consumes_byte_for_byte(tmp_path: Path) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    records = make_records(3_000, seed=2)
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        bootstrap = f"127.0.0.1:{daemon.kafka_port}"
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("aio", PARTITIONS, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, compression_type="gzip", enable_idempotence=True
        )
        await producer.start()
        try:
            futures = [await producer.send("aio", key=k, value=v, partition=p) for p, k, v in records]
            metadata = [await f for f in futures]
        finally:
            await producer.stop()
        assert [m.offset for m in metadata if m.partition == 0] == list(range(1_000))
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await consumer.start()
        consumed = []
        try:
            consumer.assign([TopicPartition("aio", p) for p in range(PARTITIONS)])
            for _ in bounded(200):
                batch = await consumer.getmany(timeout_ms=1000)
                for messages in batch.values():
                    consumed += [(m.partition, m.offset, m.key, m.value) for m in messages]
                if len(consumed) >= len(records):
                    break
        finally:
            await consumer.stop()
    check_consumed(records, consumed)


# ------------------------------------------------------------------------------ confluent-kafka


def confluent_produce(
    port: int, topic: str, records: Expected, *, create: bool = True
) -> list[tuple[int, int]]:
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = f"127.0.0.1:{port}"
    if create:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        futures = admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        for future in futures.values():
            future.result(30)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": "gzip",
            "enable.idempotence": True,
            "linger.ms": 20,
            "queue.buffering.max.messages": 200_000,
        }
    )
    delivered: list[tuple[int, int]] = []
    errors: list[str] = []

    def on_delivery(err, message) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            delivered.append((message.partition(), message.offset()))

    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(120) == 0
    assert errors == []
    return delivered


def confluent_consume(port: int, topic: str, count: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumed = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        for _ in bounded(2_000):
            for message in consumer.consume(10_000, 0.5):
                assert message.error() is None, message.error()
                consumed.append((message.partition(), message.offset(), message.key(), message.value()))
            if len(consumed) >= count:
                break
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (0, len([c for c in consumed if c[0] == 0]))
    finally:
        consumer.close()
    return consumed


@pytest.mark.slow
async def test_confluent_kafka_100k_records_byte_for_byte(tmp_path: Path) -> None:
    records = make_records(100_000, seed=3, value_bytes_max=100)
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        port = daemon.kafka_port
        delivered = await anyio.to_thread.run_sync(confluent_produce, port, "ck", records)
        assert sorted(delivered) == sorted(
            (p, o) for p, sent in per_partition(records).items() for o in range(len(sent))
        )
        consumed = await anyio.to_thread.run_sync(confluent_consume, port, "ck", len(records))
    check_consumed(records, consumed)


def confluent_produce_compressed(port: int, topic: str, codec: str, records: Expected) -> None:
    producer = Producer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "compression.type": codec, "linger.ms": 20}
    )
    for partition, key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(60) == 0


async def test_snappy_lz4_and_zstd_batches_from_librdkafka_and_aiokafka(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        port = daemon.kafka_port
        for codec in ("snappy", "lz4", "zstd"):
            records = make_records(600, seed=len(codec))
            await client.create_topic(f"rd-{codec}", PARTITIONS)
            await anyio.to_thread.run_sync(confluent_produce_compressed, port, f"rd-{codec}", codec, records)
            consumed = await anyio.to_thread.run_sync(confluent_consume, port, f"rd-{codec}", len(records))
            check_consumed(records, consumed)

            records = make_records(300, seed=10 + len(codec))
            await client.create_topic(f"aio-{codec}", PARTITIONS)
            producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", compression_type=codec)
            await producer.start()
            try:
                futures = [
                    await producer.send(f"aio-{codec}", key=k, value=v, partition=p) for p, k, v in records
                ]
                for future in futures:
                    await future
            finally:
                await producer.stop()
            consumed = await anyio.to_thread.run_sync(confluent_consume, port, f"aio-{codec}", len(records))
            check_consumed(records, consumed)


def timestamps_and_headers(port: int) -> tuple[list[tuple], dict[int, int], dict[int, int]]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    bootstrap = f"127.0.0.1:{port}"
    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type="gzip")
    try:
        for i in range(10):
            producer.send(
                "stamped",
                key=b"k%d" % i,
                value=b"v%d" % i,
                partition=0,
                timestamp_ms=1_700_000_000_000 + 1000 * i,
                headers=[("trace", b"t%d" % i), ("empty", b"")] if i % 2 else [],
            )
        producer.flush(30)
    finally:
        producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    try:
        tp = TopicPartition("stamped", 0)
        consumer.assign([tp])
        got = [(m.offset, m.timestamp, m.key, m.value, list(m.headers)) for m in consumer]
        by_time = consumer.offsets_for_times({tp: 1_700_000_004_500})
        exact = consumer.offsets_for_times({tp: 1_700_000_003_000})
        after_all = consumer.offsets_for_times({tp: 1_800_000_000_000})
    finally:
        consumer.close()
    return (
        got,
        {
            "mid": (by_time[tp].offset, by_time[tp].timestamp),
            "exact": (exact[tp].offset, exact[tp].timestamp),
        },
        {"after": after_all[tp]},
    )


async def test_timestamps_and_headers_are_kept_and_offsets_found_by_time(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("stamped", 1)
        got, found, after = await anyio.to_thread.run_sync(timestamps_and_headers, daemon.kafka_port)
    assert got == [
        (
            i,
            1_700_000_000_000 + 1000 * i,
            b"k%d" % i,
            b"v%d" % i,
            [("trace", b"t%d" % i), ("empty", b"")] if i % 2 else [],
        )
        for i in range(10)
    ]
    assert found == {"mid": (5, 1_700_000_005_000), "exact": (3, 1_700_000_003_000)}
    assert after == {"after": None}  # no record that late


async def test_the_http_api_carries_timestamps_and_headers_both_ways(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("http-stamped", 1)
        async with httpx.AsyncClient(base_url=daemon.url) as http:
            before = int(time.time() * 1000)
            answer = await http.post(
                "/v1/topics/http-stamped/partitions/0/records",
                json={
                    "records": [
                        {
                            "value": "YQ==",
                            "timestamp_ms": 1_700_000_000_001,
                            "headers": [["h", "eA=="], ["n", None]],
                        },
                        {"value": "Yg=="},
                    ]
                },
            )
            assert answer.status_code == 200, answer.text
            after = int(time.time() * 1000)
            body = (await http.get("/v1/topics/http-stamped/partitions/0/records")).json()
        # A record sent without a timestamp has the time the daemon received it.
        received = body["records"][1].pop("timestamp_ms")
        assert before <= received <= after
        assert body["records"] == [
            {
                "offset": 0,
                "key": None,
                "value": "YQ==",
                "timestamp_ms": 1_700_000_000_001,
                "headers": [["h", "eA=="], ["n", None]],
            },
            {"offset": 1, "key": None, "value": "Yg=="},
        ]
        from kafka import KafkaConsumer, TopicPartition

        def read() -> list[tuple]:
            consumer = KafkaConsumer(
                bootstrap_servers=f"127.0.0.1:{daemon.kafka_port}",
                auto_offset_reset="earliest",
                consumer_timeout_ms=3000,
            )
            try:
                consumer.assign([TopicPartition("http-stamped", 0)])
                return [(m.timestamp, m.value, list(m.headers)) for m in consumer]
            finally:
                consumer.close()

        got = await anyio.to_thread.run_sync(read)
    assert got == [(1_700_000_000_001, b"a", [("h", b"x"), ("n", None)]), (received, b"b", [])]


async def test_a_record_set_at_batch_bytes_max_by_the_size_rule_is_stored_and_one_byte_over_is_too_large(
    tmp_path: Path,
) -> None:
    """The Kafka door applies the HTTP door's size rule (value + key + header names and values
    + 8 per record): at the limit an aiokafka produce is stored; one byte more value gets
    MESSAGE_TOO_LARGE."""

    limit = 16 * 1024
    at_limit = limit - 100 - 4 - 8
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0", batcher__batch_bytes_max=limit) as (
        daemon,
        client,
    ):
        await client.create_topic("sized", 1)
        producer = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{daemon.kafka_port}")
        await producer.start()
        try:
            sent = await producer.send_and_wait(
                "sized",
                key=b"k" * 100,
                value=b"v" * at_limit,
                partition=0,
                timestamp_ms=1_700_000_000_000,
                headers=[("h", b"xyz")],
            )
            assert (sent.partition, sent.offset) == (0, 0)
            with pytest.raises(MessageSizeTooLargeError):
                await producer.send_and_wait(
                    "sized",
                    key=b"k" * 100,
                    value=b"v" * (at_limit + 1),
                    partition=0,
                    timestamp_ms=1_700_000_000_000,
                    headers=[("h", b"xyz")],
                )
        finally:
            await producer.stop()
        fetched = await client.fetch("sized", 0, 0)
    assert [(r.offset, r.key, r.value) for r in fetched.records] == [(0, b"k" * 100, b"v" * at_limit)]
    assert fetched.high_watermark == 1
