"""The cluster epoch: read and advanced with a compare-and-set."""

from __future__ import annotations

import asyncpg

from levelzero.core.errors import InvariantViolation
from levelzero.storage.log_rules import check_cluster_epoch

from .base import PostgresBase


class EpochRole(PostgresBase):
    # ------------------------------------------------------------------ cluster epoch

    async def get_cluster_epoch(self) -> int:
        rows = await self._read("reading the cluster epoch", "SELECT epoch FROM cluster_epoch WHERE id = 1")
        return rows[0]["epoch"] if rows else 1

    async def set_cluster_epoch(self, epoch: int) -> None:
        """Monotone in the database: the row is locked while it is compared and raised."""
        check_cluster_epoch(epoch)

        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                "INSERT INTO cluster_epoch (id, epoch) VALUES (1, 1) ON CONFLICT (id) DO NOTHING"
            )
            stored = await connection.fetchval("SELECT epoch FROM cluster_epoch WHERE id = 1 FOR UPDATE")
            if epoch < stored:
                raise InvariantViolation(f"cluster epoch would go back from {stored} to {epoch}")
            await connection.execute("UPDATE cluster_epoch SET epoch = $1 WHERE id = 1", epoch)

        await self._transact("setting the cluster epoch", work)

    async def probe_write(self) -> None:
        """A transaction given an id (`txid_current()`): its commit record goes through the WAL
        and its flush, as every write's does, and it locks no row (an upsert of the epoch's row
        queued behind the nodes' epoch advances and topic creations, and a lock held long
        would have failed the probe of a healthy database)."""

        async def work(connection: asyncpg.Connection) -> None:
            await connection.fetchval("SELECT txid_current()")

        await self._transact("probing the log store with a write", work)

    async def advance_cluster_epoch(self) -> int:
        """The stored epoch plus one, atomically (several nodes advance it: none goes back)."""

        async def work(connection: asyncpg.Connection) -> int:
            await connection.execute(
                "INSERT INTO cluster_epoch (id, epoch) VALUES (1, 1) ON CONFLICT (id) DO NOTHING"
            )
            return await connection.fetchval(
                "UPDATE cluster_epoch SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch"
            )

        return int(await self._transact("advancing the cluster epoch", work))
