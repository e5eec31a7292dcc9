"""The log store contract, one suite run against both backends: SQLite (embedded, one node) and
PostgreSQL (shared; a throwaway server, see tests/conftest.py). Whatever a component may rely on
is pinned here; backend-specific behaviour (SQLite's writer process and lock file, PostgreSQL's
reconnects) has its own module."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import asyncpg
import msgspec
import pytest

from levelzero.testing.entries import placeholder
from levelzero.core.entries import (
    AdvanceEpoch,
    AdvanceReconciledOffset,
    LogRecord,
    Placeholder,
    SetStartOffset,
    TermStart,
)
from levelzero.core.errors import (
    InvalidInput,
    InvariantViolation,
    LogMovedOn,
    NotLeader,
    PartitionDeleted,
    SnapshotSuperseded,
    StoreRefused,
    TopicExists,
    UnknownTopic,
)
from levelzero.core.state import PartitionState
from levelzero.storage.postgres.store import PostgresLogStore
from levelzero.storage.protocols import (
    Append,
    CompactionCommit,
    FenceEventRow,
    GcRoundRow,
    L0ObjectRow,
    L1Row,
    L1State,
    LogStore,
    OffsetRow,
    Snapshot,
    StateSampleRow,
)
from levelzero.storage.sqlite import SqliteLogStore

sys.path.insert(0, str(Path(__file__).parent))
from test_consumer_offsets import exercise as exercise_consumer_offsets
from test_sqlite_log import l1_row, placeholder_record


@dataclass
class Backend:
    name: str
    open: Callable[[], Awaitable[Any]]
    open_in: Callable[[anyio.abc.TaskGroup], Awaitable[Any]]
    make_newer: Callable[[int], Awaitable[None]]  # stamp the store's schema version
    times: Callable[[str, str], Awaitable[list[float | None]]] | None = None  # a column, in row order


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        db = tmp_path / "log.db"

        async def newer_sqlite(version: int) -> None:
            with sqlite3.connect(db) as connection:
                connection.execute(f"PRAGMA user_version = {version}")
            connection.close()

        async def sqlite_times(table: str, column: str) -> list[float | None]:
            with sqlite3.connect(db) as connection:
                rows = connection.execute(f"SELECT {column} FROM {table} ORDER BY rowid").fetchall()  # noqa: S608
            connection.close()
            return [row[0] for row in rows]

        return Backend(
            "sqlite",
            lambda: SqliteLogStore.open(db),
            lambda tg: SqliteLogStore.open_in(tg, db),
            newer_sqlite,
            sqlite_times,
        )
    dsn = request.getfixturevalue("postgres_dsn")

    async def newer_postgres(version: int) -> None:
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute("INSERT INTO levelzero_schema (version) VALUES ($1)", version)
        finally:
            await connection.close()

    async def postgres_times(table: str, column: str) -> list[float | None]:
        order = {"gc_rounds": "round_id", "cluster_epoch": "id"}.get(table, "seq")
        connection = await asyncpg.connect(dsn)
        try:
            query = f"SELECT {column} FROM {table} ORDER BY {order}"  # noqa: S608 (the test's names)
            return [row[0] for row in await connection.fetch(query)]
        finally:
            await connection.close()

    return Backend(
        "postgres",
        lambda: PostgresLogStore.open(dsn),
        lambda tg: PostgresLogStore.open_in(tg, dsn),
        newer_postgres,
        postgres_times,
    )


async def test_a_database_newer_than_the_code_is_refused(backend: Backend) -> None:
    async with await backend.open() as store:
        await store.create_topic("t", 1, 1, 0.0)
    await backend.make_newer(99)
    with pytest.raises(StoreRefused, match="schema version 99 is newer than this levelzero"):
        await backend.open()


async def test_committed_offsets_last_write_wins_and_survive_reopening(backend: Backend) -> None:
    async with await backend.open() as store:
        await exercise_consumer_offsets(store)
    async with await backend.open() as store:
        assert [r.committed_offset for r in await store.committed_offsets("g")] == [
            12
        ]  # exercise deleted ("t", 0)


async def test_group_metadata_last_write_wins_is_forgotten_and_survives_reopening(backend: Backend) -> None:
    async with await backend.open() as store:
        assert await store.group_metadata("g") is None
        await store.store_group_metadata("g", b"generation 1", 1.0)
        await store.store_group_metadata("g", b"generation 2", 2.0)
        await store.store_group_metadata("gone", b"x", 2.0)
        await store.store_group_metadata("gone", None, 3.0)
        await store.store_group_metadata("never", None, 3.0)  # forgetting nothing is no error
    async with await backend.open() as store:
        assert await store.group_metadata("g") == b"generation 2"
        assert await store.group_metadata("gone") is None


async def test_topic_configs_are_stored_with_the_topic_replaced_whole_and_survive_reopening(
    backend: Backend,
) -> None:
    async with await backend.open() as store:
        await store.create_topic("a", 2, 1, 0.0, {"retention.ms": "60000", "retention.bytes": "1000"})
        await store.create_topic("b", 1, 1, 0.0)
        assert await store.topic_configs() == {"a": {"retention.bytes": "1000", "retention.ms": "60000"}}
        assert await store.topic_configs("b") == {}
        await store.set_topic_configs("b", {"max.message.bytes": "2048"}, 1.0)
        await store.set_topic_configs("a", {"retention.ms": "-1"}, 1.0)  # retention.bytes goes
        with pytest.raises(UnknownTopic):
            await store.set_topic_configs("nope", {"retention.ms": "1"}, 1.0)
        assert await store.topic_configs("nope") == {}
    async with await backend.open() as store:
        assert await store.topic_configs() == {
            "a": {"retention.ms": "-1"},
            "b": {"max.message.bytes": "2048"},
        }
        await store.set_topic_configs("a", {}, 2.0)
        assert await store.topic_configs() == {"b": {"max.message.bytes": "2048"}}
        assert await store.topic_configs("b") == {"b": {"max.message.bytes": "2048"}}


async def test_l0_catalog_records_once_marks_and_lists_live_objects_in_order(
    backend: Backend,
) -> None:
    async with await backend.open() as store:
        rows = [
            L0ObjectRow(f"level_zero/data/{p:03}/{e:018}/k", e, 100, 1.0, 2)
            for e in (3, 1, 2)
            for p in (7, 1)
        ]
        for row in rows:
            await store.record_l0_object(row)
        await store.record_l0_object(L0ObjectRow(rows[0].key, 3, 999, 9.0, 9))  # kept: first
        live = await store.l0_live_objects(max_epoch=10)
        assert [(r.epoch, r.key) for r in live] == sorted((r.epoch, r.key) for r in rows)
        assert live[-1] == L0ObjectRow(rows[0].key, 3, 100, 1.0, 2)
        assert [r.epoch for r in await store.l0_live_objects(max_epoch=2)] == [1, 1, 2, 2]
        page = await store.l0_live_objects(max_epoch=10, after=(live[1].epoch, live[1].key), limit=3)
        assert page == live[2:5]
        await store.mark_l0_deleted([live[0].key, live[2].key, "no/such/key"], at=5.0, m=2)
        await store.mark_l0_deleted([live[0].key], at=6.0, m=3)  # already marked: unchanged
        assert [r.key for r in await store.l0_live_objects(max_epoch=10)] == [
            r.key for r in live if r.key not in (live[0].key, live[2].key)
        ]


async def test_l0_catalog_marks_a_page_of_a_thousand_keys_in_one_call(backend: Backend) -> None:
    """The GC marks a DeleteObjects page (1,000 keys) at a time; two pages marked together
    (one group commit) and keys JSON would have to escape are marked exactly."""
    async with await backend.open() as store:
        keys = [f"level_zero/data/{i % 1000:03}/{1 + i % 3:018}/k{i:05}" for i in range(2_400)]
        keys[7] = 'odd "quoted" \\ key'
        rows = [L0ObjectRow(key, 1 + i % 3, 1, 1.0, 1) for i, key in enumerate(keys)]
        for start in range(0, len(rows), 400):
            async with anyio.create_task_group() as tg:
                for row in rows[start : start + 400]:
                    tg.start_soon(store.record_l0_object, row)
        first, second = keys[:1000], keys[1000:2000]
        async with anyio.create_task_group() as tg:
            tg.start_soon(store.mark_l0_deleted, first, 5.0, 2)
            tg.start_soon(store.mark_l0_deleted, second + ["no/such/key"], 6.0, 3)
        live = await store.l0_live_objects(max_epoch=10, limit=10_000)
        assert sorted(r.key for r in live) == sorted(keys[2000:])
        await store.mark_l0_deleted(keys[2000:], 7.0, 3)
        assert await store.l0_live_objects(max_epoch=10) == []


async def test_store_satisfies_the_log_store_protocol(backend: Backend) -> None:
    async with await backend.open() as store:
        assert isinstance(store, LogStore)


async def test_concurrent_appends_are_durable_ordered_and_group_committed(backend: Backend) -> None:
    partitions, appends_per_partition, records_per_append = 50, 20, 2
    async with await backend.open() as store:
        rows = await store.create_topic("t", partitions, creation_epoch=1, now=0.0)
        before = store.statistics()

        async def appender(pid: int) -> None:
            for index in range(appends_per_partition):
                first = index * records_per_append
                records = [placeholder_record(first + i, 0, first + i) for i in range(records_per_append)]
                await store.append(pid, 0, records)

        async with anyio.create_task_group() as tg:
            for row in rows:
                tg.start_soon(appender, row.pid)
        stats = store.statistics()

    appends = partitions * appends_per_partition
    assert stats.appends - before.appends == appends
    assert stats.records - before.records == appends * records_per_append
    assert stats.rejected_appends == 0
    # Group commit: ~one commit per round of the 50 appenders, not one per append.
    assert stats.commits - before.commits <= appends // 10, stats
    assert stats.largest_batch_records > records_per_append

    async with await backend.open() as store:
        for row in rows:
            records = await store.read_log(row.pid, 0)
            expected = [
                placeholder_record(o, 0, o) for o in range(appends_per_partition * records_per_append)
            ]
            assert records == expected


async def test_stale_term_append_is_rejected_while_batch_mates_commit(backend: Backend) -> None:
    async with await backend.open() as store:
        (a, b) = await store.create_topic("t", 2, 1, 0.0)
        start_a = await store.begin_term(a.pid, 0, 0)
        await store.begin_term(b.pid, 0, 0)
        assert start_a == LogRecord(0, 1, 0, TermStart(1))
        await store.begin_term(b.pid, 1, 0)  # b moves on to term 2

        outcomes: dict[str, BaseException | None] = {}

        async def attempt(name: str, pid: int, term: int, record: LogRecord) -> None:
            try:
                await store.append(pid, term, [record])
                outcomes[name] = None
            except NotLeader as error:
                outcomes[name] = error

        batches_before = store.statistics().batches
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt, "a", a.pid, 1, placeholder_record(1, 1, 0))
            tg.start_soon(attempt, "b-stale", b.pid, 1, placeholder_record(2, 1, 0))
            tg.start_soon(attempt, "b-current", b.pid, 2, placeholder_record(2, 2, 0))
        if backend.name == "sqlite":  # one append per partition in flight on PostgreSQL
            assert store.statistics().batches == batches_before + 1  # all three in one batch

        assert outcomes["a"] is None and outcomes["b-current"] is None
        stale = outcomes["b-stale"]
        assert isinstance(stale, NotLeader)
        assert (stale.expected_term, stale.current_term, stale.partition) == (1, 2, "t/1")
        assert store.statistics().rejected_appends == 1
        assert await store.read_log(a.pid, 0) == [start_a, placeholder_record(1, 1, 0)]
        assert [r.term for r in await store.read_log(b.pid, 0)] == [1, 2, 2]
        assert {p.pid: p.term for p in await store.list_partitions()} == {a.pid: 1, b.pid: 2}


async def test_append_many_refuses_a_moved_on_partition_alone(backend: Backend) -> None:
    """One call for many partitions (the node's appender): each partition's records land as an
    `append` of them would; a partition whose term moved on gets its NotLeader in the answer
    and the others commit; a call that breaks a log raises, as `append` does."""
    async with await backend.open() as store:
        rows = await store.create_topic("t", 4, 1, 0.0)
        starts = [await store.begin_term(row.pid, 0, 0) for row in rows]
        await store.begin_term(rows[2].pid, 1, 0)  # partition 2 moves on to term 2
        before = store.statistics()
        refused = await store.append_many(
            [Append(row.pid, 1, [placeholder_record(1, 1, 0), placeholder_record(2, 1, 1)]) for row in rows]
        )
        assert [error is None for error in refused] == [True, True, False, True]
        stale = refused[2]
        assert isinstance(stale, NotLeader)
        assert (stale.expected_term, stale.current_term, stale.partition) == (1, 2, "t/2")
        after = store.statistics()
        assert (after.appends - before.appends, after.rejected_appends - before.rejected_appends) == (3, 1)
        for row, start in zip(rows, starts, strict=True):
            log = await store.read_log(row.pid, 0)
            if row is rows[2]:
                assert [r.term for r in log] == [1, 2]
            else:
                assert log == [start, placeholder_record(1, 1, 0), placeholder_record(2, 1, 1)]
        with pytest.raises(InvariantViolation, match="log offset 7"):
            await store.append_many([Append(rows[0].pid, 1, [placeholder_record(7, 1, 2)])])
        assert await store.append_many([]) == []


async def test_append_many_tells_each_append_once_as_it_becomes_durable(backend: Backend) -> None:
    """`on_durable(i, refusal)`: each append of the call once, before the call returns, with
    what the call's answer says of it; what it raises, the call raises once every append is
    settled (and told)."""
    async with await backend.open() as store:
        rows = await store.create_topic("t", 4, 1, 0.0)
        for row in rows:
            await store.begin_term(row.pid, 0, 0)
        await store.begin_term(rows[2].pid, 1, 0)  # partition 2 moves on to term 2
        told: list[tuple[int, NotLeader | None]] = []
        refused = await store.append_many(
            [Append(row.pid, 1, [placeholder_record(1, 1, 0)]) for row in rows],
            lambda index, refusal: told.append((index, refusal)),
        )
        assert sorted(told, key=lambda item: item[0]) == list(enumerate(refused))
        assert [refusal is None for refusal in refused] == [True, True, False, True]

        def fail_on_first(index: int, refusal: NotLeader | None) -> None:
            told.append((index, refusal))
            if index == 0:
                raise RuntimeError("the listener broke")

        told.clear()
        with pytest.raises(RuntimeError, match="the listener broke"):
            await store.append_many(
                [Append(row.pid, 1, [placeholder_record(2, 1, 1)]) for row in (rows[0], rows[1], rows[3])],
                fail_on_first,
            )
        assert sorted(index for index, _ in told) == [0, 1, 2]
        for row in (rows[0], rows[1], rows[3]):  # durable, whatever the listener did
            assert [r.log_offset for r in await store.read_log(row.pid, 0)] == [0, 1, 2]


async def test_a_term_start_behind_the_end_of_the_log_is_refused_as_moved_on(
    backend: Backend,
) -> None:
    """A new leader replayed to offset 1; the previous leader's append landed at 1 before its
    `TermStart`: refused as `LogMovedOn` (replay the rest, try again), nothing written. A term
    start past the end (a gap) stays an invariant violation."""
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.begin_term(p.pid, 0, 0)
        await store.append(p.pid, 1, [placeholder_record(1, 1, 0, count=2)])
        with pytest.raises(LogMovedOn) as refused:
            await store.begin_term(p.pid, 1, 0)
        assert refused.value.next_log_offset == 2
        with pytest.raises(InvariantViolation):
            await store.begin_term(p.pid, 5, 2)
        assert [r.log_offset for r in await store.read_log(p.pid, 0)] == [0, 1]
        assert (await store.begin_term(p.pid, 2, 2)).term == 2


async def test_begin_term_increments_term_and_survives_reopen(backend: Backend) -> None:
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        assert p.term == 0
        first = await store.begin_term(p.pid, 0, 0)
        await store.append(p.pid, 1, [placeholder_record(1, 1, 0, count=5)])
        second = await store.begin_term(p.pid, 2, 5)
        assert (first.term, second.term) == (1, 2)
        assert second == LogRecord(2, 2, 5, TermStart(2))
        with pytest.raises(NotLeader):
            await store.append(p.pid, 1, [placeholder_record(3, 1, 5)])
    async with await backend.open() as store:
        (p,) = await store.list_partitions()
        assert p.term == 2
        with pytest.raises(NotLeader):
            await store.append(p.pid, 1, [placeholder_record(3, 1, 5)])
        await store.append(p.pid, 2, [placeholder_record(3, 2, 5)])
        third = await store.begin_term(p.pid, 4, 6)
        assert third.term == 3


async def test_begin_term_jumps_to_at_least_and_never_goes_back(backend: Backend) -> None:
    """Recovery starts a term above every term its bucket names (`daemon/recover.py`)."""
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        assert (await store.begin_term(p.pid, 0, 0, at_least=9)) == LogRecord(0, 9, 0, TermStart(9))
        await store.append(p.pid, 9, [placeholder_record(1, 9, 0, count=2)])
        assert (await store.begin_term(p.pid, 2, 2, at_least=4)).term == 10  # term + 1 wins
    async with await backend.open() as store:
        (p,) = await store.list_partitions()
        assert p.term == 10
        with pytest.raises(NotLeader):
            await store.append(p.pid, 9, [placeholder_record(3, 9, 2)])
        await store.append(p.pid, 10, [placeholder_record(3, 10, 2)])


async def test_misuse_of_append_is_an_invariant_violation_for_that_caller_only(backend: Backend) -> None:
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        with pytest.raises(InvariantViolation, match="continues at 0"):
            await store.append(p.pid, 0, [placeholder_record(1, 0, 0)])  # gap
        with pytest.raises(InvariantViolation, match="carries term 3"):
            await store.append(p.pid, 0, [placeholder_record(0, 3, 0)])  # wrong term in record
        with pytest.raises(InvariantViolation, match="consecutive log offsets; 3 follows 1"):
            await store.append(p.pid, 0, [placeholder_record(o, 0, o) for o in (0, 1, 3)])
        with pytest.raises(NotLeader):
            await store.append(p.pid, 4, [])  # an empty append still checks the term
        with pytest.raises(InvariantViolation, match="unknown partition id 999"):
            await store.append(999, 0, [placeholder_record(0, 0, 0)])
        with pytest.raises(InvariantViolation, match="continues at 0"):
            await store.begin_term(p.pid, 5, 0)
        # Nothing of the rejected appends landed; the store keeps working.
        assert await store.read_log(p.pid, 0) == []
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
        assert await store.read_log(p.pid, 0) == [placeholder_record(0, 0, 0)]
        assert not store.statistics().failed


# A step is ops on distinct partitions, run concurrently (so they share batches):
# ("append", records, stale) | ("begin_term",) | ("snapshot_truncate",); or ("reopen",).


async def test_snapshot_truncation_and_reading_continue(backend: Backend) -> None:
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(o, 0, o) for o in range(10)])
        with pytest.raises(InvariantViolation, match="no snapshot covers"):
            await store.truncate_below(p.pid, 1)
        assert await store.truncate_below(p.pid, 0) == 0

        await store.save_snapshot(Snapshot(p.pid, 5, b"state@5"))
        assert await store.load_snapshot(p.pid) == Snapshot(p.pid, 5, b"state@5")
        with pytest.raises(InvariantViolation, match="no snapshot covers"):
            await store.truncate_below(p.pid, 7)
        assert await store.truncate_below(p.pid, 6) == 6
        assert [r.log_offset for r in await store.read_log(p.pid, 0)] == [6, 7, 8, 9]
        assert [r.log_offset for r in await store.read_log(p.pid, 7, limit=2)] == [7, 8]
        with pytest.raises(SnapshotSuperseded, match="older than the saved one"):
            await store.save_snapshot(Snapshot(p.pid, 4, b"old"))
        with pytest.raises(InvariantViolation, match="the log ends before 10"):
            await store.save_snapshot(Snapshot(p.pid, 10, b"future"))

        await store.append(p.pid, 0, [placeholder_record(10, 0, 10)])
        await store.save_snapshot(Snapshot(p.pid, 10, b"state@10"))
        assert await store.truncate_below(p.pid, 11) == 5  # the whole log
        assert await store.read_log(p.pid, 0) == []

    # With the log truncated to nothing, the snapshot tells where the log continues.
    async with await backend.open() as store:
        assert await store.load_snapshot(p.pid) == Snapshot(p.pid, 10, b"state@10")
        with pytest.raises(InvariantViolation, match="continues at 11"):
            await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
        await store.append(p.pid, 0, [placeholder_record(11, 0, 11)])
        assert await store.read_log(p.pid, 0) == [placeholder_record(11, 0, 11)]
        assert await store.load_snapshot(12345) is None


async def test_recovery_from_snapshot_and_replay_equals_live_state(backend: Backend) -> None:
    live = PartitionState(creation_epoch=1)
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        live.apply(await store.begin_term(p.pid, 0, 0))

        async def append(entry) -> None:
            record = LogRecord(live.next_log_offset, live.term, live.high_watermark, entry)
            await store.append(p.pid, live.term, [record])
            live.apply(record)

        def data(epoch: int, count: int) -> Placeholder:
            return placeholder(epoch, count, object_key=f"k-{live.next_log_offset}")

        for epoch in (1, 1, 2, 3, 3):
            await append(data(epoch, 4))
        await append(AdvanceReconciledOffset(lro=7, lrlo=2))
        snapshot = Snapshot(p.pid, live.last_applied_log_offset, live.encode_snapshot())
        await store.save_snapshot(snapshot)
        await store.truncate_below(p.pid, live.last_applied_log_offset + 1)
        await append(AdvanceEpoch(4))
        await append(data(4, 2))
        await append(SetStartOffset(3))
        await append(AdvanceReconciledOffset(lro=20, lrlo=live.last_applied_log_offset))
        live.apply(await store.begin_term(p.pid, live.next_log_offset, live.high_watermark))
        await append(data(4, 1))

    async with await backend.open() as store:
        snapshot = await store.load_snapshot(p.pid)
        assert snapshot is not None
        recovered = PartitionState.decode_snapshot(snapshot.data)
        for record in await store.read_log(p.pid, snapshot.log_offset + 1):
            assert recovered.apply(record)
    assert recovered == live
    assert recovered.mp == 2 and recovered.term == 2


async def test_read_placeholders_returns_ranges_ending_above_the_offset(backend: Backend) -> None:
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        # Data ranges: [0,10) [10,15) (epoch marker) [15,30) [30,31)
        records = [
            placeholder_record(0, 0, 0, count=10),
            placeholder_record(1, 0, 10, count=5),
            LogRecord(2, 0, 15, AdvanceEpoch(2)),
            placeholder_record(3, 0, 15, epoch=2, count=15),
            placeholder_record(4, 0, 30, epoch=2, count=1),
        ]
        await store.append(p.pid, 0, records)

        async def bases(offset: int, limit: int = 100) -> list[int]:
            return [r.base_offset for r in await store.read_placeholders(p.pid, offset, limit)]

        assert await bases(0) == [0, 10, 15, 30]
        assert await bases(9) == [0, 10, 15, 30]
        assert await bases(10) == [10, 15, 30]
        assert await bases(14) == [10, 15, 30]
        assert await bases(29) == [15, 30]
        assert await bases(30) == [30]
        assert await bases(31) == []
        assert await bases(0, limit=2) == [0, 10]
        assert (await store.read_placeholders(p.pid, 16, 1)) == [records[3]]


async def test_placeholders_keep_their_largest_timestamp_or_none(backend: Backend) -> None:
    """A placeholder's largest record timestamp (ListOffsets by time skips extents by it) comes
    back from both reads, after reopening too; one written without it (an older levelzero's)
    reads as None, and -1 (no record has a timestamp) stays -1."""
    stamped = [
        LogRecord(0, 0, 0, placeholder(1, 3, max_timestamp_ms=1_700_000_000_123)),
        LogRecord(1, 0, 3, placeholder(1, 2)),
        LogRecord(2, 0, 5, placeholder(1, 1, max_timestamp_ms=-1)),
    ]
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, stamped)
    async with await backend.open() as store:
        for records in (await store.read_log(p.pid, 0), await store.read_placeholders(p.pid, 0, 10)):
            assert records == stamped
            assert [r.entry.max_timestamp_ms for r in records] == [1_700_000_000_123, None, -1]  # type: ignore[union-attr]


def test_a_new_copys_row_is_copy_started_created_and_updated_at_once() -> None:
    row = L1Row.copy_started("k", 3, 10, 19, 7, 2, 4096, 1_234.5, 1_700_000_000_999)
    assert row == L1Row("k", 3, 10, 19, 7, 2, 4096, L1State.COPY_STARTED, 1_234.5, 1_234.5, 1_700_000_000_999)


async def test_l1_rows_keep_their_largest_timestamp_through_transitions(backend: Backend) -> None:
    """An L1 row's largest record timestamp is stored with it and kept by every transition;
    a row without one (recovered without reading its object) stays None: a lookup reads it."""
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        rows = [
            msgspec.structs.replace(l1_row("a", p.pid, 0), max_timestamp_ms=1_700_000_000_999),
            l1_row("b", p.pid, 10),
            msgspec.structs.replace(l1_row("c", p.pid, 20), max_timestamp_ms=-1),
        ]
        for row in rows:
            await store.l1_insert(row)
        assert await store.l1_list(pid=p.pid) == rows
        assert await store.l1_transition("a", L1State.COPY_STARTED, L1State.COPY_FINISHED, 2.0)
    async with await backend.open() as store:
        (finished,) = await store.l1_list(pid=p.pid, states=[L1State.COPY_FINISHED])
        assert (finished.key, finished.max_timestamp_ms) == ("a", 1_700_000_000_999)
        assert [r.max_timestamp_ms for r in await store.l1_list(pid=p.pid)] == [1_700_000_000_999, None, -1]


async def test_cluster_epoch_persists_and_never_decreases(backend: Backend) -> None:
    async with await backend.open() as store:
        assert await store.get_cluster_epoch() == 1
        await store.set_cluster_epoch(5)
        await store.set_cluster_epoch(5)
        with pytest.raises(InvariantViolation, match="from 5 to 4"):
            await store.set_cluster_epoch(4)
        with pytest.raises(InvariantViolation):
            await store.set_cluster_epoch(0)
    async with await backend.open() as store:
        assert await store.get_cluster_epoch() == 5
        with pytest.raises(InvariantViolation):
            await store.set_cluster_epoch(3)
        await store.set_cluster_epoch(9)
        assert await store.get_cluster_epoch() == 9


async def test_the_probe_write_writes_and_changes_no_epoch(backend: Backend) -> None:
    """The health probe's write (`probe_write`) leaves the epoch as it was. On SQLite it is the
    epoch's row written again (absent before the first set, there after it); on PostgreSQL a
    transaction given an id, which locks no row and leaves the tables as they were."""
    assert backend.times is not None
    async with await backend.open() as store:
        assert await backend.times("cluster_epoch", "epoch") == []
        await store.probe_write()
        assert await backend.times("cluster_epoch", "epoch") == ([1] if backend.name == "sqlite" else [])
        assert await store.get_cluster_epoch() == 1
        await store.set_cluster_epoch(5)
        await store.probe_write()
        await store.probe_write()
        assert await store.get_cluster_epoch() == 5
        await store.set_cluster_epoch(6)  # raised past it as before
    async with await backend.open() as store:
        assert await store.get_cluster_epoch() == 6
        assert await backend.times("cluster_epoch", "epoch") == [6]


async def test_create_topic_assigns_pids_and_refuses_duplicates(backend: Backend) -> None:
    async with await backend.open() as store:
        rows = await store.create_topic("a", 3, 2, 100.0)
        assert [(r.topic, r.partition, r.creation_epoch, r.term, r.created_at) for r in rows] == [
            ("a", i, 2, 0, 100.0) for i in range(3)
        ]
        with pytest.raises(TopicExists):
            await store.create_topic("a", 1, 2, 100.0)
        await store.create_topic("b", 1, 3, 101.0)
        with pytest.raises(InvalidInput):
            await store.create_topic("c", 0, 3, 101.0)
        assert len({r.pid for r in await store.list_partitions()}) == 4
    async with await backend.open() as store:
        assert [(r.topic, r.partition) for r in await store.list_partitions()] == [
            ("a", 0),
            ("a", 1),
            ("a", 2),
            ("b", 0),
        ]


async def test_l1_transition_is_compare_and_set(backend: Backend) -> None:
    async with await backend.open() as store:
        await store.l1_insert(l1_row("k1", 1, 0))
        await store.l1_insert(l1_row("k2", 1, 10))
        await store.l1_insert(l1_row("k3", 2, 0))
        with pytest.raises(InvariantViolation, match="already recorded"):
            await store.l1_insert(l1_row("k1", 1, 0))
        with pytest.raises(InvalidInput, match="unknown L1 state"):
            await store.l1_insert(l1_row("k9", 1, 0, state="BOGUS"))
        assert await store.l1_transition("k1", L1State.COPY_STARTED, L1State.COPY_FINISHED, 2.0)
        assert not await store.l1_transition("k1", L1State.COPY_STARTED, L1State.COPY_FINISHED, 3.0)
        assert not await store.l1_transition("missing", L1State.COPY_STARTED, L1State.COPY_FINISHED, 3.0)
        assert [r.key for r in await store.l1_list(pid=1)] == ["k1", "k2"]
        finished = await store.l1_list(states=[L1State.COPY_FINISHED])
        assert finished == [L1Row("k1", 1, 0, 9, 2, 1, 1000, L1State.COPY_FINISHED, 1.0, 2.0)]
        assert [r.key for r in await store.l1_list(pid=2, states=[L1State.COPY_STARTED])] == ["k3"]
        assert len(await store.l1_list()) == 3


async def test_aclose_finishes_queued_writes(backend: Backend) -> None:
    async with await backend.open() as store:
        rows = await store.create_topic("t", 10, 1, 0.0)
    done: list[int] = []
    async with anyio.create_task_group() as outer:
        store = await backend.open_in(outer)
        async with anyio.create_task_group() as tg:

            async def append(pid: int) -> None:
                await store.append(pid, 0, [placeholder_record(0, 0, 0)])
                done.append(pid)

            for row in rows:
                tg.start_soon(append, row.pid)
            await anyio.wait_all_tasks_blocked()  # every append is queued or in the batch
            await store.aclose()
    assert sorted(done) == [r.pid for r in rows]
    async with await backend.open() as store:
        for row in rows:
            assert await store.read_log(row.pid, 0) == [placeholder_record(0, 0, 0)]


async def test_a_deleted_topic_leaves_the_partition_set_and_its_data_goes(backend: Backend) -> None:
    async with await backend.open() as store:
        doomed = await store.create_topic("t", 2, 1, 0.0)
        (kept,) = await store.create_topic("k", 1, 1, 0.0)
        for row in (*doomed, kept):
            term = await store.begin_term(row.pid, 0, 0)
            await store.append(row.pid, term.term, [placeholder_record(1, term.term, 0)])
        await store.l1_insert(l1_row("t0-a", doomed[0].pid, 0, state=L1State.COPY_FINISHED))
        await store.commit_offsets([OffsetRow("g", "t", 0, 5, "", 1.0), OffsetRow("g", "k", 0, 7, "", 1.0)])
        deleted = await store.delete_topic("t", 9.0)
        assert [(r.topic, r.partition, r.term) for r in deleted] == [("t", 0, 1), ("t", 1, 1)]
        assert [(r.topic, r.partition) for r in await store.list_partitions()] == [("k", 0)]
        assert [r.pid for r in await store.deleted_partitions()] == [r.pid for r in doomed]
        assert [(r.topic, r.committed_offset) for r in await store.committed_offsets("g")] == [("k", 7)]
        assert await store.read_log(doomed[0].pid, 0) == []
        assert len(await store.read_log(kept.pid, 0)) == 2  # other topics untouched
        with pytest.raises(UnknownTopic):
            await store.delete_topic("t", 10.0)


async def test_writes_naming_a_deleted_partition_are_refused_as_not_leader(backend: Backend) -> None:
    async with await backend.open() as store:
        (row,) = await store.create_topic("t", 1, 1, 0.0)
        term = (await store.begin_term(row.pid, 0, 0)).term
        await store.delete_topic("t", 1.0)
        [refused] = await store.append_many([Append(row.pid, term, [placeholder_record(1, term, 0)])])
        assert isinstance(refused, PartitionDeleted)
        assert isinstance(refused, NotLeader)
        with pytest.raises(PartitionDeleted, match="t/0 was deleted"):
            await store.append(row.pid, term, [placeholder_record(1, term, 0)])
        with pytest.raises(PartitionDeleted):
            await store.begin_term(row.pid, 1, 0)
        with pytest.raises(PartitionDeleted):
            await store.save_snapshot(Snapshot(row.pid, 0, b"x"))
        with pytest.raises(PartitionDeleted):  # a late reconciler's object is never recorded
            await store.l1_insert(l1_row("late", row.pid, 0))
        assert await store.l1_list(pid=row.pid) == []


async def test_a_recreated_topic_starts_empty_with_new_partition_ids(backend: Backend) -> None:
    async with await backend.open() as store:
        old = await store.create_topic("t", 2, 1, 0.0)
        await store.append(old[1].pid, 0, [placeholder_record(0, 0, 0)])
        await store.delete_topic("t", 1.0)
        new = await store.create_topic("t", 2, 1, 2.0)
        assert {r.pid for r in new}.isdisjoint({r.pid for r in old})
        assert min(r.pid for r in new) > max(r.pid for r in old)
        for row in new:
            assert await store.read_log(row.pid, 0) == []
            await store.append(row.pid, 0, [placeholder_record(0, 0, 0)])
    async with await backend.open() as store:  # the tombstones and the new rows survive reopening
        assert [r.pid for r in await store.deleted_partitions()] == [r.pid for r in old]
        assert [r.pid for r in await store.list_partitions()] == [r.pid for r in new]
        with pytest.raises(PartitionDeleted):
            await store.append(old[0].pid, 0, [placeholder_record(0, 0, 0)])


async def test_a_deleted_partition_is_forgotten_only_once_its_l1_objects_are_deleted(
    backend: Backend,
) -> None:
    async with await backend.open() as store:
        (row,) = await store.create_topic("t", 1, 1, 0.0)
        await store.l1_insert(l1_row("a", row.pid, 0, state=L1State.COPY_FINISHED))
        await store.l1_insert(l1_row("b", row.pid, 10))
        await store.delete_topic("t", 1.0)
        assert not await store.forget_deleted_partition(row.pid)
        for key, state in (("a", L1State.COPY_FINISHED), ("b", L1State.COPY_STARTED)):
            assert await store.l1_transition(key, state, L1State.DELETE_STARTED, 2.0)
        assert not await store.forget_deleted_partition(row.pid)  # deletes not finished
        for key in ("a", "b"):
            assert await store.l1_transition(key, L1State.DELETE_STARTED, L1State.DELETE_FINISHED, 3.0)
        assert await store.forget_deleted_partition(row.pid)
        assert await store.l1_list(pid=row.pid) == []
        assert await store.deleted_partitions() == []
        assert not await store.forget_deleted_partition(row.pid)  # once
        with pytest.raises(PartitionDeleted):  # and its id stays refused
            await store.l1_insert(l1_row("later", row.pid, 0))


async def test_partitions_are_added_never_removed(backend: Backend) -> None:
    async with await backend.open() as store:
        first = await store.create_topic("t", 2, 1, 0.0)
        added = await store.add_partitions("t", 5, 1, 1.0)
        assert [(r.topic, r.partition) for r in added] == [("t", 2), ("t", 3), ("t", 4)]
        assert min(r.pid for r in added) > max(r.pid for r in first)
        await store.append(added[0].pid, 0, [placeholder_record(0, 0, 0)])
        for count in (5, 3):
            with pytest.raises(InvalidInput, match="has 5 partitions"):
                await store.add_partitions("t", count, 1, 2.0)
        with pytest.raises(UnknownTopic):
            await store.add_partitions("missing", 3, 1, 2.0)
        assert [r.partition for r in await store.list_partitions()] == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------- compaction (seed 004)


async def _compacted_object(store: Any, pid: int, key: str, base: int, last: int, term: int) -> None:
    """A compaction's new object as its writer records it before the upload: COPY_STARTED."""
    await store.l1_insert(L1Row(key, pid, base, last, 0, term, 100, L1State.COPY_STARTED, 1.0, 1.0))


@pytest.mark.parametrize("zombie_first", [False, True], ids=["new-leader-first", "zombie-first"])
async def test_seed_004_zombie_compaction_result_is_refused_in_either_arrival_order(
    backend: Backend, zombie_first: bool
) -> None:
    """Seed 004's table. A leads under LE-0 (term 1 here), compacts to 100 (seg-0); B takes over
    under LE-1 (term 2) and compacts to 155 (seg-2: {LE-0: 100, LE-1: 155}); A, a zombie past
    its lease, uploads its pending result (seg-1: {LE-0: 123}). Seg-1 and seg-2 arrive in either
    order; seg-1 is refused either way, and the objects it would have superseded stay."""
    le0, le1 = 1, 2
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.begin_term(p.pid, 0, 0)  # A leads: LE-0
        for key, base in [("r0", 0), ("r1", 101)]:
            await store.l1_insert(
                L1Row(key, p.pid, base, base + 99, 1, le0, 100, L1State.COPY_FINISHED, 1.0, 1.0)
            )
        await _compacted_object(store, p.pid, "seg-0", 0, 100, le0)
        seg0 = CompactionCommit(p.pid, le0, {le0: 100}, ("seg-0",), ("r0",))
        assert await store.l1_compaction_commit(seg0, 2.0) is None
        # A's next pass, cut off by its pause: seg-1 uploaded, its result not yet sent.
        await _compacted_object(store, p.pid, "seg-1", 101, 123, le0)
        seg1 = CompactionCommit(p.pid, le0, {le0: 123}, ("seg-1",), ("r1",))
        await store.begin_term(p.pid, 1, 200)  # B leads: LE-1
        await _compacted_object(store, p.pid, "seg-2", 101, 155, le1)
        seg2 = CompactionCommit(p.pid, le1, {le0: 100, le1: 155}, ("seg-2",), ("r1",))
        if zombie_first:
            zombie_refusal = await store.l1_compaction_commit(seg1, 3.0)
            assert await store.l1_compaction_commit(seg2, 4.0) is None
        else:
            assert await store.l1_compaction_commit(seg2, 3.0) is None
            zombie_refusal = await store.l1_compaction_commit(seg1, 4.0)
        assert zombie_refusal is not None and "zombie" in zombie_refusal
        state = await store.l1_compaction_state(p.pid)
        assert state.cleaner_offsets == {le0: 100, le1: 155}
        assert state.compacted_keys == {"seg-0", "seg-2"}
        rows = {r.key: r.state for r in await store.l1_list(pid=p.pid)}
        assert rows == {
            "r0": L1State.DELETE_STARTED,
            "r1": L1State.DELETE_STARTED,
            "seg-0": L1State.COPY_FINISHED,
            "seg-1": L1State.COPY_STARTED,  # never valid: collected as a stale copy
            "seg-2": L1State.COPY_FINISHED,
        }
    async with await backend.open() as store:  # durable
        assert (await store.l1_compaction_state(p.pid)).cleaner_offsets == {le0: 100, le1: 155}


async def test_a_compaction_result_whose_objects_moved_is_refused_whole(backend: Backend) -> None:
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.begin_term(p.pid, 0, 0)
        await store.l1_insert(L1Row("r0", p.pid, 0, 9, 1, 1, 100, L1State.COPY_FINISHED, 1.0, 1.0))
        await _compacted_object(store, p.pid, "c0", 0, 9, 1)
        assert await store.l1_transition(
            "r0", L1State.COPY_FINISHED, L1State.DELETE_STARTED, 2.0
        )  # retention
        refusal = await store.l1_compaction_commit(CompactionCommit(p.pid, 1, {1: 9}, ("c0",), ("r0",)), 3.0)
        assert refusal is not None and "r0" in refusal
        assert (await store.l1_compaction_state(p.pid)).cleaner_offsets == {}
        assert {r.key: r.state for r in await store.l1_list(pid=p.pid)}["c0"] == L1State.COPY_STARTED


async def test_history_rows_older_than_the_bound_are_pruned_in_batches_keeping_each_tables_newest(
    backend: Backend,
) -> None:
    """Fence events, state samples, GC rounds and deleted L0 objects' rows grew without end
    (a soak: ~85 KB a minute). Pruned by age, at most `limit` rows a table per call, never a
    table's newest row (an export's watermark refers to it), never a live L0 object's row."""
    assert backend.times is not None
    async with await backend.open() as store:
        await store.create_topic("t", 1, 1, 0.0)
        (row,) = await store.list_partitions()
        old, new = [1.0, 2.0, 3.0, 4.0], [100.0, 101.0]
        await store.record_fence_events(
            [FenceEventRow(at, row.pid, 1, 1, "admitted", 1, 1, 1) for at in old + new]
        )
        await store.record_state_samples(
            [StateSampleRow(at, row.pid, 1, 0, 1, 0, 0, -1, 1, 0) for at in old + new]
        )
        for n, at in enumerate(old + [100.0]):
            await store.record_gc_round(GcRoundRow(n + 1, at - 1, at, 2, 1, False, 0, 0, 0, 0, 0, 0, None))
        for key, deleted in (("a", 1.0), ("b", None), ("c", 2.0), ("d", 100.0)):
            await store.record_l0_object(L0ObjectRow(f"level_zero/{key}", 1, 10, 0.5, 1))
            if deleted is not None:
                await store.mark_l0_deleted([f"level_zero/{key}"], deleted, 1)
        # every table: 3 at most a call
        assert await store.prune_history(50.0, 3) == 3 + 3 + 3 + 2
        assert await backend.times("fence_events", "at") == [4.0, 100.0, 101.0]
        assert await store.prune_history(50.0, 3) == 1 + 1 + 1 + 0
        assert await store.prune_history(50.0, 3) == 0
        assert await backend.times("fence_events", "at") == new
        assert await backend.times("state_samples", "at") == new
        assert await backend.times("gc_rounds", "finished_at") == [100.0]
        assert await backend.times("l0_objects", "deleted_at") == [None, 100.0]  # b lives
        # the newest row stays, however old
        assert await store.prune_history(1000.0, 10) == 1 + 1 + 0 + 0
        assert await backend.times("fence_events", "at") == [101.0]
        assert await backend.times("gc_rounds", "finished_at") == [100.0]
        assert await backend.times("l0_objects", "deleted_at") == [None, 100.0]
        assert [r.key for r in await store.l0_live_objects(10)] == ["level_zero/b"]


async def test_rows_of_l1_objects_whose_delete_is_over_are_pruned_as_history(backend: Backend) -> None:
    """Retention, DeleteRecords and compaction leave a DELETE_FINISHED row for every L1 object
    they remove, and a compaction a mark for each object it made: kept for ever (~1 MB a day for
    a partition under retention), and the housekeeper read every one of them each second. They
    are history: pruned by age as the GC's deleted L0 rows are, a live object's row never, a
    compacted object's mark once its row is gone."""
    async with await backend.open() as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.begin_term(p.pid, 0, 0)
        for n, key in enumerate(("gone-old", "gone-new", "live", "started")):
            await store.l1_insert(
                L1Row(key, p.pid, 10 * n, 10 * n + 9, 1, 1, 100, L1State.COPY_FINISHED, 1.0, 1.0)
            )
        await _compacted_object(store, p.pid, "compacted-gone", 40, 49, 1)
        await _compacted_object(store, p.pid, "compacted-live", 50, 59, 1)
        commit = CompactionCommit(p.pid, 1, {1: 59}, ("compacted-gone", "compacted-live"), ())
        assert await store.l1_compaction_commit(commit, 2.0) is None
        done = {"gone-old": 3.0, "compacted-gone": 4.0, "gone-new": 100.0}
        for key, at in done.items():
            assert await store.l1_transition(key, L1State.COPY_FINISHED, L1State.DELETE_STARTED, at)
            assert await store.l1_transition(key, L1State.DELETE_STARTED, L1State.DELETE_FINISHED, at)
        assert await store.l1_transition("started", L1State.COPY_FINISHED, L1State.DELETE_STARTED, 5.0)
        assert await store.prune_history(50.0, 10) == 2 + 1  # two rows, then the gone one's mark
        left = {r.key: r.state for r in await store.l1_list(pid=p.pid)}
        assert left == {
            "gone-new": L1State.DELETE_FINISHED,  # finished after the bound
            "live": L1State.COPY_FINISHED,
            "started": L1State.DELETE_STARTED,  # not over: resumed by `collect`
            "compacted-live": L1State.COPY_FINISHED,
        }
        assert (await store.l1_compaction_state(p.pid)).compacted_keys == frozenset({"compacted-live"})
        assert await store.prune_history(50.0, 10) == 0
