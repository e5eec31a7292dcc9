"""The export's view of a PostgreSQL control plane: one read-only REPEATABLE READ transaction (a
consistent snapshot that never blocks the daemons' writers), behind the small part of the
`sqlite3.Connection` interface the export uses, so the export runs the same code on either
backend. Statements are the export's own, in SQLite's spelling: `?` parameters become `$n`,
`rowid` becomes the `seq` column that PostgreSQL tables keep for the same purpose.

Rows are fetched through a server-side cursor, `fetchmany` at a time: memory stays bounded.

New rows are chosen differently: SQLite has one writer, so rows commit in rowid order and a
rowid watermark is enough. PostgreSQL's writers commit concurrently, each drawing `seq` when it
inserts, so a row can commit after a higher `seq` was seen. The snapshot's `xid_horizon` (the
oldest transaction still running when it was taken) bounds the rows that are final: every row
whose `xid` is below it committed or never will. An export takes the rows with `xid` in
`[last horizon, this horizon)` (`NEW_ROWS`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import asyncpg

from levelzero.storage.postgres.schema import SCHEMA_TABLES, SCHEMA_VERSION
from levelzero.storage.postgres.store import CONNECTION_ERRORS, redacted

from .errors import ExportError

CONNECT_TIMEOUT_S = 10.0


def is_dsn(source: str) -> bool:
    return source.startswith(("postgresql://", "postgres://"))


def to_postgres(sql: str) -> str:
    """`?` -> `$1, $2, ...`; `rowid` -> `seq`."""
    counter = iter(range(1, 10_000))
    sql = re.sub(r"\?", lambda _: f"${next(counter)}", sql)
    return re.sub(r"\browid\b", "seq", sql)


class _Cursor:
    def __init__(self, run: Any, cursor: Any) -> None:
        self._run = run
        self._cursor = cursor

    def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._run(self._cursor.fetch(size))]

    def fetchone(self) -> tuple[Any, ...] | None:
        rows = self.fetchmany(1)
        return rows[0] if rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        while batch := self.fetchmany(10_000):
            rows.extend(batch)
        return rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.fetchall())


# Rows of an exported table inserted since the last export: `xid` in [that export's horizon,
# this one's); rows written before schema version 6 have xid 0 and are new above the last
# exported seq (they were written under a lock that made seq follow the commit order).
NEW_ROWS = "{t}xid >= ? AND {t}xid < ? AND ({t}xid > 0 OR {t}rowid > ?)"


class PostgresSnapshot:
    """`execute(sql, params)` -> a cursor, inside one snapshot; `xid_horizon` is the oldest
    transaction that snapshot saw running."""

    dialect = "postgres"

    def __init__(self, loop: asyncio.AbstractEventLoop, connection: asyncpg.Connection) -> None:
        self._loop = loop
        self._connection = connection
        self.xid_horizon = int(
            self._run(connection.fetchval("SELECT txid_snapshot_xmin(txid_current_snapshot())"))
        )

    def _run(self, awaitable: Any) -> Any:
        return self._loop.run_until_complete(awaitable)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        async def open_cursor() -> Any:
            return await self._connection.cursor(to_postgres(sql), *params)

        return _Cursor(self._run, self._run(open_cursor()))


@contextmanager
def postgres_snapshot(dsn: str, password: str | None = None) -> Iterator[PostgresSnapshot]:
    where = redacted(dsn)
    loop = asyncio.new_event_loop()
    connection: asyncpg.Connection | None = None
    try:
        try:
            connection = loop.run_until_complete(
                asyncpg.connect(dsn, password=password, timeout=CONNECT_TIMEOUT_S)
            )
        except (asyncpg.InvalidPasswordError, asyncpg.InvalidAuthorizationSpecificationError) as error:
            raise ExportError(f"{where}: authentication failed: {error}") from None
        except asyncpg.InvalidCatalogNameError as error:
            raise ExportError(f"{where}: {error}") from None
        except CONNECTION_ERRORS as error:
            raise ExportError(f"{where}: cannot connect: {error!r}") from None
        except ValueError as error:
            raise ExportError(f"{where}: bad DSN: {error}") from None
        transaction = connection.transaction(isolation="repeatable_read", readonly=True)
        try:
            loop.run_until_complete(transaction.start())
            _check_schema(loop, connection, where)
            yield PostgresSnapshot(loop, connection)
            loop.run_until_complete(transaction.commit())
        except asyncpg.PostgresError as error:
            raise ExportError(f"{where}: cannot read the store: {error}") from None
        except CONNECTION_ERRORS as error:
            raise ExportError(f"{where}: connection lost: {error!r}") from None
    finally:
        if connection is not None:
            loop.run_until_complete(connection.close())
        loop.close()


def _check_schema(loop: asyncio.AbstractEventLoop, connection: asyncpg.Connection, where: str) -> None:
    tables = {
        row["table_name"]
        for row in loop.run_until_complete(
            connection.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
            )
        )
    }
    version = 0
    if "levelzero_schema" in tables:
        version = loop.run_until_complete(
            connection.fetchval("SELECT COALESCE(MAX(version), 0) FROM levelzero_schema")
        )
    if version != SCHEMA_VERSION or not tables >= SCHEMA_TABLES:
        missing = sorted(SCHEMA_TABLES - tables)
        raise ExportError(
            f"{where} is not a levelzero store of schema version {SCHEMA_VERSION} (it has "
            f"schema version {version}"
            + (f" and lacks tables {', '.join(missing)}" if missing else "")
            + "); export it with the levelzero version that wrote it"
        )
