"""Kafka transactions: the coordinators' state and partitions' open and aborted ranges."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec

from levelzero.storage.protocols import TransactionRow, TxnRangeRow
from .base import PostgresBase

_TRANSACTION_COLUMNS = ", ".join(TransactionRow.__struct_fields__)
_RANGE_COLUMNS = ", ".join(TxnRangeRow.__struct_fields__)
_OPEN_RANGE = (
    f"INSERT INTO txn_ranges ({_RANGE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING"
)
_RANGE_WHERE = "WHERE topic = $1 AND partition = $2 AND producer_id = $3 AND first_offset = $4"
_ABORT_RANGE = f"UPDATE txn_ranges SET last_offset = $5, aborted = TRUE {_RANGE_WHERE}"
_DELETE_RANGE = f"DELETE FROM txn_ranges {_RANGE_WHERE}"


def _range_key(row: TxnRangeRow) -> tuple[str, int, int, int]:
    return row.topic, row.partition, row.producer_id, row.first_offset


class TransactionRole(PostgresBase):
    # ------------------------------------------------------------------ transactions

    async def put_transaction(
        self, row: TransactionRow, opened: Sequence[TxnRangeRow] = (), closed: Sequence[TxnRangeRow] = ()
    ) -> None:
        """One database transaction: the state and the ranges commit together."""
        values = msgspec.structs.astuple(row)

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                f"INSERT INTO transactions ({_TRANSACTION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6,"
                " $7, $8, $9, $10) ON CONFLICT (transactional_id) DO UPDATE SET"
                " producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch,"
                " state = excluded.state, timeout_ms = excluded.timeout_ms,"
                " started_at = excluded.started_at, partitions = excluded.partitions,"
                " groups = excluded.groups, updated_at = excluded.updated_at,"
                " prepared = excluded.prepared",
                *values,
            )
            if opened:
                await connection.executemany(_OPEN_RANGE, [msgspec.structs.astuple(r) for r in opened])
            aborted = [(*_range_key(r), r.last_offset) for r in closed if r.aborted]
            if aborted:
                await connection.executemany(_ABORT_RANGE, aborted)
            committed = [_range_key(r) for r in closed if not r.aborted]
            if committed:
                await connection.executemany(_DELETE_RANGE, committed)

        await self._transact(f"storing transaction {row.transactional_id!r}", work)

    async def expire_transaction(self, transactional_id: str, updated_at: float) -> None:
        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                "DELETE FROM transactions WHERE transactional_id = $1 AND updated_at = $2",
                transactional_id,
                updated_at,
            )

        await self._transact(f"expiring transactional id {transactional_id!r}", work)

    async def transactions(self) -> list[TransactionRow]:
        rows = await self._read(
            "reading transactions",
            f"SELECT {_TRANSACTION_COLUMNS} FROM transactions ORDER BY transactional_id",
        )
        return [TransactionRow(*row) for row in rows]

    async def open_txn_range(self, row: TxnRangeRow) -> None:
        values = msgspec.structs.astuple(row)

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(_OPEN_RANGE, *values)

        await self._transact("opening a transaction range", work)

    async def close_txn_range(
        self, topic: str, partition: int, producer_id: int, first_offset: int, last_offset: int, aborted: bool
    ) -> None:
        key = (topic, partition, producer_id, first_offset)

        async def work(connection: asyncpg.Connection) -> None:
            if aborted:
                await connection.execute(_ABORT_RANGE, *key, last_offset)
            else:
                await connection.execute(_DELETE_RANGE, *key)

        await self._transact("closing a transaction range", work)

    async def txn_ranges(self, topic: str, partition: int) -> list[TxnRangeRow]:
        rows = await self._read(
            "reading transaction ranges",
            f"SELECT {_RANGE_COLUMNS} FROM txn_ranges WHERE topic = $1 AND partition = $2"
            " ORDER BY first_offset, producer_id",
            topic,
            partition,
        )
        return [TxnRangeRow(*row) for row in rows]

    async def prune_txn_ranges(self, topic: str, partition: int, below: int) -> None:
        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                "DELETE FROM txn_ranges WHERE topic = $1 AND partition = $2 AND aborted AND last_offset < $3",
                topic,
                partition,
                below,
            )

        await self._transact("pruning transaction ranges", work)
