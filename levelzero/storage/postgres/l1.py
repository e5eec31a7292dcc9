"""The L1 metastore: each partition's L1 objects and their states."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec

from levelzero.core.errors import InvariantViolation, PartitionDeleted
from levelzero.storage.log_rules import check_l1_state, compaction_commit_refusal
from levelzero.storage.protocols import CompactionCommit, CompactionState, L1Row, L1State
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

    async def l1_compaction_commit(self, commit: CompactionCommit, now: float) -> str | None:
        async def work(connection: asyncpg.Connection) -> str | None:
            # The partition's row is locked first: a new leader's begin_term (which raises the
            # term) waits for this commit, or has committed and the lineage check sees its term.
            term = await connection.fetchval(
                "SELECT term FROM partitions WHERE pid = $1 FOR UPDATE", commit.pid
            )
            accepted = {
                r["term"]: r["cleaned_to"]
                for r in await connection.fetch(
                    "SELECT term, cleaned_to FROM cleaner_offsets WHERE pid = $1", commit.pid
                )
            }
            keys = [*commit.new_keys, *commit.superseded_keys]
            rows = {
                r["key"]: (r["pid"], r["state"])
                for r in await connection.fetch(
                    "SELECT key, pid, state FROM l1_objects WHERE key = ANY($1::text[]) FOR UPDATE", keys
                )
            }
            refusal = compaction_commit_refusal(commit, term, accepted, rows)
            if refusal is not None:
                return refusal
            await connection.execute("DELETE FROM cleaner_offsets WHERE pid = $1", commit.pid)
            await connection.executemany(
                "INSERT INTO cleaner_offsets (pid, term, cleaned_to) VALUES ($1, $2, $3)",
                [(commit.pid, t, end) for t, end in commit.cleaner_offsets.items()],
            )
            await connection.execute(
                "UPDATE l1_objects SET state = $1, updated_at = $2 WHERE key = ANY($3::text[])",
                L1State.COPY_FINISHED,
                now,
                list(commit.new_keys),
            )
            await connection.execute(
                "UPDATE l1_objects SET state = $1, updated_at = $2 WHERE key = ANY($3::text[])",
                L1State.DELETE_STARTED,
                now,
                list(commit.superseded_keys),
            )
            await connection.executemany(
                "INSERT INTO l1_compacted (key, pid, committed_at) VALUES ($1, $2, $3)",
                [(key, commit.pid, now) for key in commit.new_keys],
            )
            return None

        async def resolve(connection: asyncpg.Connection) -> str | None:
            # The commit's fate after a lost connection: applied if its first new key is recorded.
            found = await connection.fetchval("SELECT 1 FROM l1_compacted WHERE key = $1", commit.new_keys[0])
            return None if found else "the connection was lost before the result was committed"

        return await self._transact("committing a compaction", work, resolve)

    async def l1_compaction_state(self, pid: int) -> CompactionState:
        offsets = await self._read(
            "reading the cleaner-offset map",
            "SELECT term, cleaned_to FROM cleaner_offsets WHERE pid = $1",
            pid,
        )
        keys = await self._read(
            "listing compacted L1 objects", "SELECT key FROM l1_compacted WHERE pid = $1", pid
        )
        return CompactionState({r[0]: r[1] for r in offsets}, frozenset(r[0] for r in keys))
