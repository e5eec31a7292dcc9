"""The transaction role (Kafka transactions' coordinator state and partitions' open and aborted
ranges): the memory, SQLite and PostgreSQL stores answer alike, and SQLite keeps it across
reopening."""

from __future__ import annotations

import json
from pathlib import Path

from levelzero.storage.postgres.store import PostgresLogStore
from levelzero.storage.protocols import (
    MemoryTransactionStore,
    TransactionRow,
    TransactionStore,
    TxnRangeRow,
)
from levelzero.storage.sqlite.store import SqliteLogStore


async def exercise(store: TransactionStore) -> None:
    assert isinstance(store, TransactionStore)
    first = TransactionRow("tx-a", 7, 0, "ongoing", 60_000, 1.5, '[["t", 0]]', "[]", 1.5)
    await store.put_transaction(first)
    await store.put_transaction(TransactionRow("tx-b", 8, 3, "empty", 10_000, 0.0, "[]", "[]", 2.0))
    bumped = TransactionRow("tx-a", 7, 1, "prepare_abort", 60_000, 1.5, '[["t", 0]]', '["g"]', 3.0)
    await store.put_transaction(bumped)  # the newer state of one id replaces the older
    assert [r.transactional_id for r in await store.transactions()] == ["tx-a", "tx-b"]
    assert (await store.transactions())[0] == bumped
    await store.open_txn_range(TxnRangeRow("t", 0, 7, 10, -1, False))
    await store.open_txn_range(TxnRangeRow("t", 0, 8, 4, -1, False))
    await store.open_txn_range(TxnRangeRow("t", 0, 7, 10, -1, False))  # again: kept once
    await store.open_txn_range(TxnRangeRow("t", 1, 7, 0, -1, False))
    assert await store.txn_ranges("t", 0) == [
        TxnRangeRow("t", 0, 8, 4, -1, False),
        TxnRangeRow("t", 0, 7, 10, -1, False),
    ]
    await store.close_txn_range("t", 0, 8, 4, 12, aborted=False)  # committed: forgotten
    await store.close_txn_range("t", 0, 7, 10, 14, aborted=True)
    assert await store.txn_ranges("t", 0) == [TxnRangeRow("t", 0, 7, 10, 14, True)]
    assert await store.txn_ranges("t", 1) == [TxnRangeRow("t", 1, 7, 0, -1, False)]
    assert await store.txn_ranges("u", 0) == []
    # Aborted ranges ending below a log start offset are pruned; open ones and others stay.
    for first, last in ((0, 3), (5, 8)):
        await store.open_txn_range(TxnRangeRow("t", 2, 9, first, -1, False))
        await store.close_txn_range("t", 2, 9, first, last, aborted=True)
    await store.open_txn_range(TxnRangeRow("t", 2, 10, 1, -1, False))
    await store.prune_txn_ranges("t", 2, 8)
    assert await store.txn_ranges("t", 2) == [
        TxnRangeRow("t", 2, 10, 1, -1, False),
        TxnRangeRow("t", 2, 9, 5, 8, True),
    ]
    assert await store.txn_ranges("t", 0) == [TxnRangeRow("t", 0, 7, 10, 14, True)]
    # The state with ranges opened (AddPartitionsToTxn) and closed (the markers written) in one
    # call: a committed range is forgotten, an aborted one keeps its abort marker's offset.
    ongoing = TransactionRow("tx-c", 11, 0, "ongoing", 60_000, 4.0, '[["t", 3], ["t", 4]]', "{}", 4.0)
    opened = [TxnRangeRow("t", 3, 11, 20, -1, False), TxnRangeRow("t", 4, 11, 5, -1, False)]
    await store.put_transaction(ongoing, opened=opened)
    assert (await store.transactions())[2] == ongoing
    assert await store.txn_ranges("t", 3) == [opened[0]]
    assert await store.txn_ranges("t", 4) == [opened[1]]
    done = TransactionRow("tx-c", 11, 0, "complete_abort", 60_000, 0.0, "[]", "{}", 5.0)
    await store.put_transaction(
        done, closed=[TxnRangeRow("t", 3, 11, 20, 25, True), TxnRangeRow("t", 4, 11, 5, 9, False)]
    )
    assert (await store.transactions())[2] == done
    assert await store.txn_ranges("t", 3) == [TxnRangeRow("t", 3, 11, 20, 25, True)]
    assert await store.txn_ranges("t", 4) == []
    # The next transaction stored beside a prepared one (`prepared`), then the prepared one's
    # completion: its range closed at its marker, the next one's opened just after, one commit.
    prepared = json.dumps(
        {
            "state": "prepare_commit",
            "epoch": 0,
            "partitions": [["t", 5]],
            "groups": {},
            "firsts": [["t", 5, 30]],
        }
    )
    beside = TransactionRow("tx-d", 12, 0, "ongoing", 60_000, 6.0, '[["t", 5]]', "{}", 6.0, prepared)
    await store.put_transaction(beside, opened=[TxnRangeRow("t", 5, 12, 30, -1, False)])
    assert (await store.transactions())[3] == beside
    handed = TransactionRow("tx-d", 12, 0, "ongoing", 60_000, 6.0, '[["t", 5]]', "{}", 7.0)
    await store.put_transaction(
        handed,
        opened=[TxnRangeRow("t", 5, 12, 41, -1, False)],
        closed=[TxnRangeRow("t", 5, 12, 30, 40, False)],
    )
    assert (await store.transactions())[3] == handed
    assert (await store.transactions())[3].prepared == ""
    assert await store.txn_ranges("t", 5) == [TxnRangeRow("t", 5, 12, 41, -1, False)]


async def exercise_expiry(store: TransactionStore) -> None:
    """A transactional id is forgotten (Kafka's transactional.id.expiration.ms) only if its row
    is still the one stored at the time given: a row stored since stays."""
    await store.put_transaction(
        TransactionRow("idle", 20, 0, "complete_commit", 60_000, 0.0, "[]", "{}", 8.0)
    )
    await store.put_transaction(TransactionRow("moved", 21, 0, "empty", 60_000, 0.0, "[]", "{}", 9.0))
    await store.expire_transaction("moved", 8.5)  # stored anew since (by the id's next coordinator)
    await store.expire_transaction("idle", 8.0)
    await store.expire_transaction("never", 1.0)
    ids = [r.transactional_id for r in await store.transactions()]
    assert "idle" not in ids and "moved" in ids


async def test_memory_transactions() -> None:
    await exercise(MemoryTransactionStore())
    await exercise_expiry(MemoryTransactionStore())


async def test_sqlite_keeps_transactions_across_reopening(tmp_path: Path) -> None:
    db = str(tmp_path / "levelzero.db")
    async with await SqliteLogStore.open(db) as store:
        await exercise(store)
    async with await SqliteLogStore.open(db) as store:
        assert [r.producer_epoch for r in await store.transactions()] == [1, 3, 0, 0]
        await exercise_expiry(store)
    async with await SqliteLogStore.open(db) as store:
        ids = [r.transactional_id for r in await store.transactions()]
        assert "moved" in ids and "idle" not in ids  # durable
        assert await store.txn_ranges("t", 0) == [TxnRangeRow("t", 0, 7, 10, 14, True)]


async def test_postgres_keeps_transactions(postgres_dsn: str) -> None:
    async with await PostgresLogStore.open(postgres_dsn) as store:
        await exercise(store)
        await exercise_expiry(store)
    async with await PostgresLogStore.open(postgres_dsn) as store:
        assert await store.txn_ranges("t", 0) == [TxnRangeRow("t", 0, 7, 10, 14, True)]
