"""ListOffsets v7-v11 and Kafka's special timestamps below earliest (-2): the record with the
largest timestamp (-3, v7), the local log's start (-4, v8), the last tiered offset (-5, v9) and
the first offset pending upload (-6, v11), answered as a Kafka broker answers them for a topic
without tiered storage; below the version that introduced one, UNSUPPORTED_VERSION."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from kio.schema.errors import ErrorCode

from levelzero.http.schema import RecordIn
from levelzero.kafka.protocol import make

from daemon_support import daemon_and_client
from test_kafka_listener import Wire, module_of

TOPIC = "special"
# out of order: the largest (9000) first appears at offset 2, again at 4
TIMESTAMPS = (1000, 4000, 9000, 2000, 9000, 3000)


def produce_and_list(port: int) -> dict[str, Any]:
    from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
    from kafka.admin import OffsetSpec

    bootstrap = f"127.0.0.1:{port}"
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for i, ts in enumerate(TIMESTAMPS):
            producer.send(TOPIC, b"v%d" % i, partition=0, timestamp_ms=ts).get(30)
    finally:
        producer.close()
    tp = TopicPartition(TOPIC, 0)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({tp: 1})  # the start offset (and so the local log's start) moves to 1
        found = {
            spec.name: admin.list_partition_offsets({tp: spec})[tp]
            for spec in (
                OffsetSpec.MAX_TIMESTAMP,
                OffsetSpec.EARLIEST_LOCAL,
                OffsetSpec.LATEST_TIERED,
                OffsetSpec.EARLIEST,
                OffsetSpec.LATEST,
            )
        }
    finally:
        admin.close()
    return {name: (r.offset, r.timestamp) for name, r in found.items()}


def confluent_max_timestamp(port: int) -> tuple[int, int]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"})
    tp = TopicPartition(TOPIC, 0)
    result = admin.list_offsets({tp: OffsetSpec.max_timestamp()})[tp].result(30)
    return result.offset, result.timestamp


async def test_special_timestamps_with_real_clients(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 1)
        found = await anyio.to_thread.run_sync(produce_and_list, daemon.kafka_port)
        assert found == {
            "MAX_TIMESTAMP": (2, 9000),
            "EARLIEST_LOCAL": (1, -1),
            "LATEST_TIERED": (-1, -1),
            "EARLIEST": (1, -1),
            "LATEST": (6, -1),
        }
        assert await anyio.to_thread.run_sync(confluent_max_timestamp, daemon.kafka_port) == (2, 9000)


async def list_offsets(wire: Wire, version: int, topic: str, timestamp: int) -> Any:
    m = module_of(2, version)
    part = make_partition(m, timestamp)
    fields: dict[str, Any] = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": (make(m.ListOffsetsTopic, name=topic, partitions=(part,)),),
    }
    if version >= 10:
        fields["timeout"] = 1000
    response = await wire.request(2, version, **fields)
    return response.topics[0].partitions[0]


def make_partition(m: Any, timestamp: int) -> Any:
    return make(m.ListOffsetsPartition, partition_index=0, current_leader_epoch=-1, timestamp=timestamp)


async def test_versions_and_refusals_on_the_wire(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("empty", 1)
        wire = await Wire.connect(daemon.kafka_port)
        try:
            versions = await wire.request(18, 3, client_software_name="t", client_software_version="1")
            listed = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
            assert listed[2] == (1, 11)
            # each special timestamp from the version that introduced it, refused below it
            for timestamp, first in ((-3, 7), (-4, 8), (-5, 9), (-6, 11)):
                below = await list_offsets(wire, first - 1, "empty", timestamp)
                assert below.error_code == ErrorCode.unsupported_version, timestamp
                assert (below.offset, below.timestamp) == (-1, -1)
                at = await list_offsets(wire, first, "empty", timestamp)
                assert at.error_code == ErrorCode.none, timestamp
            # an empty partition: no record has a largest timestamp
            assert (await list_offsets(wire, 11, "empty", -3)).offset == -1
            assert (await list_offsets(wire, 11, "empty", -4)).offset == 0
            pending = await list_offsets(wire, 11, "empty", -6)
            assert (pending.offset, pending.timestamp, pending.leader_epoch) == (-1, -1, -1)
            assert (await list_offsets(wire, 10, "empty", -1)).offset == 0
            # A negative timestamp no special value names is a lookup by time, as Kafka's log
            # search takes it (it was INVALID_REQUEST): every record is at or after it, so the
            # first from the start offset answers, with its timestamp; none in an empty partition.
            for version, timestamp in ((11, -7), (1, -7), (1, -100)):
                none = await list_offsets(wire, version, "empty", timestamp)
                assert (none.error_code, none.offset, none.timestamp) == (ErrorCode.none, -1, -1)
            await client.create_topic("stamped", 1)
            await client.produce(
                "stamped", 0, [RecordIn(b"a", timestamp_ms=5000), RecordIn(b"b", timestamp_ms=3000)]
            )
            await client.produce("stamped", 0, [RecordIn(b"c", timestamp_ms=7000)])
            first = await list_offsets(wire, 11, "stamped", -7)
            assert (first.error_code, first.offset, first.timestamp) == (ErrorCode.none, 0, 5000)
            assert daemon.node is not None
            await daemon.node.delete_records("stamped", 0, 1)
            moved = await list_offsets(wire, 11, "stamped", -100)
            assert (moved.error_code, moved.offset, moved.timestamp) == (ErrorCode.none, 1, 3000)
            assert (await list_offsets(wire, 11, "stamped", 4000)).offset == 2  # by time, as before
            # one partition named twice: every entry of it INVALID_REQUEST, as Kafka answers (a
            # client reading one of two answers took -1 for records that exist); others as usual
            await client.create_topic("other", 1)
            m = module_of(2, 7)
            twice = make(
                m.ListOffsetsTopic, name="empty", partitions=(make_partition(m, -2), make_partition(m, -1))
            )
            once = make(m.ListOffsetsTopic, name="other", partitions=(make_partition(m, -1),))
            response = await wire.request(2, 7, replica_id=-1, isolation_level=0, topics=(twice, once))
            answers = [(p.error_code, p.offset) for t in response.topics for p in t.partitions]
            assert answers == [(ErrorCode.invalid_request, -1)] * 2 + [(ErrorCode.none, 0)]
        finally:
            await wire.aclose()


def lookups_beside_an_open_transaction(port: int) -> dict[str, tuple[int, int]]:
    """Two plain records (timestamps 1000, 2000), then three in a transaction left open (5000,
    9000, 7000): each lookup by time, read_committed and read_uncommitted, as (offset, timestamp)."""
    from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    bootstrap = f"127.0.0.1:{port}"
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    for i, ts in enumerate((1000, 2000)):
        plain.produce("open", value=b"p%d" % i, partition=0, timestamp=ts)
    assert plain.flush(30) == 0
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "lookups", "linger.ms": 0})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i, ts in enumerate((5000, 9000, 7000)):
        txn.produce("open", value=b"t%d" % i, partition=0, timestamp=ts)
    assert txn.flush(30) == 0
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tp = TopicPartition("open", 0)
    out: dict[str, tuple[int, int]] = {}
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        for name, spec in (
            ("max", OffsetSpec.max_timestamp()),
            ("at 1500", OffsetSpec.for_timestamp(1500)),
            ("at 3000", OffsetSpec.for_timestamp(3000)),
            ("latest", OffsetSpec.latest()),
        ):
            result = admin.list_offsets({tp: spec}, isolation_level=level)[tp].result(30)
            out[f"{name} {level.name}"] = (result.offset, result.timestamp)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "x", "isolation.level": "read_committed"}
    )
    try:
        (found,) = consumer.offsets_for_times([TopicPartition("open", 0, 3000)], timeout=30)
        out["offsets_for_times read_committed"] = (found.offset, -1)
    finally:
        consumer.close()
    return out


async def test_a_lookup_by_time_finds_nothing_a_read_committed_consumer_cannot_fetch(tmp_path: Path) -> None:
    """As Kafka's ReplicaManager: a ListOffsets by time, or for the largest timestamp, finds no
    record at or past the last fetchable offset (the last stable offset for read_committed):
    -1, -1. It pointed a read_committed consumer's seek into a transaction still open."""
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("open", 1)
        out = await anyio.to_thread.run_sync(lookups_beside_an_open_transaction, daemon.kafka_port)
    assert out == {
        "max READ_COMMITTED": (-1, -1),  # 9000 is at 3, in the open transaction
        "at 1500 READ_COMMITTED": (1, 2000),
        "at 3000 READ_COMMITTED": (-1, -1),  # the first at or after 3000 is at 2, open
        "latest READ_COMMITTED": (2, -1),  # the last stable offset
        "max READ_UNCOMMITTED": (3, 9000),
        "at 1500 READ_UNCOMMITTED": (1, 2000),
        "at 3000 READ_UNCOMMITTED": (2, 5000),
        "latest READ_UNCOMMITTED": (5, -1),
        "offsets_for_times read_committed": (-1, -1),
    }
