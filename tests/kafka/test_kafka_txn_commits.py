"""What a transaction stores, and when, at the wire (kio requests): AddPartitionsToTxn stores the
coordinator's state and opens the partitions' ranges (at their high watermarks) in one commit,
and nothing when the partitions are in the ongoing transaction already; its records need no
commit of their own for the range; EndTxn is answered once PREPARE_COMMIT is stored, and the
completion stores COMPLETE_COMMIT with the ranges closed (at the markers' offsets) in one
commit. A transactional produce after EndTxn (the transaction no longer ongoing, its markers
possibly not written yet) is refused with INVALID_TXN_STATE, so no record can land behind a
marker inside a range it closes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from levelzero.kafka import records as kr
from levelzero.kafka.protocol import make

from daemon_support import daemon_and_client
from test_kafka_listener import MS, Wire, module_of

TOPIC = "commits"
TID = "commits-tx"
TRANSACTIONAL = 0x10  # the batch attribute's transactional bit
COMPLETION_POLLS_MAX = 400  # of 50 ms


def batch(value: bytes, producer_id: int = -1, epoch: int = -1, sequence: int = -1) -> bytes:
    record = kr.KafkaRecord(0, int(time.time() * 1000), None, value)
    attributes = TRANSACTIONAL if producer_id >= 0 else 0
    return kr.encode_batch(
        0,
        [record],
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        attributes=attributes,
    )


async def produce(wire: Wire, partition: int, data: bytes, tid: str | None = None) -> Any:
    m = module_of(0, 9)
    topic = make(
        m.TopicProduceData,
        name=TOPIC,
        partition_data=(make(m.PartitionProduceData, index=partition, records=data),),
    )
    response = await wire.request(0, 9, transactional_id=tid, acks=-1, timeout=5000 * MS, topic_data=(topic,))
    return response.responses[0].partition_responses[0]


async def init_producer(wire: Wire) -> tuple[int, int]:
    """InitProducerId for TID: (producer id, epoch)."""
    init = await wire.request(
        22, 4, transactional_id=TID, transaction_timeout=60_000 * MS, producer_id=-1, producer_epoch=-1
    )
    assert init.error_code == ErrorCode.none
    return init.producer_id, init.producer_epoch


async def add_partitions(
    wire: Wire, producer_id: int, epoch: int, partitions: tuple[int, ...]
) -> list[ErrorCode]:
    m = module_of(24, 3)
    response = await wire.request(
        24,
        3,
        v3_and_below_transactional_id=TID,
        v3_and_below_producer_id=producer_id,
        v3_and_below_producer_epoch=epoch,
        v3_and_below_topics=(make(m.AddPartitionsToTxnTopic, name=TOPIC, partitions=partitions),),
    )
    return [
        p.partition_error_code for t in response.results_by_topic_v3_and_below for p in t.results_by_partition
    ]


async def test_a_transaction_stores_its_ranges_with_its_state_and_refuses_records_after_endtxn(
    tmp_path: Path,
) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 2)
        store = daemon.node.log_store
        calls: list[tuple[Any, ...]] = []
        put_transaction, open_txn_range = store.put_transaction, store.open_txn_range

        async def put_spy(row: Any, opened: Any = (), closed: Any = ()) -> None:
            await put_transaction(row, opened, closed)
            calls.append(
                (
                    row.state,
                    sorted((r.partition, r.first_offset) for r in opened),
                    sorted((r.partition, r.first_offset, r.last_offset, r.aborted) for r in closed),
                )
            )

        async def open_spy(row: Any) -> None:
            await open_txn_range(row)
            calls.append(("open_txn_range", row.partition))

        store.put_transaction = put_spy
        store.open_txn_range = open_spy
        wire = await Wire.connect(daemon.kafka_port)
        try:
            plain = await produce(wire, 0, batch(b"plain"))
            assert (plain.error_code, plain.base_offset) == (ErrorCode.none, 0)
            pid, epoch = await init_producer(wire)
            assert await add_partitions(wire, pid, epoch, (0, 1)) == [ErrorCode.none] * 2
            assert await add_partitions(wire, pid, epoch, (1,)) == [ErrorCode.none]  # already in it
            for partition in (0, 1):
                stored = await produce(wire, partition, batch(b"txn-%d" % partition, pid, epoch, 0), TID)
                assert (stored.error_code, stored.base_offset) == (ErrorCode.none, 1 - partition)
            ended = await wire.request(
                26, 3, transactional_id=TID, producer_id=pid, producer_epoch=epoch, committed=True
            )
            assert ended.error_code == ErrorCode.none
            late = await produce(wire, 0, batch(b"late", pid, epoch, 1), TID)
            assert late.error_code == ErrorCode.invalid_txn_state
            for _ in range(COMPLETION_POLLS_MAX):
                if calls[-1][0] == "complete_commit":  # stored
                    break
                await anyio.sleep(0.05)
            assert calls == [
                ("empty", [], []),  # InitProducerId
                ("ongoing", [(0, 1), (1, 0)], []),  # AddPartitionsToTxn: the ranges with it
                ("prepare_commit", [], []),  # EndTxn's answer follows this commit
                ("complete_commit", [], [(0, 1, 2, False), (1, 0, 1, False)]),  # markers at 2 and 1
            ]
            assert await store.txn_ranges(TOPIC, 0) == []
            assert daemon.node.partition(TOPIC, 0).state.high_watermark == 3  # plain, txn-0, marker
        finally:
            await wire.aclose()


def commit_offsets_in_a_transaction(port: int) -> int:
    """A transaction commits a record and the group "readers"'s offset 7 (confluent-kafka); the
    group's committed offset, read right after the commit was answered."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    group = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "readers"})
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "offsets-tx"})
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(TOPIC, value=b"out", partition=0)
        producer.send_offsets_to_transaction(
            [TopicPartition(TOPIC, 1, 7)], group.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
        (committed,) = group.committed([TopicPartition(TOPIC, 1)], timeout=30)
        return int(committed.offset)
    finally:
        group.close()


async def test_offset_fetch_after_the_commit_answer_gets_the_transactions_offsets(tmp_path: Path) -> None:
    """The offsets a transaction commits are stored with its completion, after EndTxn's answer:
    a consumer reading them after the commit gets them, never the offsets before (here the
    completion after the answer never runs: confluent-kafka asks for stable offsets, is
    answered UNSTABLE_OFFSET_COMMIT and retries until the coordinator's pass completes it; a
    client that does not ask has OffsetFetch complete it, `test_kafka_txn_kip447.py`)."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 2)
        coordinator = daemon.kafka.handlers.transactions

        async def never(txn: Any) -> None:
            pass

        coordinator._complete_later = never
        assert await anyio.to_thread.run_sync(commit_offsets_in_a_transaction, daemon.kafka_port) == 7
        (txn,) = coordinator._txns.values()
        assert txn.state == "complete_commit"
        assert await daemon.node.log_store.txn_ranges(TOPIC, 0) == []  # its marker written, range closed


async def stable_and_high(wire: Wire, partition: int) -> tuple[int, int]:
    """(last stable offset, high watermark) of TOPIC/`partition`: ListOffsets latest with
    read_committed, then read_uncommitted."""
    marks = []
    for isolation in (1, 0):
        m = module_of(2, 7)
        asked = make(m.ListOffsetsPartition, partition_index=partition, timestamp=-1, current_leader_epoch=-1)
        response = await wire.request(
            2,
            7,
            replica_id=-1,
            isolation_level=isolation,
            topics=(make(m.ListOffsetsTopic, name=TOPIC, partitions=(asked,)),),
        )
        marks.append(response.topics[0].partitions[0].offset)
    return marks[0], marks[1]


async def test_transactional_records_outside_a_transaction_here_are_refused(tmp_path: Path) -> None:
    """Transactional records no transaction here would ever end are refused, as Kafka refuses
    them (its produce handler; KIP-890's verification): without the request's transactional
    id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), of a producer id no transaction has or another
    transactional id's (INVALID_PRODUCER_ID_MAPPING), in a partition the transaction did not add
    (INVALID_TXN_STATE). Stored, each opened a range that held the last stable offset for good:
    every read_committed consumer of the partition stuck, across restarts."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 2)
        wire = await Wire.connect(daemon.kafka_port)
        try:
            bare = await produce(wire, 0, batch(b"no-tid", 424242, 0, 0), None)
            assert bare.error_code == ErrorCode.transactional_id_authorization_failed
            unknown = await produce(wire, 0, batch(b"unknown-pid", 424242, 0, 0), TID)
            assert unknown.error_code == ErrorCode.invalid_producer_id_mapping
            pid, epoch = await init_producer(wire)
            other = await produce(wire, 0, batch(b"other-tid", pid, epoch, 0), "another-tx")
            assert other.error_code == ErrorCode.invalid_producer_id_mapping
            assert await add_partitions(wire, pid, epoch, (0,)) == [ErrorCode.none]
            outside = await produce(wire, 1, batch(b"not-added", pid, epoch, 0), TID)
            assert outside.error_code == ErrorCode.invalid_txn_state
            inside = await produce(wire, 0, batch(b"added", pid, epoch, 0), TID)
            assert (inside.error_code, inside.base_offset) == (ErrorCode.none, 0)
            plain = await produce(wire, 1, batch(b"plain"))
            assert (plain.error_code, plain.base_offset) == (ErrorCode.none, 0)
            # Partition 1 holds no transactional record: its last stable offset is its end.
            assert await stable_and_high(wire, 1) == (1, 1)
            assert await stable_and_high(wire, 0) == (0, 1)  # the ongoing transaction's
        finally:
            await wire.aclose()


async def test_a_failed_produce_with_acks_0_closes_the_connection(tmp_path: Path) -> None:
    """A produce with acks=0 gets no answer; when it fails (here a partition the topic does not
    have) the connection is closed, as a Kafka broker closes it, so the producer notices,
    refreshes its metadata and reconnects instead of losing every record without a sign. One
    that succeeds leaves the connection open."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 1)
        m = module_of(0, 9)

        def topic_data(partition: int) -> tuple[Any, ...]:
            records = make(m.PartitionProduceData, index=partition, records=batch(b"fire-and-forget"))
            return (make(m.TopicProduceData, name=TOPIC, partition_data=(records,)),)

        wire = await Wire.connect(daemon.kafka_port)
        try:
            await wire.send(0, 9, transactional_id=None, acks=0, timeout=5000 * MS, topic_data=topic_data(0))
            versions = await wire.request(18, 3, client_software_name="t", client_software_version="1")
            assert versions.error_code == ErrorCode.none  # still open
            await wire.send(0, 9, transactional_id=None, acks=0, timeout=5000 * MS, topic_data=topic_data(9))
            assert await wire.frame() is None  # closed, with no answer
        finally:
            await wire.aclose()
        assert (await client.fetch(TOPIC, 0, 0)).high_watermark == 1
        assert daemon.kafka.stats.closed_unanswered_failures == 1  # type: ignore[union-attr]
