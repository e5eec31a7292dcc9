"""Retention never moves a partition's start offset past the first offset of a transaction still
open there: its records, and the marker a restart looks for before writing one, stay until it
completes (a restart completing a prepared transaction whose range retention had cut could not
tell its records from the next transaction's). Once it completes, retention moves on.

confluent-kafka's transactional producer against the listener; the reconciler and the
housekeeper run a round at a time."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
from confluent_kafka import Consumer, Producer, TopicPartition

from daemon_support import daemon_and_client

TOPIC = "retained"
WAIT_S = 30.0


def open_transaction(port: int) -> Producer:
    """A transaction with two records in partition 0, acknowledged, not ended."""
    producer = Producer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "open", "linger.ms": 5}
    )
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    producer.produce(TOPIC, value=b"t0", partition=0)
    producer.produce(TOPIC, value=b"t1", partition=0)
    assert producer.flush(WAIT_S) == 0
    return producer


def stable_end(port: int) -> int:
    """Until the last stable offset reaches the high watermark: it."""
    deadline = time.monotonic() + WAIT_S
    while True:
        found = []
        for isolation in ("read_committed", "read_uncommitted"):
            reader = Consumer(
                {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "e", "isolation.level": isolation}
            )
            try:
                found.append(reader.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)[1])
            finally:
                reader.close()
        if found[0] == found[1]:
            return found[0]
        assert time.monotonic() < deadline, found
        time.sleep(0.1)


async def test_retention_keeps_an_open_transactions_first_offset(tmp_path: Path) -> None:
    async with daemon_and_client(
        tmp_path,
        kafka__listen="127.0.0.1:0",
        batcher__linger_ms=5.0,
        reconciler__enabled=False,
        housekeeper__enabled=False,
    ) as (daemon, client):
        node, port = daemon.node, daemon.kafka_port
        await client.create_topic(TOPIC, 1)
        await client.produce(TOPIC, 0, [b"a", b"b"])  # 0, 1
        assert await node.reconciler.run_round() == 1
        producer = await anyio.to_thread.run_sync(open_transaction, port)  # 2, 3
        assert await node.reconciler.run_round() == 1
        await client.produce(TOPIC, 0, [b"c", b"d"])  # 4, 5
        assert await node.reconciler.run_round() == 1
        await client.change_topic_configs(TOPIC, {"retention.bytes": "1"})  # the newest object stays
        await node.housekeeper.run_round(force=True)
        assert node.partition(TOPIC, 0).state.start_offset == 2  # not 4: the transaction is open

        await anyio.to_thread.run_sync(producer.commit_transaction, WAIT_S)
        assert await anyio.to_thread.run_sync(stable_end, port) == 7  # its marker at 6
        await client.produce(TOPIC, 0, [b"e"])  # 7
        assert await node.reconciler.run_round() == 1
        await node.housekeeper.run_round(force=True)
        # completed: retention moves on, to the newest object (its marker and e)
        assert node.partition(TOPIC, 0).state.start_offset == 6
