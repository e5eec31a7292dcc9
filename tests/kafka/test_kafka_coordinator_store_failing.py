"""The group and transaction coordinators' requests while their store fails: each is answered
COORDINATOR_NOT_AVAILABLE (the client finds the coordinator again and retries), as a failing
group load already was. A StorageError out of OffsetFetch, ListGroups, DescribeGroups,
DeleteGroups, OffsetDelete, ListTransactions or DescribeTransactions (or a transactional
Produce's check) closed the connection with no answer and logged a traceback as a bug; every
consumer sends OffsetFetch when it starts."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode

from daemon_support import daemon_and_client
from levelzero.core.errors import StorageError
from levelzero.kafka import records as kr
from levelzero.kafka.protocol import make
from test_kafka_listener import MS, Wire, module_of


async def _away(*_: Any, **__: Any) -> Any:
    raise StorageError("the control plane is away")


async def test_the_coordinators_answer_not_available_while_their_store_fails(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("t", 1)
        store = daemon.node.log_store
        store.committed_offsets = _away
        store.offset_groups = _away
        coordinator = daemon.kafka.handlers.transactions
        await coordinator.load()
        coordinator._loaded = False  # as before a restart's first request: read from the store
        coordinator.store.transactions = _away
        wire = await Wire.connect(daemon.kafka_port)  # one connection: none of them closes it
        try:
            fetched = await wire.request(9, 2, group_id="g", topics=None)
            assert fetched.error_code == ErrorCode.coordinator_not_available
            topics = (make(module_of(9, 1).OffsetFetchRequestTopic, name="t", partition_indexes=(0,)),)
            (old,) = (await wire.request(9, 1, group_id="g", topics=topics)).topics  # no top-level code
            assert [(p.partition_index, p.committed_offset, p.error_code) for p in old.partitions] == [
                (0, -1, ErrorCode.coordinator_not_available)
            ]
            listed = await wire.request(16, 0)
            assert (listed.error_code, listed.groups) == (ErrorCode.coordinator_not_available, ())
            described_groups = await wire.request(15, 5, groups=("g",), include_authorized_operations=False)
            (described,) = described_groups.groups
            assert described.error_code == ErrorCode.coordinator_not_available
            (deleted,) = (await wire.request(42, 0, groups_names=("g",))).results
            assert deleted.error_code == ErrorCode.coordinator_not_available
            offsets_deleted = await wire.request(47, 0, group_id="g", topics=())
            assert offsets_deleted.error_code == ErrorCode.coordinator_not_available
            transactions = await wire.request(66, 0, state_filters=(), producer_id_filters=())
            assert transactions.error_code == ErrorCode.coordinator_not_available
            await wire.send(65, 0, transactional_ids=("x",))
            frame = await wire.frame()  # (read by hand: the reader here refuses its -1 start time)
            assert frame is not None, "the listener closed the connection"
            # correlation id, no tagged fields, throttle time, one state: its error code first
            correlation, tags, _, states, code = struct.unpack_from(">iBiBh", frame)
            assert (correlation, tags, states) == (wire.correlation, 0, 2)
            assert code == ErrorCode.coordinator_not_available
            # A transactional record set is checked against the transactions read first: the
            # partition's error (retriable), not a closed connection.
            record = kr.KafkaRecord(0, 1_700_000_000_000, None, b"v")
            opened = {"producer_id": 7, "producer_epoch": 0, "base_sequence": 0}
            batch = kr.encode_batch(0, [record], attributes=kr.ATTR_TRANSACTIONAL, **opened)
            m = module_of(0, 9)
            data = make(
                m.TopicProduceData,
                name="t",
                partition_data=(make(m.PartitionProduceData, index=0, records=batch),),
            )
            asked = {"transactional_id": "x", "acks": -1, "timeout": 5000 * MS, "topic_data": (data,)}
            produced = await wire.request(0, 9, **asked)
            (topic,) = produced.responses
            assert topic.partition_responses[0].error_code == ErrorCode.kafka_storage_error
        finally:
            await wire.stream.aclose()
