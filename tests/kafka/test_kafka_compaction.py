"""A compacted topic through real Kafka clients: confluent-kafka's AdminClient creates it with
`cleanup.policy=compact`, librdkafka produces keyed values and a tombstone, and after the
reconciler and the compactor ran, a consumer reading from the beginning sees the latest value
per key at its original offset (the removed offsets are gaps) and the tombstone, kept for
`delete.retention.ms`; the status shows the pass and the cleaner-offset map. A record without
a key is refused as Kafka refuses it (INVALID_RECORD)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from daemon_support import daemon_and_client

TOPIC = "changelog"
POLLS_MAX = 60  # each poll waits at most a second
KAFKA = {"kafka__listen": "127.0.0.1:0"}
PRODUCED = [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1"), (b"b", None), (b"a", b"3")]
# The latest per key at its offset: a@5, b's tombstone@4, c@3.
LATEST = [(3, b"c", b"1"), (4, b"b", None), (5, b"a", b"3")]


def create_compacted(port: int) -> str | None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
    (future,) = admin.create_topics([NewTopic(TOPIC, 1, config=config)], request_timeout=20).values()
    try:
        future.result()
    except KafkaException as exc:
        return str(exc.args[0].name())
    return None


def produce(port: int, records: list[tuple[bytes | None, bytes | None]]) -> list[str]:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "linger.ms": 0, "retries": 0})
    errors: list[str] = []

    def on_delivery(err, _message) -> None:
        if err is not None:
            errors.append(err.name())

    for key, value in records:
        producer.produce(TOPIC, key=key, value=value, partition=0, on_delivery=on_delivery)
        producer.flush(30)  # one by one: each its own batch, its own offset order
    assert producer.flush(30) == 0
    return errors


def consume_from_beginning(
    port: int, wanted: int, extra: dict[str, Any] | None = None
) -> list[tuple[int, bytes | None, bytes | None]]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "reader", "enable.auto.commit": False}
        | (extra or {})
    )
    got: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        for _ in range(POLLS_MAX):
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append((message.offset(), message.key(), message.value()))
            if len(got) >= wanted:
                break
    finally:
        consumer.close()
    return got


async def test_a_consumer_of_a_compacted_topic_sees_the_latest_value_per_key(tmp_path: Path) -> None:
    async with daemon_and_client(
        tmp_path, **KAFKA, reconciler__object_bytes_min=0, reconciler__object_age_max_s=0
    ) as (daemon, client):
        port = daemon.kafka_port
        assert await anyio.to_thread.run_sync(create_compacted, port) is None
        assert await anyio.to_thread.run_sync(produce, port, PRODUCED) == []
        assert await anyio.to_thread.run_sync(produce, port, [(None, b"keyless")]) == ["INVALID_RECORD"]
        node = daemon.node
        await node.reconciler.run_round()
        assert node.partition(TOPIC, 0).state.lro == len(PRODUCED) - 1
        assert await node.compactor.run_round() == 1
        got = await anyio.to_thread.run_sync(consume_from_beginning, port, len(LATEST))
        assert got == LATEST
        compactor = (await client.status()).compactor
        assert compactor is not None and compactor.passes == 1
        (status,) = compactor.partitions
        term = node.partition(TOPIC, 0).term
        assert (status.partition, status.records_removed, status.tombstones_dropped) == (f"{TOPIC}/0", 3, 0)
        assert status.cleaner_offsets == {str(term): 5} and status.bytes_reclaimed > 0
        assert status.dirty_ratio == 0.0 and status.last_compaction_at is not None


async def test_a_consumer_with_a_small_fetch_size_reads_a_compacted_object_with_gaps(tmp_path: Path) -> None:
    """k0..k19, then the even keys again: compaction keeps the odd offsets 1..19 and 20..29,
    one object with gaps inside. A consumer whose fetch size ends its fetches inside it (a
    changelog re-read by default once it outgrows a fetch) got nothing: a fetch whose budget
    ended at a gap failed an assertion and the connection was closed, fetch after fetch."""
    firsts = [(b"k%d" % i, b"a%d" % i) for i in range(20)]
    seconds = [(b"k%d" % i, b"b%d" % i) for i in range(0, 20, 2)]
    kept = [(o, b"k%d" % o, b"a%d" % o) for o in range(1, 20, 2)]
    kept += [(20 + i, b"k%d" % (2 * i), b"b%d" % (2 * i)) for i in range(10)]
    async with daemon_and_client(
        tmp_path, **KAFKA, reconciler__object_bytes_min=0, reconciler__object_age_max_s=0
    ) as (daemon, _):
        port = daemon.kafka_port
        assert await anyio.to_thread.run_sync(create_compacted, port) is None
        assert await anyio.to_thread.run_sync(produce, port, firsts + seconds) == []
        await daemon.node.reconciler.run_round()
        assert await daemon.node.compactor.run_round() == 1
        small = {"max.partition.fetch.bytes": 64}
        got = await anyio.to_thread.run_sync(consume_from_beginning, port, len(kept), small)
        assert got == kept


def wait_stable(port: int, end: int) -> None:
    """Until the partition's last stable offset is `end`: the markers of the transactions ended
    are stored. EndTxn is answered before its markers are (as Kafka's coordinator answers), and a
    transaction registering meanwhile opens its range at the high watermark then (the last
    stable offset holds from AddPartitionsToTxn on, docs/kafka.md), below the marker: under load
    the offsets these scenarios name moved (a range opened at the commit marker held it from a
    read_committed consumer)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "lso", "isolation.level": "read_committed"}
    )
    try:
        for _ in range(POLLS_MAX * 10):
            _, stable = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10, cached=False)
            if stable == end:
                return
            time.sleep(0.1)
        raise AssertionError(f"the last stable offset stayed at {stable}, not {end}")
    finally:
        consumer.close()


def transactions_on_a_compacted_topic(port: int) -> None:
    """a=1 b=1 committed (offsets 0, 1, commit marker 2); a=2 aborted (3, abort marker 4); b=2
    in a transaction left open (5)."""
    from confluent_kafka import Producer

    def producer(tid: str) -> Producer:
        p = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": tid, "linger.ms": 0})
        p.init_transactions(30)
        return p

    first = producer("compacting-1")
    first.begin_transaction()
    first.produce(TOPIC, key=b"a", value=b"1", partition=0)
    first.produce(TOPIC, key=b"b", value=b"1", partition=0)
    first.commit_transaction(30)
    wait_stable(port, 3)
    first.begin_transaction()
    first.produce(TOPIC, key=b"a", value=b"2", partition=0)
    assert first.flush(30) == 0
    first.abort_transaction(30)
    wait_stable(port, 5)
    left_open = producer("compacting-2")
    left_open.begin_transaction()
    left_open.produce(TOPIC, key=b"b", value=b"2", partition=0)
    assert left_open.flush(30) == 0


def read_committed_to(port: int, end: int) -> tuple[list[tuple[int, bytes | None, bytes | None]], int]:
    """Partition 0 read with read_committed from the beginning until the position reaches `end`
    (at most POLLS_MAX * 5 polls): the records, and the position reached."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "group.id": "committed-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    got: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        for _ in range(POLLS_MAX * 5):
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append((message.offset(), message.key(), message.value()))
            (position,) = consumer.position([TopicPartition(TOPIC, 0)])
            if position.offset >= end:
                break
    finally:
        consumer.close()
    return got, position.offset


async def test_compaction_keeps_what_read_committed_sees_under_aborted_and_open_transactions(
    tmp_path: Path,
) -> None:
    """As Kafka's cleaner: a record of an aborted transaction supersedes nothing (it is dropped),
    and nothing at or above the last stable offset is cleaned (an open transaction's record may
    still be aborted). Otherwise a changelog (Quix Streams, Kafka Streams under exactly-once)
    read with read_committed loses keys: their committed record was removed for one that never
    becomes visible."""
    status, got, position = await compacted_then_read(tmp_path, transactions_on_a_compacted_topic, 5)
    # cleaned to 4 (below the LSO, 5): the commit marker (2) and the aborted a=2 (3) removed
    assert status.records_removed == 2
    assert got == [(0, b"a", b"1"), (1, b"b", b"1")] and position == 5


async def compacted_then_read(
    tmp_path: Path, write: Callable[[int], None], lso: int
) -> tuple[Any, list[tuple[int, bytes | None, bytes | None]], int]:
    """A compacted topic written by `write` (a thread, given the Kafka port), reconciled up to
    `lso` - 1 and compacted once: the pass's status, and what read_committed reads to `lso`
    (the records, the position reached)."""
    async with daemon_and_client(
        tmp_path, **KAFKA, reconciler__object_bytes_min=0, reconciler__object_age_max_s=0
    ) as (daemon, client):
        port = daemon.kafka_port
        assert await anyio.to_thread.run_sync(create_compacted, port) is None
        await anyio.to_thread.run_sync(write, port)
        node = daemon.node
        await node.reconciler.run_round()
        assert node.partition(TOPIC, 0).state.lro == lso
        assert await node.compactor.run_round() == 1
        (status,) = (await client.status()).compactor.partitions  # type: ignore[union-attr]
        got, position = await anyio.to_thread.run_sync(read_committed_to, port, lso)
    return status, got, position


def a_commit_then_an_open_transaction(port: int) -> None:
    """a=0 outside any transaction (offset 0); a=1 b=1 committed (1, 2, commit marker 3); b=2 in
    a transaction left open (4): the last stable offset is 4."""
    from confluent_kafka import Producer

    assert produce(port, [(b"a", b"0")]) == []

    def producer(tid: str) -> Producer:
        return Producer({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": tid, "linger.ms": 0})

    committing = producer("t-1")
    committing.init_transactions(30)
    committing.begin_transaction()
    committing.produce(TOPIC, key=b"a", value=b"1", partition=0)
    committing.produce(TOPIC, key=b"b", value=b"1", partition=0)
    committing.commit_transaction(30)
    wait_stable(port, 4)
    left_open = producer("t-2")
    left_open.init_transactions(30)
    left_open.begin_transaction()
    left_open.produce(TOPIC, key=b"b", value=b"2", partition=0)
    assert left_open.flush(30) == 0


async def test_a_read_committed_consumer_reaches_the_last_stable_offset_after_compaction(
    tmp_path: Path,
) -> None:
    """The pass cleans below the last stable offset (4), to the commit marker (3): had it removed
    the marker, a read_committed consumer past the committed records (position 3) would find no
    record below the last stable offset (the open transaction's b=2 is not returned) and stay
    short of it until that transaction ends, as a killed exactly-once worker's may for its whole
    timeout. The cleaned range's last record stays, as Kafka's cleaner retains its round's last
    batch."""
    status, got, position = await compacted_then_read(tmp_path, a_commit_then_an_open_transaction, 4)
    assert position == 4
    assert got == [(1, b"a", b"1"), (2, b"b", b"1")]
    assert list(status.cleaner_offsets.values()) == [3] and status.records_removed == 1  # a=0 only
