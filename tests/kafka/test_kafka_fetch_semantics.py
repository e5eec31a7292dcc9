"""Fetch semantics as Kafka's broker has them, checked with real clients.

- A partition's error (OFFSET_OUT_OF_RANGE, NOT_LEADER_OR_FOLLOWER, ...) carries an empty record
  set, never a null one: librdkafka reads a null record set as a protocol parse failure and
  retries forever, so `auto.offset.reset` never applies (`kcat -o 100` on 10 records hung).
- The response's byte budget counts only the bytes a partition returned: partitions with nothing
  to read use none of it, so a client that never rotates partition order (kafka-python) still
  reads the last of many partitions.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest
from kafka.errors import KafkaError

from daemon_support import daemon_and_client

POLLS_MAX = 60  # each poll waits at most a second


def librdkafka_consume_from(port: int, topic: str, offset: int, count: int) -> list[tuple[int, bytes]]:
    """Assign partition 0 at `offset` with auto.offset.reset=earliest, as `kcat -o N` does."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "fetch-reset",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        for _ in range(POLLS_MAX):
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append((message.offset(), message.value()))
            if len(got) >= count:
                break
    finally:
        consumer.close()
    return got


async def test_an_offset_out_of_range_resets_a_librdkafka_consumer(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("t", partitions=1)
        values = [b"v%d" % i for i in range(10)]
        await client.produce("t", 0, values)
        got = await anyio.to_thread.run_sync(librdkafka_consume_from, daemon.kafka_port, "t", 100, 10)
    assert got == list(enumerate(values))


def kafka_python_consume_all(port: int, topic: str, partitions: int, count: int) -> dict[int, int]:
    """Records read per partition, with kafka-python's default fetch sizes."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=f"127.0.0.1:{port}", auto_offset_reset="earliest", enable_auto_commit=False
    )
    seen: dict[int, int] = {}
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        for _ in range(POLLS_MAX):
            for tp, messages in consumer.poll(timeout_ms=1000).items():
                seen[tp.partition] = seen.get(tp.partition, 0) + len(messages)
            if sum(seen.values()) >= count:
                break
    finally:
        consumer.close()
    return seen


async def test_empty_partitions_use_none_of_the_fetch_budget(tmp_path: Path) -> None:
    partitions = 64
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("wide", partitions=partitions)
        # Only the last partition has data; every other one is empty. Before, each of the 63
        # empty partitions reserved its 1 MiB default maximum from kafka-python's 50 MiB budget,
        # which ran out before partition 63 in every fetch.
        await client.produce("wide", partitions - 1, [b"x" * 100] * 5)
        seen = await anyio.to_thread.run_sync(
            kafka_python_consume_all, daemon.kafka_port, "wide", partitions, 5
        )
    assert seen == {partitions - 1: 5}


def librdkafka_consume_both(port: int, count: int) -> list[tuple[int, bytes]]:
    """Partitions 0 and 1 of "t" from the beginning, until `count` records (errors skipped)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "both"})
    got: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition("t", p, OFFSET_BEGINNING) for p in (0, 1)])
        for _ in range(POLLS_MAX):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                got.append((message.partition(), message.value()))
            if len(got) >= count:
                break
    finally:
        consumer.close()
    return got


async def test_a_partition_whose_read_fails_unexpectedly_answers_an_error_and_no_other_suffers(
    tmp_path: Path, caplog
) -> None:
    """A bug in one partition's read (here a read of partition 0 made to raise) is that
    partition's UNKNOWN_SERVER_ERROR, as Kafka's broker answers it: the other partitions of the
    same fetch are served, the connection stays open, and the traceback is logged once for the
    many fetches the client retries at once. Before, the whole request failed: the connection
    was closed and nothing was read from any partition of it, and every retry logged a
    traceback of its own (a compaction bug grew a log by 25 MB in ten minutes)."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("t", partitions=2)
        await client.produce("t", 0, [b"unreadable"])
        values = [b"v%d" % i for i in range(5)]
        await client.produce("t", 1, values)
        node, fetch = daemon.node, daemon.node.fetch

        async def failing(topic: str, partition: int, *args, **kwargs):
            if partition == 0:
                raise RuntimeError("a reader bug")
            return await fetch(topic, partition, *args, **kwargs)

        node.fetch = failing  # type: ignore[method-assign]
        errors_before = daemon.kafka.stats.errors
        with caplog.at_level(logging.ERROR, "levelzero.kafka"):
            seen = await anyio.to_thread.run_sync(librdkafka_consume_both, daemon.kafka_port, 5)
            # kafka-python raises the partition's error to the application (UnknownError).
            with pytest.raises(KafkaError, match="UnknownError"):
                await anyio.to_thread.run_sync(kafka_python_consume_all, daemon.kafka_port, "t", 2, 5)
        assert seen == [(1, v) for v in values]
        assert daemon.kafka.stats.errors == errors_before  # no request failed whole
        bugs = [r for r in caplog.records if "failed unexpectedly (RuntimeError)" in r.getMessage()]
        assert len(bugs) == 1 and bugs[0].exc_info is not None, [r.getMessage() for r in caplog.records]
        assert "t/0@0" in bugs[0].getMessage()
