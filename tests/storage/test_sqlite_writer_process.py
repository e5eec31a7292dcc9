"""The log store's writer process: staged batches are committed there, in order; its death or
a failed commit stops the store's writes with a clear error; it outlives a killed store only
as long as its transaction, and signals meant for the daemon do not cut it short."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import anyio
import pytest
from test_sqlite_log import drop_fence_events, placeholder_record, storage_error_into

from levelzero.core.errors import ShuttingDown, StorageError, StoreNeedsRestart
from levelzero.storage.protocols import FenceEventRow
from levelzero.storage.sqlite import SqliteLogStore, lockfile
from levelzero.storage.sqlite import store as sqlite_store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "log.db"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_writes_go_through_a_separate_process_that_ends_with_the_store(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        pid = store.writer_pid
        assert pid != os.getpid() and _alive(pid)
        (p,) = await store.create_topic("t", 1, 1, 0.0)  # a `run` job: on the store's connection
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])  # staged: in the writer process
        assert store.statistics().commits >= 2
    assert not _alive(pid)
    async with await SqliteLogStore.open(db) as store:
        assert await store.read_log(p.pid, 0) == [placeholder_record(0, 0, 0)]


async def test_a_waiting_crowd_is_sent_as_two_batches_so_commits_overlap(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        rows = await store.create_topic("t", 64, 1, 0.0)
        before = store.statistics()
        async with anyio.create_task_group() as tg:
            for row in rows:
                tg.start_soon(store.append, row.pid, 0, [placeholder_record(0, 0, 0)])
        after = store.statistics()
        assert after.commits - before.commits == 2
        assert after.largest_batch_records == 32
        for row in rows:
            assert await store.read_log(row.pid, 0) == [placeholder_record(0, 0, 0)]


async def test_few_waiting_jobs_stay_one_batch(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        rows = await store.create_topic("t", sqlite_store.SPLIT_JOBS_MIN - 1, 1, 0.0)
        before = store.statistics().commits
        async with anyio.create_task_group() as tg:
            for row in rows:
                tg.start_soon(store.append, row.pid, 0, [placeholder_record(0, 0, 0)])
        assert store.statistics().commits - before == 1


async def test_writer_process_death_refuses_writes_with_a_clear_error(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
        os.kill(store.writer_pid, signal.SIGKILL)
        with pytest.raises(StorageError, match="writer process ended"):
            await store.append(p.pid, 0, [placeholder_record(1, 0, 1)])
        assert store.statistics().failed
        with pytest.raises(StoreNeedsRestart, match="until the daemon restarts"):
            await store.append(p.pid, 0, [placeholder_record(1, 0, 1)])
        with pytest.raises(StoreNeedsRestart):  # a write that changes nothing too: waiting fixes nothing
            await store.probe_write()
        assert await store.read_log(p.pid, 0) == [placeholder_record(0, 0, 0)]  # reads still work
    async with await SqliteLogStore.open(db) as store:  # reopening recovers
        await store.append(p.pid, 0, [placeholder_record(1, 0, 1)])
        assert len(await store.read_log(p.pid, 0)) == 2


async def test_signals_for_the_daemon_do_not_stop_the_writer_process(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        for signum in (signal.SIGTERM, signal.SIGINT):
            os.kill(store.writer_pid, signum)
        await anyio.sleep(0.2)  # a signal that killed it would have by now
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
        assert not store.statistics().failed


async def test_a_lock_left_by_a_dead_process_is_waited_for_a_live_one_refused(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer process keeps the lock while it finishes; the pid in the lock file tells a
    store that is gone (wait) from one that runs (refuse)."""
    monkeypatch.setattr(lockfile, "WRITER_EXIT_TIMEOUT_S", 0.3)
    async with await SqliteLogStore.open(db):
        started = anyio.current_time()
        with pytest.raises(StorageError, match=f"held by process {os.getpid()}"):
            await SqliteLogStore.open(db)  # a live holder: refused at once
        assert anyio.current_time() - started < 0.3
        Path(str(db) + ".lock").write_text("999999999\n")  # as if the holder had died
        started = anyio.current_time()
        with pytest.raises(StorageError, match="already open"):
            await SqliteLogStore.open(db)  # waited, and the lock stayed held
        assert anyio.current_time() - started >= 0.3


def _log_rows(db: Path) -> list[tuple[int, int]]:
    with sqlite3.connect(db) as connection:
        return connection.execute("SELECT pid, log_offset FROM log ORDER BY pid, log_offset").fetchall()


async def test_a_failed_commit_stops_the_batch_sent_behind_it(db: Path) -> None:
    """The batch behind a failed one was staged on its cursors: committing it would leave a gap
    in a log. Here the first of two batches fails (its fence events' table is gone)."""
    async with await SqliteLogStore.open(db) as store:
        rows = await store.create_topic("t", 63, 1, 0.0)
        for row in rows:
            await store.append(row.pid, 0, [placeholder_record(0, 0, 0)])
        drop_fence_events(db)
        errors: list[BaseException] = []

        fence = FenceEventRow(1.0, rows[0].pid, 0, 1, "admitted", 1, 1)
        before = store.statistics()
        async with anyio.create_task_group() as tg:  # 64 jobs queued: sent as 32 + 32
            tg.start_soon(storage_error_into, errors, lambda: store.record_fence_events([fence]))
            for row in rows:
                tg.start_soon(
                    storage_error_into,
                    errors,
                    lambda pid=row.pid: store.append(pid, 0, [placeholder_record(1, 0, 1)]),
                )
        assert store.statistics().batches - before.batches == 2
        assert len(errors) == 64 and all("refuses writes" in str(e) for e in errors)
    assert _log_rows(db) == [(row.pid, 0) for row in rows]  # neither batch is in the file


async def test_cancelling_the_store_with_batches_on_their_way_answers_them_truly(
    db: Path,
) -> None:
    """A sent batch may commit whatever happens to the store's task group: its callers are
    answered with what happened, and the store still closes."""
    acknowledged: list[int] = []
    refused: list[int] = []

    async def append(store: SqliteLogStore, pid: int) -> None:
        try:
            await store.append(pid, 0, [placeholder_record(0, 0, 0)])
            acknowledged.append(pid)
        except (StorageError, ShuttingDown):
            refused.append(pid)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as callers, anyio.create_task_group() as store_group:
            store = await SqliteLogStore.open_in(store_group, db)
            rows = await store.create_topic("t", 200, 1, 0.0)
            before = store.statistics()
            for row in rows:
                callers.start_soon(append, store, row.pid)
            while store.statistics().batches == before.batches:
                await anyio.sleep(0)  # until the first batch is on its way
            store_group.cancel_scope.cancel()
        await store.aclose()
    assert len(acknowledged) + len(refused) == 200
    assert acknowledged, "the batch on its way was answered as failed"
    assert sorted(pid for pid, _ in _log_rows(db)) == sorted(acknowledged)


async def test_a_batch_with_run_jobs_waits_for_the_batches_sent_before_it(db: Path) -> None:
    """`run` jobs execute on the store's own connection only after the writer process answered
    every batch sent: a batch staged on a failed one's cursors must never commit. The first
    batch fails (its fence events' table is gone); the second holds the next appends of the
    same partitions and a `run` job."""
    async with await SqliteLogStore.open(db) as store:
        rows = await store.create_topic("t", 31, 1, 0.0)
        drop_fence_events(db)
        fence = FenceEventRow(1.0, rows[0].pid, 0, 1, "admitted", 1, 1)
        errors: list[BaseException] = []

        before = store.statistics()
        async with anyio.create_task_group() as tg:  # 64 jobs: 32 sent, then 32 run here
            tg.start_soon(storage_error_into, errors, lambda: store.record_fence_events([fence]))
            for offset in (0, 1):
                for row in rows:
                    tg.start_soon(
                        storage_error_into,
                        errors,
                        lambda pid=row.pid, o=offset: store.append(pid, 0, [placeholder_record(o, 0, o)]),
                    )
            tg.start_soon(storage_error_into, errors, lambda: store.set_cluster_epoch(2))
        assert store.statistics().batches - before.batches == 2
        assert len(errors) == 64
    assert _log_rows(db) == []  # no offset 1 without its offset 0
