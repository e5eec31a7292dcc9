"""Idempotent producers' last batches, kept so a retry after a restart is recognised."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import msgspec

from levelzero.storage.protocols import ProducerBatchRow
from .base import PostgresBase, _Job, _PRODUCER_BATCH_COLUMNS


class ProducerBatchRole(PostgresBase):
    # ------------------------------------------------------------------ idempotent producers

    async def record_producer_batches(self, rows: Sequence[ProducerBatchRow], keep: int) -> None:
        """Durable on return; per (producer, topic, partition) only the `keep` newest remain."""
        assert keep >= 1, keep
        await self._stage("producer_batches", [(*msgspec.structs.astuple(r), keep) for r in rows])

    async def expire_producer_batches(
        self, producer_id_min: int, stored_before: float, rows_max: int, producer_id_below: int = 2**63 - 1
    ) -> None:
        assert rows_max >= 1, rows_max

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                "DELETE FROM producer_batches WHERE (producer_id, topic, partition, base_sequence) IN"
                " (SELECT producer_id, topic, partition, base_sequence FROM producer_batches"
                " WHERE producer_id >= $1 AND producer_id < $4 AND stored_at < $2"
                " ORDER BY stored_at LIMIT $3)",
                producer_id_min,
                stored_before,
                rows_max,
                producer_id_below,
            )

        await self._transact("expiring producers' batches", work)

    async def producer_batches(self, producer_id: int) -> list[ProducerBatchRow]:
        rows = await self._read(
            "reading an idempotent producer's batches",
            f"SELECT {_PRODUCER_BATCH_COLUMNS} FROM producer_batches WHERE producer_id = $1"
            " ORDER BY topic, partition, stored_at, base_sequence",
            producer_id,
        )
        return [ProducerBatchRow(*row) for row in rows]

    async def _stage(self, table: str, rows: list[tuple[Any, ...]]) -> None:
        """Event rows ride along with the batch's appends."""
        if rows:
            await self._submit(_Job(weight=len(rows), table=table, rows=rows))
