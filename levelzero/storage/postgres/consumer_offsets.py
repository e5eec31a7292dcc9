"""Consumer groups' committed offsets."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec

from levelzero.storage.protocols import OffsetRow
from .base import PostgresBase, _OFFSET_COLUMNS


class ConsumerOffsetRole(PostgresBase):
    # ------------------------------------------------------------------ consumer offsets

    async def commit_offsets(self, rows: Sequence[OffsetRow]) -> None:
        await self._stage("consumer_offsets", [msgspec.structs.astuple(r) for r in rows])

    async def committed_offsets(self, group_id: str) -> list[OffsetRow]:
        rows = await self._read(
            "reading committed offsets",
            f"SELECT {_OFFSET_COLUMNS} FROM consumer_offsets WHERE group_id = $1 ORDER BY topic, partition",
            group_id,
        )
        return [OffsetRow(*row) for row in rows]

    async def offset_groups(self) -> list[str]:
        rows = await self._read(
            "reading the groups with committed offsets",
            "SELECT DISTINCT group_id FROM consumer_offsets ORDER BY group_id",
        )
        return [row[0] for row in rows]

    async def delete_offsets(self, group_id: str, partitions: Sequence[tuple[str, int]] | None) -> None:
        async def work(connection: asyncpg.Connection) -> None:
            if partitions is None:
                await connection.execute("DELETE FROM consumer_offsets WHERE group_id = $1", group_id)
            else:
                await connection.executemany(
                    "DELETE FROM consumer_offsets WHERE group_id = $1 AND topic = $2 AND partition = $3",
                    [(group_id, t, p) for t, p in partitions],
                )

        await self._transact("deleting committed offsets", work)

    async def expire_offsets(self, group_id: str, committed_before: float) -> None:
        async def work(connection: asyncpg.Connection) -> None:
            await connection.execute(
                "DELETE FROM consumer_offsets WHERE group_id = $1 AND committed_at < $2",
                group_id,
                committed_before,
            )

        await self._transact("expiring committed offsets", work)

    # ------------------------------------------------------------------ group metadata

    async def store_group_metadata(self, group_id: str, metadata: bytes | None, now: float) -> None:
        async def work(connection: asyncpg.Connection) -> None:
            if metadata is None:
                await connection.execute("DELETE FROM group_metadata WHERE group_id = $1", group_id)
            else:
                await connection.execute(
                    "INSERT INTO group_metadata (group_id, metadata, stored_at) VALUES ($1, $2, $3)"
                    " ON CONFLICT (group_id) DO UPDATE SET metadata = excluded.metadata,"
                    " stored_at = excluded.stored_at",
                    group_id,
                    metadata,
                    now,
                )

        await self._transact("storing a group's metadata", work)

    async def group_metadata(self, group_id: str) -> bytes | None:
        rows = await self._read(
            "reading a group's metadata",
            "SELECT metadata FROM group_metadata WHERE group_id = $1",
            group_id,
        )
        return bytes(rows[0][0]) if rows else None

    async def metadata_groups(self) -> list[str]:
        rows = await self._read(
            "reading the groups with stored metadata",
            "SELECT group_id FROM group_metadata ORDER BY group_id",
        )
        return [row[0] for row in rows]
