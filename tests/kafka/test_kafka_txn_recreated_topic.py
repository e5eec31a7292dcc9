"""A topic deleted and made again under its name starts with no transactions: the coordinator's
index of each partition's open and aborted ranges was kept by name, and only a Kafka
DeleteTopics forgot it (before the delete, so a fetch meanwhile could load it again). After an
HTTP delete the new topic's partition inherited the old one's ranges: an aborted range of a
transactional id hid the committed records its next producer wrote at the same offsets from
read_committed readers; an open range would have held the partition's last stable offset and
its retention."""

from __future__ import annotations

from pathlib import Path

import anyio
from confluent_kafka import Producer

from daemon_support import daemon_and_client
from kafka_txn_reads import read, settled
from levelzero.kafka.handlers import Handlers
from levelzero.kafka.metadata import KafkaSettings
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import TransactionStore, TxnRangeRow
from levelzero.testing.nodes import hand_run_config, running_node

TOPIC = "again"


def _transaction(port: int, values: list[bytes], commit: bool) -> None:
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "app"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(TOPIC, value, partition=0)
    assert producer.flush(30) == 0
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


async def test_a_recreated_topic_inherits_no_aborted_range_of_the_deleted_one(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        port = daemon.kafka_port
        await client.create_topic(TOPIC, 1)
        await anyio.to_thread.run_sync(_transaction, port, [b"old"], False)  # 0: aborted, 1: marker
        await anyio.to_thread.run_sync(settled, port, TOPIC, 1, 30.0)
        assert await anyio.to_thread.run_sync(read, port, TOPIC, "read_committed", 0, 30.0) == []
        await client.delete_topic(TOPIC)  # over HTTP
        await client.create_topic(TOPIC, 1)
        # The same transactional id (the same producer id, its epoch bumped), committed this time.
        await anyio.to_thread.run_sync(_transaction, port, [b"new0", b"new1", b"new2"], True)
        await anyio.to_thread.run_sync(settled, port, TOPIC, 1, 30.0)
        got = await anyio.to_thread.run_sync(read, port, TOPIC, "read_committed", 0, 30.0)
        assert got == [(0, b"new0"), (1, b"new1"), (2, b"new2")]


async def test_without_a_store_of_transactions_a_deleted_topics_ranges_go_with_it() -> None:
    """A log store without the transaction role (the memory store) gets the coordinator's memory
    one: it kept a deleted topic's ranges, which a topic made again under its name loaded."""
    log_store = MemoryLogStore()
    assert not isinstance(log_store, TransactionStore)
    async with running_node(hand_run_config(), log_store, MemoryObjectStore()) as node:
        handlers = Handlers(node, KafkaSettings("127.0.0.1", 9092))
        index = handlers.transactions.index
        await node.create_topic(TOPIC, 1)
        await index.store.open_txn_range(TxnRangeRow(TOPIC, 0, 7, 0, -1, False))
        await index.store.close_txn_range(TOPIC, 0, 7, 0, 1, True)
        assert (await index.get(TOPIC, 0)).aborted == [(7, 0, 1)]
        await node.delete_topic(TOPIC)
        assert await index.store.txn_ranges(TOPIC, 0) == []
        await node.create_topic(TOPIC, 1)
        assert (await index.get(TOPIC, 0)).aborted == []


async def test_a_partition_handed_over_loads_its_ranges_again_when_it_comes_back() -> None:
    """In a cluster a partition's transaction ranges change on the node leading it meanwhile (a
    range opened, closed, aborted there, in the store). What this node had loaded stayed: back
    here, an abort made elsewhere was not listed and read_committed readers got its records.
    A partition handed over is forgotten, and loaded again from the store when it returns."""
    log_store = MemoryLogStore()
    async with running_node(hand_run_config(), log_store, MemoryObjectStore()) as node:
        handlers = Handlers(node, KafkaSettings("127.0.0.1", 9092))
        index = handlers.transactions.index
        (row,) = await node.create_topic(TOPIC, 1)
        assert (await index.get(TOPIC, 0)).aborted == []
        await node._resign([row.pid])  # led elsewhere now (a cluster's lease moved)
        assert index.known(TOPIC, 0) is None
        # Its next leader aborts a transaction there.
        await index.store.open_txn_range(TxnRangeRow(TOPIC, 0, 7, 0, -1, False))
        await index.store.close_txn_range(TOPIC, 0, 7, 0, 1, True)
        assert (await index.get(TOPIC, 0)).aborted == [(7, 0, 1)]  # back: read again
