"""The L1 metastore: each partition's L1 objects and their states."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec

from levelzero.core.errors import InvariantViolation, PartitionDeleted
from levelzero.storage.log_rules import check_l1_state
from levelzero.storage.protocols import L1Row
from .base import PostgresBase, _L1_COLUMNS, unknown_partition


class L1Role(PostgresBase):
    # ------------------------------------------------------------------ L1 metastore

    async def l1_insert(self, row: L1Row) -> None:
        check_l1_state(row.state)
        values = msgspec.structs.astuple(row)

        async def work(connection: asyncpg.Connection) -> None:
            # The partition's row is share-locked first: a topic deletion under way waits for
            # this insert (and then collects the row), or has committed and the insert is refused.
            live = await connection.fetchval("SELECT 1 FROM partitions WHERE pid = $1 FOR KEY SHARE", row.pid)
            if live is None:
                refused = await unknown_partition(connection, row.pid, "L1 insert")
                if isinstance(refused, PartitionDeleted):
                    raise refused
            try:
                await connection.execute(
                    f"INSERT INTO l1_objects ({_L1_COLUMNS}) VALUES "
                    f"({', '.join(f'${i + 1}' for i in range(len(values)))})",
                    *values,
                )
            except asyncpg.UniqueViolationError:
                raise InvariantViolation(f"L1 object {row.key!r} is already recorded") from None

        await self._transact("recording an L1 object", work)

    async def l1_transition(self, key: str, from_state: str, to_state: str, now: float) -> bool:
        check_l1_state(from_state)
        check_l1_state(to_state)

        async def work(connection: asyncpg.Connection) -> bool:
            status = await connection.execute(
                "UPDATE l1_objects SET state = $1, updated_at = $2 WHERE key = $3 AND state = $4",
                to_state,
                now,
                key,
                from_state,
            )
            return status == "UPDATE 1"

        async def resolve(_connection: asyncpg.Connection) -> bool:
            return True  # the compare-and-set committed

        return await self._transact("moving an L1 object", work, resolve)

    async def l1_list(self, pid: int | None = None, states: Sequence[str] | None = None) -> list[L1Row]:
        if states is not None:
            for state in states:
                check_l1_state(state)
        rows = await self._read(
            "listing L1 objects",
            f"SELECT {_L1_COLUMNS} FROM l1_objects WHERE ($1::bigint IS NULL OR pid = $1)"
            " AND ($2::text[] IS NULL OR state = ANY($2::text[])) ORDER BY pid, base_offset, key",
            pid,
            None if states is None else list(states),
        )
        return [L1Row(*row) for row in rows]
