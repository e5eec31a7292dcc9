"""A Kafka fetch of many partitions reads each shared L0 object once (`actors/l0_cache.py`):
8 partitions written in the same 5 batch windows lie in 5 L0 objects, and a librdkafka
consumer of all 8 costs 5 GETs (counted at the object store), where reading each partition's
extent alone costs 40; the records come back byte for byte."""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import pytest

from daemon_support import daemon_and_client
from levelzero.core.l0format import Record
from levelzero.storage.counting_store import CountingObjectStore

TOPIC = "shared"
PARTITIONS = 8
WINDOWS = 5
RECORDS_PER_EXTENT = 4
POLLS_MAX = 60  # each poll waits at most a second


def written() -> dict[int, list[tuple[bytes, bytes]]]:
    """Each partition's (key, value) pairs in offset order: window after window, values of
    every byte and of different lengths."""
    rng = random.Random(38)
    return {
        p: [
            (b"%d/%d/%d" % (w, p, i), rng.randbytes(rng.randrange(1, 3000)))
            for w in range(WINDOWS)
            for i in range(RECORDS_PER_EXTENT)
        ]
        for p in range(PARTITIONS)
    }


def consume_all(port: int) -> dict[int, list[tuple[int, bytes, bytes]]]:
    """Every partition from offset 0 in one consumer: librdkafka's Fetch carries them all."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "l0-cache",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    got: dict[int, list[tuple[int, bytes, bytes]]] = {p: [] for p in range(PARTITIONS)}
    wanted = PARTITIONS * WINDOWS * RECORDS_PER_EXTENT
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        for _ in range(POLLS_MAX):
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                assert message.error() is None, message.error()
                got[message.partition()].append((message.offset(), message.key(), message.value()))
            if sum(map(len, got.values())) >= wanted:
                break
    finally:
        consumer.close()
    return got


@pytest.mark.parametrize(("cache_bytes", "gets"), [(64 << 20, WINDOWS), (0, WINDOWS * PARTITIONS)])
async def test_a_fetch_of_8_partitions_in_5_l0_objects_makes_5_gets(
    tmp_path: Path, cache_bytes: int, gets: int
) -> None:
    counting: list[CountingObjectStore] = []

    def wrap(inner):  # type: ignore[no-untyped-def]
        counting.append(CountingObjectStore(inner))
        return counting[-1]

    records = written()
    async with daemon_and_client(
        tmp_path,
        kafka__listen="127.0.0.1:0",
        wrap_object_store=wrap,
        batcher__linger_ms=50.0,  # the 8 partitions' produce calls of a window: one object
        reconciler__enabled=False,  # everything stays in L0
        node__l0_cache_bytes_max=cache_bytes,
    ) as (daemon, client):
        await client.create_topic(TOPIC, PARTITIONS)
        node, (objects,) = daemon.node, counting
        assert node is not None
        for w in range(WINDOWS):
            async with anyio.create_task_group() as tg:
                for p in range(PARTITIONS):
                    extent = records[p][w * RECORDS_PER_EXTENT : (w + 1) * RECORDS_PER_EXTENT]
                    tg.start_soon(node.produce, TOPIC, p, [Record(k, v) for k, v in extent])
        assert objects.snapshot().l0_puts == WINDOWS
        before = objects.snapshot()
        got = await anyio.to_thread.run_sync(consume_all, daemon.kafka_port)
        read = objects.snapshot() - before
        stats = node.l0_cache.statistics()
    assert got == {p: [(i, k, v) for i, (k, v) in enumerate(pairs)] for p, pairs in records.items()}
    assert (read.l0_gets, read.l1_gets) == (gets, 0)
    if cache_bytes:
        assert (stats.loads, stats.hits + stats.shared, stats.uncached_gets) == (5, 35, 0)
        assert stats.objects == WINDOWS and stats.evictions == 0
