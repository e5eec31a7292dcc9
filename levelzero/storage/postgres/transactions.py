"""Kafka transactions: the coordinators' state and partitions' open and aborted ranges."""

from __future__ import annotations

import asyncpg
import msgspec

from levelzero.storage.protocols import TransactionRow, TxnRangeRow
from .base import PostgresBase

_TRANSACTION_COLUMNS = ", ".join(TransactionRow.__struct_fields__)
_RANGE_COLUMNS = ", ".join(TxnRangeRow.__struct_fields__)


class TransactionRole(PostgresBase):
    # ------------------------------------------------------------------ transactions

    async def put_transaction(self, row: TransactionRow) -> None:
        values = msgspec.structs.astuple(row)

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                f"INSERT INTO transactions ({_TRANSACTION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6,"
                " $7, $8, $9) ON CONFLICT (transactional_id) DO UPDATE SET"
                " producer_id = excluded.producer_id, producer_epoch = excluded.producer_epoch,"
                " state = excluded.state, timeout_ms = excluded.timeout_ms,"
                " started_at = excluded.started_at, partitions = excluded.partitions,"
                " groups = excluded.groups, updated_at = excluded.updated_at",
                *values,
            )

        await self._transact(f"storing transaction {row.transactional_id!r}", work)

    async def transactions(self) -> list[TransactionRow]:
        rows = await self._read(
            "reading transactions",
            f"SELECT {_TRANSACTION_COLUMNS} FROM transactions ORDER BY transactional_id",
        )
        return [TransactionRow(*row) for row in rows]

    async def open_txn_range(self, row: TxnRangeRow) -> None:
        values = msgspec.structs.astuple(row)

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                f"INSERT INTO txn_ranges ({_RANGE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
                " ON CONFLICT DO NOTHING",
                *values,
            )

        await self._transact("opening a transaction range", work)

    async def close_txn_range(
        self, topic: str, partition: int, producer_id: int, first_offset: int, last_offset: int, aborted: bool
    ) -> None:
        async def work(connection: asyncpg.Connection) -> None:
            where = "WHERE topic = $1 AND partition = $2 AND producer_id = $3 AND first_offset = $4"
            if aborted:
                await connection.execute(
                    f"UPDATE txn_ranges SET last_offset = $5, aborted = TRUE {where}",
                    topic,
                    partition,
                    producer_id,
                    first_offset,
                    last_offset,
                )
            else:
                await connection.execute(
                    f"DELETE FROM txn_ranges {where}", topic, partition, producer_id, first_offset
                )

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
