"""A committed offset keeps the leader epoch its consumer committed with it (KIP-320: a
consumer restoring its position checks the log against that epoch), through OffsetCommit and a
transaction's TxnOffsetCommit alike, and OffsetFetch answers it, as Kafka's group coordinator
does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio

from levelzero.kafka.transactions import TxnState
from levelzero.storage.protocols import TransactionRow

from daemon_support import daemon_and_client


def commit_and_read(port: int) -> dict[str, Any]:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    bootstrap = f"127.0.0.1:{port}"
    t0, t1 = TopicPartition("epochs", 0), TopicPartition("epochs", 1)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="plain", enable_auto_commit=False)
    try:
        consumer.commit({t0: OffsetAndMetadata(0, "m", 0), t1: OffsetAndMetadata(0, "n", -1)})
    finally:
        consumer.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id="epochs-tx")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("epochs", partition=0, value=b"v").get(30)
        producer.send_offsets_to_transaction({t0: OffsetAndMetadata(1, "t", 0)}, "txn")
        producer.commit_transaction()
        producer.begin_transaction()  # aborted: its offsets are never committed
        producer.send_offsets_to_transaction({t1: OffsetAndMetadata(1, "bad", 1)}, "txn")
        producer.abort_transaction()
    finally:
        producer.close()
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return {group: admin.list_group_offsets(group)[group] for group in ("plain", "txn")}
    finally:
        admin.close()


async def test_committed_leader_epochs_come_back(tmp_path: Path) -> None:
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata

    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic("epochs", 2)
        found = await anyio.to_thread.run_sync(commit_and_read, daemon.kafka_port)
    t0, t1 = TopicPartition("epochs", 0), TopicPartition("epochs", 1)
    assert found == {
        "plain": {t0: OffsetAndMetadata(0, "m", 0), t1: OffsetAndMetadata(0, "n", -1)},
        "txn": {t0: OffsetAndMetadata(1, "t", 0)},
    }


def test_a_transaction_stored_before_epochs_were_kept_reads_back() -> None:
    """An open transaction's offsets stored with four fields (before the leader epoch was kept)
    load with the epoch unknown (-1)."""

    def stored(offsets: list[list[Any]]) -> TransactionRow:
        return TransactionRow("tx", 7, 0, "ongoing", 60_000, 1.0, "[]", json.dumps({"g": offsets}), 1.0)

    assert TxnState.of_row(stored([["t", 0, 5, "m"]])).groups == {"g": [("t", 0, 5, "m", -1)]}
    assert TxnState.of_row(stored([["t", 0, 5, "m", 3]])).groups == {"g": [("t", 0, 5, "m", 3)]}
