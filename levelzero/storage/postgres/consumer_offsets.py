"""Consumer groups' committed offsets."""

from __future__ import annotations

from collections.abc import Sequence

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
