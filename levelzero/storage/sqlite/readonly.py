"""Opening a log store read-only (`levelzero export`, `levelzero backup`), also where its
directory is not writable.

`mode=ro` never writes the database, but a reader of a WAL-mode database (the log store is one)
goes through the WAL index, `<db>-shm`, which SQLite creates beside the file. In a read-only
directory (a read-only file system, or one this user may not write) that fails with SQLite's
"unable to open database file". Two cases:

- *A read-only file system and no write-ahead log to replay* (no `<db>-wal`, or an empty one:
  the daemon is stopped and checkpointed). Nothing can change the file, so it is read as
  `immutable` (no WAL index, no locks): exactly what is on disk.
- *Anything else* (a WAL to replay, or a directory only another user, the daemon's, may write:
  that daemon may be running or start, so `immutable` would be unsound) is refused, saying why.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any


class ReadOnlyOpenError(Exception):
    """Why the store cannot be opened read-only: one line for the operator."""


def _file_system_read_only(directory: str) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _writable(directory: str) -> bool:
    return os.access(directory, os.W_OK)


def _wal_pending(db_path: str) -> bool:
    try:
        return os.path.getsize(db_path + "-wal") > 0
    except OSError:
        return False


def connect_read_only(db_path: str | Path, **kwargs: Any) -> sqlite3.Connection:
    """A `mode=ro` connection to `db_path`; ReadOnlyOpenError when SQLite cannot open the file,
    saying why (what else is wrong with it, the caller's first read reports)."""
    path = os.path.abspath(db_path)
    uri = Path(path).as_uri() + "?mode=ro"
    connection = sqlite3.connect(uri, uri=True, **kwargs)
    try:
        connection.execute("SELECT count(*) FROM sqlite_master").fetchall()  # SQLite opens lazily
        return connection
    except sqlite3.Error as exc:
        if "unable to open" not in str(exc):
            return connection  # not a database, a newer schema...: the caller's reads say so
        connection.close()
        error = exc
    directory = os.path.dirname(path)
    if not os.access(path, os.R_OK):
        raise ReadOnlyOpenError(f"cannot open {path}: permission denied (reading it needs read access)")
    if _file_system_read_only(directory):
        if _wal_pending(path):
            raise ReadOnlyOpenError(
                f"cannot open {path}: it is on a read-only file system and has a write-ahead log "
                f"({path}-wal) that SQLite reads only through {path}-shm, which it cannot create "
                "there; copy the data directory to a writable place (or start and stop the daemon "
                "on it once, which checkpoints the log)"
            )
        # Nothing can change it and no log is pending: `immutable` reads exactly what is there.
        connection = sqlite3.connect(uri + "&immutable=1", uri=True, **kwargs)
        connection.execute("SELECT count(*) FROM sqlite_master").fetchall()
        return connection
    if not _writable(directory):
        raise ReadOnlyOpenError(
            f"cannot open {path} read-only: SQLite reads it through {path}-shm (its write-ahead "
            f"log index), which it must create beside it, and {directory} is not writable by this "
            "user (permission denied); run as the user that owns it (the daemon's), or copy the "
            "data directory to a writable place"
        )
    raise ReadOnlyOpenError(f"cannot open {path}: {error}")
