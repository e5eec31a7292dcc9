"""The L0 catalog (objects this node uploaded, for the GC) and the event tables (fence events,
state samples, GC rounds).
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec

from levelzero.storage.history import HISTORY_TABLES, prune_statement
from levelzero.storage.protocols import FenceEventRow, GcRoundRow, L0ObjectRow, StateSampleRow

from .base import PostgresBase


class CatalogRole(PostgresBase):
    # ------------------------------------------------------------------ L0 catalog and events

    async def record_l0_object(self, row: L0ObjectRow) -> None:
        """Idempotent: recording a key twice keeps the first row."""
        await self._stage("l0_objects", [msgspec.structs.astuple(row)])

    async def mark_l0_deleted(self, keys: Sequence[str], at: float, m: int) -> None:
        """Every record call that returned committed before this transaction starts."""
        if not keys:
            return
        keys = list(keys)

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                "UPDATE l0_objects SET deleted_at = $1, deleted_at_m = $2"
                " WHERE key = ANY($3::text[]) AND deleted_at IS NULL",
                at,
                m,
                keys,
            )

        await self._transact("marking L0 objects deleted", work)

    async def l0_live_objects(
        self, max_epoch: int, after: tuple[int, str] | None = None, limit: int = 1000
    ) -> list[L0ObjectRow]:
        assert limit >= 1, limit
        after_epoch, after_key = after if after is not None else (-1, "")
        rows = await self._read(
            "reading the L0 catalog",
            "SELECT key, epoch, size, created_at, extents FROM l0_objects"
            " WHERE deleted_at IS NULL AND epoch <= $1 AND (epoch, key) > ($2::bigint, $3::text)"
            " ORDER BY epoch, key LIMIT $4",
            max_epoch,
            after_epoch,
            after_key,
            limit,
        )
        return [L0ObjectRow(*row) for row in rows]

    async def record_gc_round(self, row: GcRoundRow) -> None:
        await self._stage("gc_rounds", [msgspec.structs.astuple(row)])

    async def record_fence_events(self, rows: Sequence[FenceEventRow]) -> None:
        await self._stage("fence_events", [msgspec.structs.astuple(r) for r in rows])

    async def record_state_samples(self, rows: Sequence[StateSampleRow]) -> None:
        await self._stage("state_samples", [msgspec.structs.astuple(r) for r in rows])

    async def prune_history(self, before: float, limit: int) -> int:
        assert limit >= 1, limit

        async def work(connection: asyncpg.Connection) -> int:
            gone = 0
            for table in HISTORY_TABLES:
                status = await connection.execute(prune_statement(table, "postgres"), before, limit)
                gone += int(status.split()[-1])
            return gone

        async def resolve(_connection: asyncpg.Connection) -> int:
            return 0  # done before the answer was lost; how many went is not kept

        result: int = await self._transact("pruning the history tables", work, resolve)
        return result
