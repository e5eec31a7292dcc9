"""Leader epochs (KIP-320): the partition's term, which a restart (or a failover) raises, is
the leader epoch Metadata names, fetched batches carry (librdkafka reads it per message), and
Fetch, ListOffsets and OffsetForLeaderEpoch check as Kafka's leader does: an older epoch is
FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH; OffsetForLeaderEpoch answers where each
term's records end, so a consumer validating its position after a leader change finds it."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from daemon_support import daemon_and_client
from levelzero.kafka.protocol import make

from test_kafka_listener import Wire, create_topic, module_of, produce
from test_kafka_records import client_batch

MS = datetime.timedelta(milliseconds=1)
TOPIC = "epochs"


async def metadata_epoch(wire: Wire) -> int:
    m = module_of(3, 12)
    response = await wire.request(
        3,
        12,
        topics=(make(m.MetadataRequestTopic, topic_id=None, name=TOPIC),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    (partition,) = response.topics[0].partitions
    return partition.leader_epoch


async def fetch_with_epoch(wire: Wire, epoch: int) -> Any:
    m = module_of(1, 12)
    part = make(
        m.FetchPartition,
        partition=0,
        current_leader_epoch=epoch,
        fetch_offset=0,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=1 << 20,
    )
    response = await wire.request(
        1,
        12,
        replica_id=-1,
        max_wait=0 * MS,
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(make(m.FetchTopic, topic=TOPIC, partitions=(part,)),),
        forgotten_topics_data=(),
        rack_id="",
    )
    return response.responses[0].partitions[0]


async def list_offsets_with_epoch(wire: Wire, epoch: int) -> Any:
    m = module_of(2, 7)
    part = make(m.ListOffsetsPartition, partition_index=0, current_leader_epoch=epoch, timestamp=-1)
    response = await wire.request(
        2,
        7,
        replica_id=-1,
        isolation_level=0,
        topics=(make(m.ListOffsetsTopic, name=TOPIC, partitions=(part,)),),
    )
    return response.topics[0].partitions[0]


async def end_offset_for(wire: Wire, epoch: int, current: int = -1) -> tuple[ErrorCode, int, int]:
    m = module_of(23, 4)
    part = make(m.OffsetForLeaderPartition, partition=0, current_leader_epoch=current, leader_epoch=epoch)
    response = await wire.request(
        23, 4, replica_id=-1, topics=(make(m.OffsetForLeaderTopic, topic=TOPIC, partitions=(part,)),)
    )
    (answer,) = response.topics[0].partitions
    return answer.error_code, answer.leader_epoch, answer.end_offset


def librdkafka_epochs(bootstrap: str, count: int) -> list[tuple[int, int]]:
    """(offset, leader epoch) of each message a confluent-kafka consumer reads."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "epochs", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    got: list[tuple[int, int]] = []
    try:
        for _ in range(300):
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                got.append((message.offset(), message.leader_epoch()))
            if len(got) == count:
                break
    finally:
        consumer.close()
    return got


async def test_the_term_is_the_leader_epoch_and_is_checked_as_kafka_checks_it(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        await create_topic(wire, TOPIC, 1)
        first = await metadata_epoch(wire)
        response = await produce(
            wire, TOPIC, 0, client_batch([(1000 + i, None, b"a%d" % i, ()) for i in range(5)])
        )
        assert response.responses[0].partition_responses[0].error_code == ErrorCode.none
        await wire.aclose()
    # A restart starts a new term: the partition's leader epoch rises.
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, _):
        wire = await Wire.connect(daemon.kafka_port)
        second = await metadata_epoch(wire)
        response = await produce(
            wire, TOPIC, 0, client_batch([(2000 + i, None, b"b%d" % i, ()) for i in range(5)])
        )
        assert response.responses[0].partition_responses[0].error_code == ErrorCode.none

        fenced = await fetch_with_epoch(wire, first)
        unknown = await fetch_with_epoch(wire, second + 1)
        current = await fetch_with_epoch(wire, second)
        listed_fenced = await list_offsets_with_epoch(wire, first)
        listed = await list_offsets_with_epoch(wire, second)
        ends = [await end_offset_for(wire, e) for e in (first, second, second + 1)]
        end_fenced = await end_offset_for(wire, first, current=first)
        await wire.aclose()
        by_message = await anyio.to_thread.run_sync(librdkafka_epochs, f"127.0.0.1:{daemon.kafka_port}", 10)

    assert 0 < first < second
    assert (fenced.error_code, fenced.records) == (ErrorCode.fenced_leader_epoch, b"")
    assert (unknown.error_code, unknown.records) == (ErrorCode.unknown_leader_epoch, b"")
    assert (current.error_code, current.high_watermark) == (ErrorCode.none, 10)
    assert listed_fenced.error_code == ErrorCode.fenced_leader_epoch
    assert (listed.error_code, listed.offset, listed.leader_epoch) == (ErrorCode.none, 10, second)
    # Term `first` wrote offsets 0-4, term `second` 5-9; a term above the current one is unknown.
    assert ends == [(ErrorCode.none, first, 5), (ErrorCode.none, second, 10), (ErrorCode.none, -1, -1)]
    assert end_fenced[0] == ErrorCode.fenced_leader_epoch
    # The batches librdkafka reads carry the term that wrote them.
    assert by_message == [(o, first) for o in range(5)] + [(o, second) for o in range(5, 10)]
