"""The export's and the data source's view of a SQLite control plane (`levelzero.db`): one
read-only connection inside one read transaction, a consistent snapshot in WAL mode that the
daemon's writer neither blocks nor waits for, after checking that the file is a levelzero store
of a schema this levelzero reads (`postgres_source.py` is the same for PostgreSQL).

Every reader of the file goes through `sqlite_snapshot` (the table export, `--records`, the
Spark data source): a damaged file, a foreign one, or one that cannot be opened read-only is one
ExportError line naming it, whichever of them meets it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from levelzero.storage.sqlite.readonly import ReadOnlyOpenError, connect_read_only
from levelzero.storage.sqlite.schema import (
    OLDEST_SCHEMA_VERSION,
    SCHEMA_TABLES,
    SCHEMA_VERSION,
    read_version,
)

from .errors import ExportError

BUSY_TIMEOUT_MS = 10_000


@contextmanager
def sqlite_snapshot(db_path: str) -> Iterator[sqlite3.Connection]:
    """A read-only connection inside one read transaction, after checking the schema."""
    try:
        connection = connect_read_only(db_path, isolation_level=None, check_same_thread=False)
    except ReadOnlyOpenError as error:
        raise ExportError(str(error)) from None
    except sqlite3.Error as error:
        raise ExportError(f"{db_path}: cannot open read-only: {error}") from None
    try:
        connection.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        connection.execute("BEGIN")  # deferred: the snapshot starts at the first read below
        check_schema(connection, db_path)
        yield connection
        connection.execute("COMMIT")
    except sqlite3.DatabaseError as error:
        raise ExportError(f"{db_path}: cannot read the store: {error}") from None
    finally:
        connection.close()


def check_schema(connection: sqlite3.Connection, db_path: str) -> None:
    """ExportError unless `connection` is a levelzero store of a schema this levelzero reads."""
    try:
        version, tables = read_version(connection)
    except sqlite3.DatabaseError as error:
        raise ExportError(f"{db_path} is not a levelzero store: {error}") from None
    if not OLDEST_SCHEMA_VERSION <= version <= SCHEMA_VERSION or not tables >= SCHEMA_TABLES:
        missing = sorted(SCHEMA_TABLES - tables)
        raise ExportError(
            f"{db_path} is not a levelzero store of schema version {OLDEST_SCHEMA_VERSION} to "
            f"{SCHEMA_VERSION} (it has "
            f"schema version {version}"
            + (f" and lacks tables {', '.join(missing)}" if missing else "")
            + "); export it with the levelzero version that wrote it"
        )
