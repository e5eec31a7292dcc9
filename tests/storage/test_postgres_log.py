"""PostgreSQL-specific behaviour of the log store: fencing enforced by the database between
separate connections, migrations under an advisory lock, connection errors, and a server
restart under load."""

from __future__ import annotations

import contextlib
import sys
import urllib.parse
from typing import Any
from pathlib import Path

import anyio
import asyncpg
import msgspec
import pytest

from levelzero.core.entries import AdvanceReconciledOffset, LogRecord
from levelzero.core.errors import InvariantViolation, LogMovedOn, NotLeader, StorageError, StoreRefused
from levelzero.storage.log_rules import LOG_ROW_COLUMNS, log_row
from levelzero.storage.postgres import base as store_module
from levelzero.storage.postgres.schema import SCHEMA_VERSION
from levelzero.storage.postgres.store import PostgresLogStore, redacted
from levelzero.storage.protocols import Append, FenceEventRow, L0ObjectRow, L1Row, OffsetRow, StateSampleRow
from levelzero.testing.postgres import ServerUnavailable, start_throwaway

sys.path.insert(0, str(Path(__file__).parent))
from test_sqlite_log import placeholder_record

RACE_ROUNDS = 30


async def test_two_connections_racing_for_one_offset_never_both_append(postgres_dsn: str) -> None:
    """Two stores (two pools, as two processes would have) append to the same partition with
    the same term at the same offset, round after round: exactly one wins each round, the loser
    is refused, and the log holds the winner's record."""
    async with (
        await PostgresLogStore.open(postgres_dsn) as one,
        await PostgresLogStore.open(postgres_dsn) as two,
    ):
        (p,) = await one.create_topic("t", 1, 1, 0.0)
        await one.begin_term(p.pid, 0, 0)
        winners: list[str] = []

        async def attempt(
            outcomes: dict[str, BaseException | None], name: str, store: PostgresLogStore, epoch: int, at: int
        ) -> None:
            try:
                await store.append(p.pid, 1, [placeholder_record(at, 1, at - 1, epoch=epoch)])
                outcomes[name] = None
            except InvariantViolation as error:
                outcomes[name] = error

        for offset in range(1, RACE_ROUNDS + 1):
            outcomes: dict[str, BaseException | None] = {}
            async with anyio.create_task_group() as tg:
                tg.start_soon(attempt, outcomes, "one", one, 1, offset)
                tg.start_soon(attempt, outcomes, "two", two, 2, offset)
            won = [name for name, outcome in outcomes.items() if outcome is None]
            assert len(won) == 1, outcomes
            lost = outcomes["two" if won == ["one"] else "one"]
            assert f"the log continues at {offset + 1}" in str(lost)
            winners.append(won[0])
        log = await two.read_log(p.pid, 1)
        assert [r.log_offset for r in log] == list(range(1, RACE_ROUNDS + 1))
        assert [r.epoch for r in log] == [1 if w == "one" else 2 for w in winners]


async def test_a_new_term_from_another_connection_fences_the_old_leader(postgres_dsn: str) -> None:
    async with (
        await PostgresLogStore.open(postgres_dsn) as old,
        await PostgresLogStore.open(postgres_dsn) as new,
    ):
        (p,) = await old.create_topic("t", 1, 1, 0.0)
        await old.begin_term(p.pid, 0, 0)
        await old.append(p.pid, 1, [placeholder_record(1, 1, 0)])
        await new.begin_term(p.pid, 2, 1)  # the new leader, on its own connection
        with pytest.raises(NotLeader) as refused:
            await old.append(p.pid, 1, [placeholder_record(3, 1, 1)])
        assert (refused.value.expected_term, refused.value.current_term) == (1, 2)
        with pytest.raises(LogMovedOn, match="continues at 3"):
            await old.begin_term(p.pid, 2, 1)  # a stale leader cannot start a term at a taken offset
        assert [r.term for r in await new.read_log(p.pid, 0)] == [1, 1, 2]


async def test_a_paused_nodes_open_transaction_stops_blocking_its_successor(
    postgres_dsn: str,
) -> None:
    """A node stopped between a batch's statements and its COMMIT holds its partition's row
    lock; the server ends its session after the idle-in-transaction timeout (the daemon's lease
    TTL), so the node that takes the partition over writes instead of waiting until it wakes."""
    async with (
        await PostgresLogStore.open(postgres_dsn, idle_in_transaction_timeout_s=1.0) as paused,
        await PostgresLogStore.open(postgres_dsn) as other,
    ):
        (p,) = await paused.create_topic("t", 1, 1, 0.0)
        connection = await paused._pool.acquire()
        try:
            transaction = connection.transaction()
            await transaction.start()
            await connection.execute("SELECT term FROM partitions WHERE pid = $1 FOR UPDATE", p.pid)
            # ... and the node stops here.
            with anyio.fail_after(20):
                await other.append(p.pid, 0, [placeholder_record(0, 0, 0)])
            assert [r.log_offset for r in await other.read_log(p.pid, 0)] == [0]
            with pytest.raises(Exception):  # noqa: B017, PT011 (whichever the driver raises)
                await connection.execute("SELECT 1")  # when it wakes: its session is gone
        finally:  # the dead connection goes (the pool may have taken it back already)
            with contextlib.suppress(Exception):
                connection.terminate()
            with contextlib.suppress(Exception):
                await paused._pool.release(connection)


async def test_a_paused_nodes_open_write_batch_blocks_no_other_partition(postgres_dsn: str) -> None:
    """A node stopped inside a write batch (its partition's row locked, a placeholder, an L0
    catalog row, a fence event and a state sample inserted, no COMMIT) holds back nothing of
    another node's partitions: the other node's batch of every kind commits while the paused
    transaction is still open (no cluster-wide lock), and the paused one still commits after."""
    async with (
        await PostgresLogStore.open(postgres_dsn, idle_in_transaction_timeout_s=600.0) as paused,
        await PostgresLogStore.open(postgres_dsn) as other,
    ):
        mine, theirs = await paused.create_topic("t", 2, 1, 0.0)
        await paused.begin_term(mine.pid, 0, 0)
        await other.begin_term(theirs.pid, 0, 0)
        paused_jobs = (
            paused._append_job(mine.pid, 1, [placeholder_record(1, 1, 0)]),
            *(
                store_module._Job(weight=1, table=table, rows=rows)
                for table, rows in (
                    ("l0_objects", [msgspec.structs.astuple(L0ObjectRow("paused-key", 1, 10, 1.0, 1))]),
                    (
                        "fence_events",
                        [msgspec.structs.astuple(FenceEventRow(1.0, mine.pid, 1, 1, "admitted", 1, 1))],
                    ),
                    (
                        "state_samples",
                        [msgspec.structs.astuple(StateSampleRow(1.0, mine.pid, 1, 1, 1, 1, 0, -1, 1, 0))],
                    ),
                )
            ),
        )
        connection = await paused._pool.acquire()
        try:
            transaction = connection.transaction()
            await transaction.start()
            outcomes, _ = await paused._run_batch(connection, list(paused_jobs))
            assert [error for _, error in outcomes] == [None] * 4
            # ... and the node stops here, its batch uncommitted. The other node's writes:
            with anyio.fail_after(30):  # a bound only: before the fix they waited for the COMMIT
                await other.append(theirs.pid, 1, [placeholder_record(1, 1, 0)])
                await other.record_l0_object(L0ObjectRow("other-key", 1, 10, 2.0, 1))
                await other.l1_insert(L1Row("l1-key", theirs.pid, 0, 0, 1, 1, 10, "COPY_STARTED", 2.0, 2.0))
                await other.record_fence_events([FenceEventRow(2.0, theirs.pid, 1, 1, "admitted", 1, 1)])
                await other.record_state_samples([StateSampleRow(2.0, theirs.pid, 1, 1, 1, 1, 0, -1, 1, 0)])
            assert await connection.fetchval("SELECT count(*) FROM l0_objects") == 2  # still open
            await transaction.commit()
        finally:
            await paused._pool.release(connection)
        keys = [row.key for row in await other.l0_live_objects(10)]
        assert keys == ["other-key", "paused-key"]
        assert [r.log_offset for r in await other.read_log(mine.pid, 0)] == [0, 1]
        assert [r.log_offset for r in await other.read_log(theirs.pid, 0)] == [0, 1]


async def test_append_many_tells_each_partition_at_its_own_batchs_commit(postgres_dsn: str) -> None:
    """A crowd of appends goes out as two batches on the two writers; the partitions of the
    batch that commits are told then, while the other batch waits (here on a row lock another
    session holds), and the call returns when both are settled."""
    async with await PostgresLogStore.open(postgres_dsn) as store:
        count = 2 * store_module.SPLIT_JOBS_MIN
        rows = await store.create_topic("t", count, 1, 0.0)
        for row in rows:
            await store.begin_term(row.pid, 0, 0)
        blocker = await asyncpg.connect(postgres_dsn)
        try:
            transaction = blocker.transaction()
            await transaction.start()
            await blocker.execute("SELECT 1 FROM partitions WHERE pid = $1 FOR UPDATE", rows[-1].pid)
            told: list[int] = []
            answered: list[list[NotLeader | None]] = []
            before = store.statistics().commits

            async def call() -> None:
                answered.append(
                    await store.append_many(
                        [Append(row.pid, 1, [placeholder_record(1, 1, 0)]) for row in rows],
                        lambda index, refusal: told.append(index),
                    )
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                for _ in range(2_000):  # bounded: the first batch's commit needs no lock
                    if store.statistics().commits > before:
                        break
                    await anyio.sleep(0.01)
                assert store.statistics().commits == before + 1
                assert sorted(told) == list(range(count // 2))  # the first half, at its COMMIT
                assert not answered
                await transaction.rollback()
        finally:
            await blocker.close()
        assert answered == [[None] * count]
        assert sorted(told) == list(range(count))
        for row in rows:
            assert [r.log_offset for r in await store.read_log(row.pid, 0)] == [0, 1]


def test_the_second_half_of_a_crowd_goes_half_a_statement_later_and_never_long() -> None:
    assert store_module.stagger_s(0.0) == 0.0  # no statement yet: at once
    assert store_module.stagger_s(0.002) == pytest.approx(0.001)
    assert store_module.stagger_s(5.0) == store_module.STAGGER_MAX_S  # a slow statement or two


async def _crowd_store(dsn: str, monkeypatch: pytest.MonkeyPatch, stagger: float) -> Any:
    """An open store whose writers believe a statement takes 2 * `stagger` s (the bound
    lifted to match), and that records when each batch's statement starts."""
    monkeypatch.setattr(store_module, "STAGGER_MAX_S", stagger)
    store = await PostgresLogStore.open(dsn)
    store._statement_s = 2 * stagger
    starts: list[tuple[float, int]] = []
    run_batch = store._run_batch

    async def timed(connection: Any, jobs: Any, **kwargs: Any) -> Any:
        starts.append((anyio.current_time(), len(jobs)))
        result = await run_batch(connection, jobs, **kwargs)
        store._statement_s = 2 * stagger  # the running mean stays put
        return result

    monkeypatch.setattr(store, "_run_batch", timed)
    store.batch_starts = starts
    return store


async def _crowd_topic(store: Any, partitions: int) -> list[Any]:
    """`partitions` partitions in their first term, and no batch start kept from setting up."""
    rows = await store.create_topic("t", partitions, 1, 0.0)
    for row in rows:
        await store.begin_term(row.pid, 0, 0)
    store.batch_starts.clear()
    return rows


async def _crowd_call_started(
    tg: anyio.abc.TaskGroup, store: Any, rows: list[Any], answered: list[Any], batches: int
) -> None:
    """An `append_many` of one record to each of `rows` started in `tg` (its answer into
    `answered`); returns once `batches` of its batches are on their way (bounded)."""

    async def call() -> None:
        appends = [Append(row.pid, 1, [placeholder_record(1, 1, 0)]) for row in rows]
        answered.append(await store.append_many(appends))

    tg.start_soon(call)
    for _ in range(2_000):
        if len(store.batch_starts) >= batches:
            return
        await anyio.sleep(0.01)


@contextlib.asynccontextmanager
async def _row_locked(dsn: str, pid: int) -> Any:
    """Another session holds partition `pid`'s row lock; yields its transaction (roll it back
    to let the batch holding that partition commit)."""
    blocker = await asyncpg.connect(dsn)
    try:
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute("SELECT 1 FROM partitions WHERE pid = $1 FOR UPDATE", pid)
        yield transaction
    finally:
        await blocker.close()


async def test_a_crowd_with_nothing_on_its_way_goes_as_two_batches_half_a_statement_apart(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent together, the halves are answered together and their callers come back together,
    for ever in lock-step with both connections idle through every turnaround: the second
    half goes on the other connection half a statement after the first (here 0.3 s, while the
    first waits on a row lock another session holds: a lower bound, which load cannot make
    pass wrongly), and every append is answered once."""
    stagger = 0.3
    store = await _crowd_store(postgres_dsn, monkeypatch, stagger)
    async with store:
        count = 2 * store_module.SPLIT_JOBS_MIN
        rows = await _crowd_topic(store, count)
        async with _row_locked(postgres_dsn, rows[0].pid) as transaction:
            answered: list[list[NotLeader | None]] = []
            async with anyio.create_task_group() as tg:
                await _crowd_call_started(tg, store, rows, answered, 2)  # both halves
                (first, first_jobs), (second, second_jobs) = store.batch_starts
                assert (first_jobs, second_jobs) == (count // 2, count // 2)
                assert second - first >= stagger * 0.99
                assert not answered  # the first half still waits for the lock
                await transaction.rollback()
        assert answered == [[None] * count]
        assert len(store.batch_starts) == 2
        for row in rows:
            assert [r.log_offset for r in await store.read_log(row.pid, 0)] == [0, 1]


async def test_a_call_queued_during_the_stagger_is_taken_at_once(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stagger holds back only the crowd's second half, and only while nothing else comes:
    a call queued meanwhile wakes the idle writer, which takes it with the rest (the stagger
    is an hour here, and the first half waits on a row lock: the call returning shows it)."""
    store = await _crowd_store(postgres_dsn, monkeypatch, 3600.0)
    async with store:
        count = 2 * store_module.SPLIT_JOBS_MIN
        rows = await _crowd_topic(store, count + 1)
        crowd, late = rows[:count], rows[count]
        async with _row_locked(postgres_dsn, crowd[0].pid) as transaction:
            answered: list[list[NotLeader | None]] = []
            async with anyio.create_task_group() as tg:
                await _crowd_call_started(tg, store, crowd, answered, 1)  # the first half
                with anyio.fail_after(60):  # a bound only: without the wake-up, the hour
                    await store.append(late.pid, 1, [placeholder_record(1, 1, 0)])
                assert [jobs for _, jobs in store.batch_starts] == [count // 2, count // 2 + 1]
                assert not answered  # the first half still waits for the lock
                await transaction.rollback()
        assert answered == [[None] * count]
        for row in rows:
            assert [r.log_offset for r in await store.read_log(row.pid, 0)] == [0, 1]


async def test_nodes_starting_together_migrate_once(postgres_dsn: str) -> None:
    async def open_and_close() -> None:
        async with await PostgresLogStore.open(postgres_dsn):
            pass

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(open_and_close)
    connection = await asyncpg.connect(postgres_dsn)
    try:
        versions = [
            r["version"]
            for r in await connection.fetch("SELECT version FROM levelzero_schema ORDER BY version")
        ]
    finally:
        await connection.close()
    assert versions == list(range(1, SCHEMA_VERSION + 1))


async def test_a_database_of_an_older_version_is_migrated_forward(postgres_dsn: str) -> None:
    """A database left at version 1 (before consumer offsets and producer batches) gets every
    later migration at open, once, and keeps its data."""
    async with await PostgresLogStore.open(postgres_dsn) as store:
        await store.create_topic("t", 2, 1, 0.0)
    connection = await asyncpg.connect(postgres_dsn)
    try:
        for table in (
            "consumer_offsets",
            "producer_batches",
            "partition_watermarks",
            "partition_leases",
            "cluster_nodes",
            "cluster_identity",
            "topic_configs",
            "deleted_partitions",
            "transactions",
            "txn_ranges",
            "cleaner_offsets",
            "l1_compacted",
            "group_metadata",
        ):
            await connection.execute(f"DROP TABLE {table}")
        for table in ("l0_objects", "l1_objects", "fence_events", "state_samples"):
            await connection.execute(f"ALTER TABLE {table} DROP COLUMN xid")
        await connection.execute("ALTER TABLE l1_objects DROP COLUMN max_timestamp_ms")
        await connection.execute(
            "INSERT INTO l0_objects (key, epoch, size, created_at, extents) VALUES ('old', 1, 1, 0, 1)"
        )
        await connection.execute(
            "INSERT INTO l1_objects (key, pid, base_offset, last_offset, last_log_offset, term, size,"
            " state, created_at, updated_at) VALUES ('old-l1', 1, 0, 9, 3, 1, 100, 'COPY_FINISHED', 0, 0)"
        )
        await connection.execute("DELETE FROM levelzero_schema WHERE version >= 2")
    finally:
        await connection.close()
    async with await PostgresLogStore.open(postgres_dsn) as store:
        await store.commit_offsets([OffsetRow("g", "t", 0, 7, "", 1.0, 3)])
        assert await store.committed_offsets("g") == [OffsetRow("g", "t", 0, 7, "", 1.0, 3)]
        await store.store_group_metadata("g", b"members", 1.0)  # migration 15's table
        assert await store.group_metadata("g") == b"members"
        assert len(await store.list_partitions()) == 2
        # An L1 row from before migration 11 has no largest timestamp: a lookup by time reads it.
        (old_l1,) = await store.l1_list(pid=1)
        assert (old_l1.key, old_l1.last_offset, old_l1.max_timestamp_ms) == ("old-l1", 9, None)
    connection = await asyncpg.connect(postgres_dsn)
    try:
        assert [
            r["version"]
            for r in await connection.fetch("SELECT version FROM levelzero_schema ORDER BY version")
        ] == list(range(1, SCHEMA_VERSION + 1))
        # A row from before version 6 keeps xid 0 (the export takes it by seq); new rows get theirs.
        await connection.execute(
            "INSERT INTO l0_objects (key, epoch, size, created_at, extents) VALUES ('new', 1, 1, 0, 1)"
        )
        xids = dict(await connection.fetch("SELECT key, xid FROM l0_objects"))
        assert xids["old"] == 0 and xids["new"] > 0, xids
    finally:
        await connection.close()


async def test_bad_password_wrong_database_and_no_server_are_clear_errors(
    postgres_dsn: str,
) -> None:
    secret = "wrong-secret-password"
    parts = urllib.parse.urlsplit(postgres_dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    bad = urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:{secret}@{host}"))
    with pytest.raises(StoreRefused, match="authentication failed") as refused:
        await PostgresLogStore.open(bad)
    assert secret not in str(refused.value)
    assert secret not in redacted(bad)
    missing = postgres_dsn.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(StoreRefused, match="no_such_database"):
        await PostgresLogStore.open(missing)
    with pytest.raises(StorageError, match="cannot connect"):
        await PostgresLogStore.open("postgresql://u:p@127.0.0.1:1/db", connect_timeout_s=2.0)


async def test_restart_under_load_loses_nothing_acknowledged_and_reconnects() -> None:
    """Appenders keep writing while the server restarts (fast shutdown); every append that
    returned is in the log afterwards, in order, and writing goes on without reopening."""
    try:
        server = await anyio.to_thread.run_sync(start_throwaway)
    except ServerUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    try:
        async with await PostgresLogStore.open(server.dsn(), reconnect_timeout_s=60.0) as store:
            rows = await store.create_topic("t", 8, 1, 0.0)
            acknowledged: dict[int, int] = {row.pid: 0 for row in rows}
            stop = anyio.Event()

            async def appender(pid: int) -> None:
                while not stop.is_set():
                    at = acknowledged[pid]
                    await store.append(pid, 0, [placeholder_record(at, 0, at)])
                    acknowledged[pid] = at + 1

            async with anyio.create_task_group() as tg:
                for row in rows:
                    tg.start_soon(appender, row.pid)
                while sum(acknowledged.values()) < 200:
                    await anyio.sleep(0.01)
                before = sum(acknowledged.values())
                await anyio.to_thread.run_sync(server.restart)
                while sum(acknowledged.values()) < before + 200:
                    await anyio.sleep(0.01)
                stop.set()
            assert store.available
            for row in rows:
                log = await store.read_log(row.pid, 0)
                assert [r.log_offset for r in log] == list(range(acknowledged[row.pid]))
    finally:
        await anyio.to_thread.run_sync(server.close)


async def test_an_append_batch_is_one_round_trip(postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of appends is its fence-and-append statement alone (a transaction by itself):
    no BEGIN and no COMMIT of their own on the wire."""
    sent: list[str] = []
    execute, fetch = asyncpg.Connection.execute, asyncpg.Connection.fetch

    async def logged_execute(self: asyncpg.Connection, query: str, *args: object, **kw: object) -> str:
        sent.append(query.split()[0])
        return await execute(self, query, *args, **kw)

    async def logged_fetch(self: asyncpg.Connection, query: str, *args: object, **kw: object) -> list[object]:
        sent.append("APPEND_BATCH" if query == store_module.APPEND_BATCH else query.split()[0])
        return await fetch(self, query, *args, **kw)

    async with await PostgresLogStore.open(postgres_dsn) as store:
        a, b = await store.create_topic("t", 2, 1, 0.0)
        await store.begin_term(a.pid, 0, 0)
        await store.begin_term(b.pid, 0, 0)
        monkeypatch.setattr(asyncpg.Connection, "execute", logged_execute)
        monkeypatch.setattr(asyncpg.Connection, "fetch", logged_fetch)
        refused = await store.append_many(
            [Append(a.pid, 1, [placeholder_record(1, 1, 0)]), Append(b.pid, 1, [placeholder_record(1, 1, 0)])]
        )
        assert refused == [None, None]
        assert sent == ["APPEND_BATCH"]
        monkeypatch.undo()
        assert [r.log_offset for r in await store.read_log(a.pid, 0)] == [0, 1]
        assert [r.log_offset for r in await store.read_log(b.pid, 0)] == [0, 1]


@pytest.mark.parametrize("committed", [True, False])
async def test_an_append_batch_whose_answer_is_lost_is_settled_once(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    """The connection fails after an append batch's statement committed (or before it ran):
    the batch runs again, the appends already in the log are accepted as they are, the others
    are appended; nothing is appended twice or refused for having been appended."""
    async with await PostgresLogStore.open(postgres_dsn) as store:
        a, b = await store.create_topic("t", 2, 1, 0.0)
        await store.begin_term(a.pid, 0, 0)
        await store.begin_term(b.pid, 0, 0)
        run_batch = store._run_batch
        resolved: list[bool] = []

        async def losing(
            connection: asyncpg.Connection, jobs: list[store_module._Job], *, resolve: bool = False
        ):  # type: ignore[no-untyped-def]
            resolved.append(resolve)
            if not resolve:
                if committed:
                    await run_batch(connection, jobs)
                raise asyncpg.exceptions.ConnectionDoesNotExistError("the answer is lost (test)")
            return await run_batch(connection, jobs, resolve=resolve)

        monkeypatch.setattr(store, "_run_batch", losing)
        refused = await store.append_many(
            [Append(a.pid, 1, [placeholder_record(1, 1, 0)]), Append(b.pid, 1, [placeholder_record(1, 1, 0)])]
        )
        assert refused == [None, None]
        assert resolved == [False, True]
        monkeypatch.undo()
        for pid in (a.pid, b.pid):
            assert [(r.log_offset, r.term) for r in await store.read_log(pid, 0)] == [(0, 1), (1, 1)]
            await store.append(pid, 1, [placeholder_record(2, 1, 1)])  # the log goes on from 2
            assert [r.log_offset for r in await store.read_log(pid, 0)] == [0, 1, 2]


async def test_a_lost_append_batch_still_running_is_waited_out(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lost session's statement is still waiting for a row lock when the batch runs again:
    the second run waits for it to finish (locking the same rows) and accepts what it committed."""
    async with await PostgresLogStore.open(postgres_dsn) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.begin_term(p.pid, 0, 0)
        blocker = await asyncpg.connect(postgres_dsn)
        lost = await asyncpg.connect(postgres_dsn)  # the session whose answer goes missing
        try:
            transaction = blocker.transaction()
            await transaction.start()
            await blocker.execute("SELECT 1 FROM partitions WHERE pid = $1 FOR UPDATE", p.pid)
            run_batch = store._run_batch

            async def losing(
                connection: asyncpg.Connection, jobs: list[store_module._Job], *, resolve: bool = False
            ):  # type: ignore[no-untyped-def]
                if not resolve:
                    tg.start_soon(run_batch, lost, jobs)  # on its way, behind the blocker's lock
                    await wait_for_lock_waiters(postgres_dsn, 1)
                    raise asyncpg.exceptions.ConnectionDoesNotExistError("the answer is lost (test)")
                return await run_batch(connection, jobs, resolve=resolve)

            monkeypatch.setattr(store, "_run_batch", losing)
            answered: list[None] = []

            async def append() -> None:
                answered.append(await store.append(p.pid, 1, [placeholder_record(1, 1, 0)]))

            async with anyio.create_task_group() as tg:
                tg.start_soon(append)
                await wait_for_lock_waiters(postgres_dsn, 2)  # the lost statement, then the second run
                assert not answered
                await transaction.rollback()
            assert answered == [None]
        finally:
            await blocker.close()
            await lost.close()
        assert [(r.log_offset, r.term) for r in await store.read_log(p.pid, 0)] == [(0, 1), (1, 1)]


async def wait_for_lock_waiters(dsn: str, count: int) -> None:
    """Until `count` sessions of this database wait for a lock. Looked at from a session of its
    own: the test's two waits run at once, and an asyncpg connection takes one statement at a
    time (sharing the blocker's, they met: "another operation is in progress"); and each look
    is a transaction of its own, since PostgreSQL shows a transaction the sessions' activity as
    it was at its first look."""
    connection = await asyncpg.connect(dsn)
    try:
        for _ in range(2_000):  # bounded
            waiting = await connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            if waiting >= count:
                return
            await anyio.sleep(0.01)
    finally:
        await connection.close()
    raise AssertionError(f"fewer than {count} sessions wait for a lock")


async def test_the_log_table_holds_the_rows_the_append_statement_sends(postgres_dsn: str) -> None:
    """APPEND_BATCH sends its log rows as one array of the `log` table's row type: the table's
    columns are `log_row`'s, in its order, and every column of an appended row reads back as
    `log_row` made it (the NULLs of an entry that is not a placeholder included)."""
    async with await PostgresLogStore.open(postgres_dsn, clock=lambda: 1234.5) as store:
        a, b = await store.create_topic("t", 2, 1, 0.0)
        await store.begin_term(a.pid, 0, 0)
        await store.begin_term(b.pid, 0, 0)
        records = {
            a.pid: [
                placeholder_record(1, 1, 0),
                LogRecord(2, 1, 1, AdvanceReconciledOffset(1, 1)),
                placeholder_record(3, 1, 1, epoch=3),
            ],
            b.pid: [placeholder_record(1, 1, 0, epoch=2, count=7)],
        }
        assert await store.append_many([Append(pid, 1, rs) for pid, rs in records.items()]) == [None, None]
        connection = await asyncpg.connect(postgres_dsn)
        try:
            columns = await connection.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'log'"
                " AND table_schema = current_schema() ORDER BY ordinal_position"
            )
            stored = await connection.fetch("SELECT * FROM log WHERE log_offset > 0 ORDER BY pid, log_offset")
        finally:
            await connection.close()
    assert tuple(row["column_name"] for row in columns) == LOG_ROW_COLUMNS
    expected = [log_row(pid, r, 1234.5) for pid, rs in sorted(records.items()) for r in rs]
    assert [tuple(row) for row in stored] == expected
    assert expected[1][4:9] == ("advance_reconciled_offset", None, 0, 0, None)


async def test_a_writer_keeps_its_connection_from_batch_to_batch(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends one after another run on one writer's connection, taken from the pool once and
    given back at the close: no acquire, no release (asyncpg: a shielded task) per batch."""
    acquire, release = asyncpg.pool.Pool.acquire, asyncpg.pool.Pool.release
    calls: list[str] = []

    def counted_acquire(self: asyncpg.pool.Pool, **kw: Any) -> Any:
        calls.append("acquire")
        return acquire(self, **kw)

    async def counted_release(self: asyncpg.pool.Pool, connection: object, **kw: Any) -> None:
        calls.append("release")
        await release(self, connection, **kw)

    async with await PostgresLogStore.open(postgres_dsn) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.begin_term(p.pid, 0, 0)
        monkeypatch.setattr(asyncpg.pool.Pool, "acquire", counted_acquire)
        monkeypatch.setattr(asyncpg.pool.Pool, "release", counted_release)
        for offset in range(1, 9):
            await store.append(p.pid, 1, [placeholder_record(offset, 1, offset - 1)])
        during = list(calls)
        monkeypatch.setattr(asyncpg.pool.Pool, "acquire", acquire)  # the read: uncounted
        monkeypatch.setattr(asyncpg.pool.Pool, "release", release)
        assert [r.log_offset for r in await store.read_log(p.pid, 0)] == list(range(9))
        monkeypatch.setattr(asyncpg.pool.Pool, "release", counted_release)
    assert during == ["acquire"]
    assert calls == ["acquire", "release"]  # given back at the close


async def test_a_writer_whose_connection_the_server_ended_takes_another(postgres_dsn: str) -> None:
    """A writer's held connection ended by the server between batches (a restart, an
    administrator): the next batch fails on it, is resolved and runs on a new connection;
    nothing is lost or written twice."""
    async with await PostgresLogStore.open(postgres_dsn) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.begin_term(p.pid, 0, 0)
        await store.append(p.pid, 1, [placeholder_record(1, 1, 0)])
        admin = await asyncpg.connect(postgres_dsn)
        try:
            ended = await admin.fetchval(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND application_name = 'levelzero') AS t"
            )
        finally:
            await admin.close()
        assert ended >= 1
        await store.append(p.pid, 1, [placeholder_record(2, 1, 1)])
        await store.append(p.pid, 1, [placeholder_record(3, 1, 2)])
        assert [r.log_offset for r in await store.read_log(p.pid, 0)] == [0, 1, 2, 3]


async def test_a_release_that_fails_after_the_answer_runs_nothing_again(
    postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch answered at its statement's answer is decided: a failure of the connection's
    release afterwards (a writer gives its connection back at the close) is not a lost answer
    (no resolution, no second answer) and does not fail the close."""
    release = asyncpg.pool.Pool.release
    failed: list[int] = []

    async def failing_release(self: asyncpg.pool.Pool, connection: asyncpg.Connection, **kw: object) -> None:
        await release(self, connection, **kw)
        if not failed:
            failed.append(1)
            raise asyncpg.exceptions.ConnectionDoesNotExistError("gone after the answer")

    resolutions: list[str] = []
    execute = asyncpg.Connection.execute

    async def logged_execute(self: asyncpg.Connection, query: str, *args: object, **kw: object) -> str:
        if "FOR UPDATE" in query:  # a lost answer's resolution locks the batch's partitions first
            resolutions.append(query)
        return await execute(self, query, *args, **kw)

    async with await PostgresLogStore.open(postgres_dsn) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.begin_term(p.pid, 0, 0)
        commits = store.statistics().commits
        monkeypatch.setattr(asyncpg.pool.Pool, "release", failing_release)
        monkeypatch.setattr(asyncpg.Connection, "execute", logged_execute)
        await store.append(p.pid, 1, [placeholder_record(1, 1, 0)])
        await store.append(p.pid, 1, [placeholder_record(2, 1, 1)])
        assert [r.log_offset for r in await store.read_log(p.pid, 0)] == [0, 1, 2]
    # Closed: every batch task has ended, a retry of the first one included.
    assert failed == [1]
    assert resolutions == []
    assert store.statistics().commits - commits == 2  # each batch answered once
