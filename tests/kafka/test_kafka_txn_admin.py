"""The admin APIs that inspect transactions (ListTransactions, DescribeTransactions,
DescribeProducers), read by kafka-python's admin client as `kafka-transactions.sh` reads them:
a transaction left open by a confluent-kafka producer is listed Ongoing with its partition, its
producer is active in the partition with the transaction's first offset, and once committed the
transaction is listed CompleteCommit and holds nothing open."""

from __future__ import annotations

import time
from pathlib import Path

import anyio

from daemon_support import daemon_and_client
from test_kafka_transactions import producer

TOPIC = "txn"


def listed(admin, **filters) -> list[tuple[str, str]]:
    """(transactional id, state) of every broker's listing."""
    by_broker = admin.list_transactions(**filters)
    return sorted((t.transactional_id, t.state.value) for listing in by_broker.values() for t in listing)


def inspect(port: int, tid: str) -> dict[str, object]:
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import TransactionalIdNotFoundError

    seen: dict[str, object] = {}
    open_one = producer(port, tid)
    open_one.init_transactions(30)
    open_one.begin_transaction()
    open_one.produce(TOPIC, value=b"a", partition=0)  # offset 0
    open_one.produce(TOPIC, value=b"b", partition=1)
    assert open_one.flush(30) == 0
    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", request_timeout_ms=20_000)
    try:
        seen["listed"] = listed(admin)
        seen["filtered"] = listed(admin, state_filters=["CompleteCommit"])
        described = admin.describe_transactions([tid])[tid]
        seen["described"] = (
            described.state.value,
            described.transaction_timeout_ms,
            described.transaction_start_time_ms > 0,
            sorted((tp.topic, tp.partition) for tp in described.topic_partitions),
        )
        tp = TopicPartition(TOPIC, 0)
        producers = admin.describe_producers([tp])[tp].active_producers
        seen["producers"] = [
            (p.producer_id == described.producer_id, p.last_sequence, p.current_transaction_start_offset)
            for p in producers
        ]
        seen["hanging"] = admin.find_hanging_transactions()
        open_one.commit_transaction(30)
        seen["committed"] = listed(admin)
        for _ in range(100):  # the markers follow EndTxn's answer (as Kafka's): the range closes then
            producers = admin.describe_producers([tp])[tp].active_producers
            seen["after"] = [(p.last_sequence, p.current_transaction_start_offset) for p in producers]
            if seen["after"] != [(0, 0)]:
                break
            time.sleep(0.05)
        try:
            admin.describe_transactions(["nobody"])
            seen["unknown"] = None
        except TransactionalIdNotFoundError:
            seen["unknown"] = "TRANSACTIONAL_ID_NOT_FOUND"
    finally:
        admin.close()
    return seen


async def test_kafka_python_lists_and_describes_an_open_transaction_and_its_producer(tmp_path: Path) -> None:
    async with daemon_and_client(tmp_path, kafka__listen="127.0.0.1:0") as (daemon, client):
        await client.create_topic(TOPIC, 2)
        seen = await anyio.to_thread.run_sync(inspect, daemon.kafka_port, "inspected")
    assert seen == {
        "listed": [("inspected", "Ongoing")],
        "filtered": [],
        "described": ("Ongoing", 60_000, True, [(TOPIC, 0), (TOPIC, 1)]),
        "producers": [(True, 0, 0)],
        "hanging": [],
        "committed": [("inspected", "CompleteCommit")],
        "after": [(0, -1)],
        "unknown": "TRANSACTIONAL_ID_NOT_FOUND",
    }
