"""A read the SQLite log store cannot make is the store's error, as a failed write is: SQLite's
own exception reached every caller as a bug (an HTTP 500 with a traceback, a Kafka request
failed and its connection closed), where a failing store is a 503 to retry."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from daemon_support import daemon_config
from test_sqlite_log import placeholder_record

from levelzero.core.errors import CorruptData, ShuttingDown, StorageError
from levelzero.daemon.service import Daemon
from levelzero.storage.sqlite.store import SqliteLogStore


def _failing_reads(store: SqliteLogStore, error: Callable[[], BaseException]) -> None:
    """The store's read connection fails each statement as SQLite would."""

    async def execute_fetchall(sql: str, parameters: Any = ()) -> Any:
        raise error()

    store._reader._connection.execute_fetchall = execute_fetchall  # type: ignore[method-assign]


def _sqlite_error(kind: type[sqlite3.Error], message: str, code: int) -> Callable[[], sqlite3.Error]:
    def make() -> sqlite3.Error:
        error = kind(message)
        error.sqlite_errorcode = code  # type: ignore[attr-defined]  # as SQLite sets it (extended)
        return error

    return make


_corrupt = _sqlite_error(sqlite3.DatabaseError, "database disk image is malformed", 11)  # SQLITE_CORRUPT


async def test_a_failed_read_is_a_storage_error_naming_the_file(tmp_path: Path) -> None:
    db = tmp_path / "levelzero.db"
    async with await SqliteLogStore.open(str(db)) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
        assert len(await store.read_placeholders(p.pid, 0, 10)) == 1
        _failing_reads(store, lambda: sqlite3.OperationalError("disk I/O error"))
        for read in (
            lambda: store.read_placeholders(p.pid, 0, 10),
            lambda: store.read_log(p.pid, 0),
            lambda: store.l1_list(p.pid),
            lambda: store.committed_offsets("g"),
            lambda: store.list_partitions(),
        ):
            with pytest.raises(StorageError, match=f"^{db}: a read failed: disk I/O error$"):
                await read()
        _failing_reads(store, _corrupt)
        with pytest.raises(CorruptData, match="a read found the log store damaged: database disk image"):
            await store.read_placeholders(p.pid, 0, 10)
        # An extended code: SQLITE_CORRUPT_INDEX (779) is corruption as well.
        _failing_reads(store, _sqlite_error(sqlite3.DatabaseError, "database disk image is malformed", 779))
        with pytest.raises(CorruptData):
            await store.read_placeholders(p.pid, 0, 10)
        # SQLITE_ERROR: the statement's own (no such table): a bug, not a 503 to retry for ever.
        _failing_reads(store, _sqlite_error(sqlite3.OperationalError, "no such table: nowhere", 1))
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await store.read_placeholders(p.pid, 0, 10)
        _failing_reads(store, lambda: sqlite3.ProgrammingError("Incorrect number of bindings supplied"))
        with pytest.raises(sqlite3.ProgrammingError):  # the statement's fault: a bug, loudly
            await store.read_placeholders(p.pid, 0, 10)
        _failing_reads(store, lambda: ValueError("Connection closed"))
        with pytest.raises(ShuttingDown):
            await store.read_placeholders(p.pid, 0, 10)
        await store.append(p.pid, 0, [placeholder_record(1, 0, 1)])  # writes go on


async def test_a_fetch_whose_reads_fail_is_a_503_to_retry_not_a_500(tmp_path: Path) -> None:
    daemon = Daemon(daemon_config(tmp_path, reconciler__enabled=False))
    async with anyio.create_task_group() as tg:
        await tg.start(daemon.run)
        assert daemon.url is not None and daemon.node is not None
        async with httpx.AsyncClient(base_url=daemon.url, trust_env=False) as http:
            assert (await http.post("/v1/topics", json={"name": "t", "partitions": 1})).status_code == 201
            records = {"records": [{"value": "eA=="}]}
            produced = await http.post("/v1/topics/t/partitions/0/records", json=records)
            assert produced.status_code == 200, produced.text
            store = daemon.node.log_store.inner  # type: ignore[attr-defined]
            _failing_reads(store, lambda: sqlite3.OperationalError("disk I/O error"))
            fetched = await http.get("/v1/topics/t/partitions/0/records", params={"offset": 0})
            assert fetched.status_code == 503, fetched.text
            assert fetched.json()["error"] == "storage_error"
            assert "a read failed: disk I/O error" in fetched.json()["message"]
        daemon.request_stop("test")
