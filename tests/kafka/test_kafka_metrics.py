"""The Kafka listener's metrics on the daemon's `/metrics`: requests, error codes and latency per
API, open connections and closes by reason, and Kafka produces in the produce latency histogram
(acknowledged apart from failed). Requests sent on a raw connection give exact counts; a real
client (librdkafka) shows the same series fill from its own traffic."""

from __future__ import annotations

from pathlib import Path

import anyio
from confluent_kafka import Consumer, Producer, TopicPartition
from kio.schema.errors import ErrorCode
from prometheus_client.parser import text_string_to_metric_families

from levelzero.kafka.protocol import make

from daemon_support import daemon_and_client
from test_kafka_listener import MS, Wire, create_topic, fetch, module_of, produce
from test_kafka_records import client_batch

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scraped: Samples, name: str, **labels: str) -> float | None:
    return scraped.get((name, frozenset(labels.items())))


def labelled(scraped: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in scraped.items() if n == name}


def by_api(scraped: Samples, name: str) -> dict[str, float]:
    return {dict(labels)["api"]: v for labels, v in labelled(scraped, name).items()}


async def produce_two_partitions(wire: Wire, topic: str, partitions: tuple[int, int]) -> object:
    m = module_of(0, 9)
    batch = client_batch([(0, b"k", b"v", [])])
    data = make(
        m.TopicProduceData,
        name=topic,
        partition_data=tuple(make(m.PartitionProduceData, index=p, records=batch) for p in partitions),
    )
    return await wire.request(0, 9, transactional_id=None, acks=-1, timeout=5000 * MS, topic_data=(data,))


async def test_requests_errors_and_latency_are_counted_per_api(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        wire = await Wire.connect(daemon.kafka_port)
        bad = await Wire.connect(daemon.kafka_port)
        try:
            await create_topic(wire, "m", 1)
            batch = client_batch([(0, b"k", b"v", []), (1, None, b"w", [])])
            stored = await produce(wire, "m", 0, batch)
            assert stored.responses[0].partition_responses[0].error_code == ErrorCode.none
            refused = await produce_two_partitions(wire, "m", (5, 6))  # no such partitions: 2 codes
            assert [p.error_code for p in refused.responses[0].partition_responses] == [  # type: ignore[attr-defined]
                ErrorCode.unknown_topic_or_partition
            ] * 2
            fetched = await fetch(wire, "m", 0, 0)
            assert fetched.responses[0].partitions[0].error_code == ErrorCode.none
            metadata = await wire.request(
                3,
                12,
                topics=(make(module_of(3, 12).MetadataRequestTopic, topic_id=None, name="no good"),),
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
            assert metadata.topics[0].error_code == ErrorCode.invalid_topic_exception
            both_open = samples(await client.metrics())
            await bad.send_raw(b"\0\0\0\x08\x7f\x7f\0\0\0\0\0\x01")  # api key 32639: unknown
            assert await bad.frame() is None  # closed, unanswered
            scraped = samples(await client.metrics())
        finally:
            await wire.aclose()
            await bad.aclose()

    assert by_api(scraped, "levelzero_kafka_requests_total") == {
        "CreateTopics": 1,
        "Produce": 2,
        "Fetch": 1,
        "Metadata": 1,
        "unknown": 1,
    }
    assert labelled(scraped, "levelzero_kafka_request_errors_total") == {
        frozenset({("api", "Produce"), ("error", "UNKNOWN_TOPIC_OR_PARTITION")}): 2,
        frozenset({("api", "Metadata"), ("error", "INVALID_TOPIC_EXCEPTION")}): 1,
    }
    # every answered request observed once; the unknown key's was never answered
    assert by_api(scraped, "levelzero_kafka_request_duration_seconds_count") == {
        "CreateTopics": 1,
        "Produce": 2,
        "Fetch": 1,
        "Metadata": 1,
        "unknown": 0,
    }
    assert value(scraped, "levelzero_kafka_request_duration_seconds_bucket", api="Produce", le="+Inf") == 2
    assert value(both_open, "levelzero_kafka_connections") == 2
    assert value(scraped, "levelzero_kafka_connections_accepted_total") == 2
    closed = {
        dict(labels)["reason"]: v
        for labels, v in labelled(scraped, "levelzero_kafka_connections_closed_total").items()
    }
    assert closed["malformed"] == 1
    assert sum(closed.values()) == 1
    # The produce histogram sees Kafka's produces: one acknowledged, one refused.
    assert (
        value(scraped, "levelzero_produce_latency_seconds_count", protocol="kafka", outcome="acknowledged")
        == 1
    )
    assert value(scraped, "levelzero_produce_latency_seconds_count", protocol="kafka", outcome="failed") == 1
    assert (
        value(scraped, "levelzero_produce_latency_seconds_count", protocol="http", outcome="acknowledged")
        == 0
    )


def produce_and_consume(port: int, topic: str, count: int) -> int:
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 5})
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=i % 2)
    assert producer.flush(20) == 0
    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "metrics", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        got = 0
        for _ in range(200):
            if got == count:
                break
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                got += 1
        return got
    finally:
        consumer.close()


async def test_a_real_clients_produces_and_fetches_show_in_the_metrics(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("c", 2)
        before = samples(await client.metrics())
        assert by_api(before, "levelzero_kafka_requests_total") == {}
        assert (
            value(before, "levelzero_produce_latency_seconds_count", protocol="kafka", outcome="acknowledged")
            == 0
        )
        consumed = await anyio.to_thread.run_sync(produce_and_consume, daemon.kafka_port, "c", 50)
        assert consumed == 50
        scraped = samples(await client.metrics())

    requests = by_api(scraped, "levelzero_kafka_requests_total")
    assert requests["ApiVersions"] >= 2 and requests["Metadata"] >= 2  # producer and consumer
    assert requests["Produce"] >= 1 and requests["Fetch"] >= 1
    # Each Produce request is one observation of the produce histogram, and every one was stored.
    acknowledged = value(
        scraped, "levelzero_produce_latency_seconds_count", protocol="kafka", outcome="acknowledged"
    )
    assert acknowledged == requests["Produce"]
    assert value(scraped, "levelzero_produce_latency_seconds_count", protocol="kafka", outcome="failed") == 0
    assert labelled(scraped, "levelzero_kafka_request_errors_total") == {}
    durations = by_api(scraped, "levelzero_kafka_request_duration_seconds_count")
    assert durations["Produce"] == requests["Produce"]
    assert 1 <= durations["Fetch"] <= requests["Fetch"]  # a long poll may be under way at the scrape
