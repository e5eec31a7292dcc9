"""A transaction's marker cuts the batch window for its round (`batcher.transaction_linger_ms`):
the producer's next transaction's records, which join the marker in the partition's lane, wait
that long for the object at most, not the batcher's `linger_ms`; other record sets wait the
window. confluent-kafka's transactional producer against the listener; the batcher's requests
recorded as they arrive."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from confluent_kafka import Producer

from levelzero.core.txn_marks import txn_kind
from levelzero.kafka.transactions import KIND_DATA

from daemon_support import daemon_and_client
from kafka_txn_reads import read, settled

TOPIC = "lingered"
WAIT_S = 30.0


def transactions(port: int, count: int) -> None:
    producer = Producer(
        {"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "lingered", "linger.ms": 5}
    )
    producer.init_transactions(WAIT_S)
    for n in range(count):
        producer.begin_transaction()
        for i in range(2):
            producer.produce(TOPIC, value=b"%d-%d" % (n, i), partition=0)
        producer.commit_transaction(WAIT_S)


async def test_a_transactions_marker_round_cuts_the_batch_window(tmp_path: Path) -> None:
    async with daemon_and_client(
        tmp_path,
        kafka__listen="127.0.0.1:0",
        batcher__linger_ms=5.0,
        batcher__transaction_linger_ms=2.5,
    ) as (daemon, client):
        node, port = daemon.node, daemon.kafka_port
        await client.create_topic(TOPIC, 1)
        seen: list[tuple[int, int, float | None]] = []  # (markers, data records, linger_s)
        produce = node.batcher.produce

        async def recorded(actor: Any, records: Any, producers: Any = (), linger_s: Any = None) -> Any:
            kinds = [txn_kind(r.headers) for r in records]
            markers = sum(1 for k in kinds if k is not None and k[1] != KIND_DATA)
            data = sum(1 for k in kinds if k is not None and k[1] == KIND_DATA)
            seen.append((markers, data, linger_s))
            return await produce(actor, records, producers, linger_s)

        node.batcher.produce = recorded  # type: ignore[method-assign]
        await anyio.to_thread.run_sync(transactions, port, 3)
        await anyio.to_thread.run_sync(settled, port, TOPIC, 1, WAIT_S)
        assert sum(m for m, _, _ in seen) == 3 and sum(d for _, d, _ in seen) == 6
        for markers, _, linger_s in seen:
            assert linger_s == (0.0025 if markers else None), seen
        # the first transaction's records alone (no marker ahead); each later one's with the
        # previous marker, or after it once the marker's gather ran out
        assert seen[0] == (0, 2, None)
        values = [
            v for _, v in await anyio.to_thread.run_sync(read, port, TOPIC, "read_committed", 0, WAIT_S)
        ]
        assert values == [b"%d-%d" % (n, i) for n in range(3) for i in range(2)]
