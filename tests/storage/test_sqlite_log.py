"""SqliteLogStore beyond the contract both backends share (test_log_store_contract.py): group
commit statistics, durability across SIGKILL, a random walk against a model, bad files, SQLite
failures mid-batch."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import tempfile

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from levelzero.testing.entries import placeholder
from levelzero.core.entries import (
    LogRecord,
    TermStart,
)
from levelzero.core.errors import (
    CorruptData,
    InvalidInput,
    NotLeader,
    PartitionDeleted,
    ShuttingDown,
    StorageError,
)
from levelzero.storage.protocols import (
    FenceEventRow,
    GcRoundRow,
    L0ObjectRow,
    L1Row,
    L1State,
    Snapshot,
    StateSampleRow,
)
from levelzero.storage.sqlite import SCHEMA_VERSION, SqliteLogStore
from levelzero.storage.sqlite import store as store_module
from levelzero.storage.protocols import Append
from levelzero.storage.sqlite.schema import LOG_COLUMNS, LOG_PLACEHOLDERS_INDEX, LOG_TABLE

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from sqlite_log_crash_writer import RECORDS_PER_APPEND, expected_record  # noqa: E402


def placeholder_record(
    log_offset: int, term: int, base_offset: int, epoch: int = 1, count: int = 1
) -> LogRecord:
    entry = placeholder(
        epoch, count, object_key=f"level_zero/data/000/{epoch:018}/obj-{log_offset}", checksum=log_offset
    )
    return LogRecord(log_offset=log_offset, term=term, base_offset=base_offset, entry=entry)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "log.db"


def drop_fence_events(db: Path) -> None:
    """Sabotage behind the store's back: a batch with fence events fails from now on."""
    with sqlite3.connect(db) as connection:
        connection.execute("DROP TABLE fence_events")


async def storage_error_into(errors: list[BaseException], call: Callable[[], Awaitable[object]]) -> None:
    """Await `call()`; a StorageError it raises goes into `errors` (for task groups)."""
    try:
        await call()
    except StorageError as error:
        errors.append(error)


# ---------------------------------------------------------------------- group commit


async def test_statistics_is_an_immutable_snapshot(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        stats = store.statistics()
        with pytest.raises(AttributeError):
            stats.commits = 5  # type: ignore[misc]
        (row,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(row.pid, 0, [placeholder_record(0, 0, 0)])
        assert stats.commits == 0 and stats.appends == 0
        assert store.statistics().commits == 2 and store.statistics().appends == 1


async def test_batch_never_exceeds_group_commit_max_records(db: Path) -> None:
    async with await SqliteLogStore.open(db, group_commit_max_records=8) as store:
        rows = await store.create_topic("t", 10, 1, 0.0)

        async def appender(pid: int) -> None:
            for index in range(5):
                await store.append(pid, 0, [placeholder_record(2 * index + i, 0, 0) for i in range(2)])

        async with anyio.create_task_group() as tg:
            for row in rows:
                tg.start_soon(appender, row.pid)
        stats = store.statistics()
        assert stats.records == 100
        assert stats.largest_batch_records == 8
        with pytest.raises(InvalidInput, match="group_commit_max_records"):
            await store.append(rows[0].pid, 0, [placeholder_record(10 + i, 0, 0) for i in range(9)])


# ---------------------------------------------------------------------- crash


def test_sigkill_keeps_every_acknowledged_append_whole(db: Path) -> None:
    """A child appends and reports acks; SIGKILL it mid-stream; every ack must be on disk and
    every record on disk must decode, and appends are all-or-nothing."""
    partitions, acks_wanted = 8, 300
    child = subprocess.Popen(
        [sys.executable, str(HERE / "sqlite_log_crash_writer.py"), str(db), str(partitions)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: dict[int, int] = {}  # pid -> log offset after its last acknowledged append
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n", child.stderr.read() if child.stderr else ""

        # The child holds the lock: nobody else may open the file meanwhile.
        async def second_open() -> None:
            with pytest.raises(StorageError, match="already open") as caught:
                await SqliteLogStore.open(db)
            assert str(db) in str(caught.value)

        anyio.run(second_open)
        for _ in range(acks_wanted):
            line = child.stdout.readline()
            assert line.startswith("ack "), (line, child.stderr.read() if child.stderr else "")
            _, pid, first, count = line.split()
            acked[int(pid)] = max(acked.get(int(pid), 0), int(first) + int(count))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]
        child.stderr.close()  # type: ignore[union-attr]
    assert child.returncode == -signal.SIGKILL

    async def verify() -> None:
        async with await SqliteLogStore.open(db) as store:
            for row in await store.list_partitions():
                records = await store.read_log(row.pid, 0)  # raises CorruptData if not whole
                assert len(records) >= acked.get(row.pid, 0)
                assert len(records) % RECORDS_PER_APPEND == 0  # no half-written append
                assert records == [expected_record(row.pid, o) for o in range(len(records))]
                # The log continues where the crash left it.
                n = len(records)
                await store.append(row.pid, 0, [expected_record(row.pid, n)])

    anyio.run(verify)
    assert sum(acked.values()) >= acks_wanted * RECORDS_PER_APPEND


# ---------------------------------------------------------------------- terms


_op = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 4), st.booleans()),
    st.tuples(st.just("begin_term")),
    st.tuples(st.just("snapshot_truncate")),
)
_step = st.one_of(
    st.dictionaries(st.integers(0, 3), _op, min_size=1),
    st.just({"reopen": ("reopen",)}),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_step, max_size=12))
def test_random_concurrent_operations_match_a_simple_model(steps) -> None:
    """Whatever mix of appends (current or stale term), term changes, snapshots, truncations
    and reopens, the log reads back exactly as a list-per-partition model says."""

    class Model:
        def __init__(self) -> None:
            self.records: list[LogRecord] = []
            self.term = 0
            self.truncated_below = 0

    async def run_op(store: SqliteLogStore, pid: int, model: Model, op: tuple) -> None:
        match op:
            case ("append", count, stale):
                term = model.term + 1 if stale else model.term
                first = len(model.records)
                records = [placeholder_record(first + i, term, 0) for i in range(count)]
                if stale:
                    with pytest.raises(NotLeader):
                        await store.append(pid, term, records)
                else:
                    await store.append(pid, term, records)
                    model.records += records
            case ("begin_term",):
                record = await store.begin_term(pid, len(model.records), 0)
                model.term += 1
                assert record == LogRecord(len(model.records), model.term, 0, TermStart(model.term))
                model.records.append(record)
            case ("snapshot_truncate",):
                last = len(model.records) - 1
                await store.save_snapshot(Snapshot(pid, last, b"s"))
                await store.truncate_below(pid, last + 1)
                model.truncated_below = max(0, last + 1)

    async def open_store(path: str) -> SqliteLogStore:
        return await SqliteLogStore.open(path, synchronous="NORMAL", group_commit_max_records=6)

    async def scenario(path: str) -> None:
        store = await open_store(path)
        try:
            rows = await store.create_topic("t", 4, 1, 0.0)
            models = {row.pid: Model() for row in rows}
            pids = [row.pid for row in rows]
            for step in steps:
                if "reopen" in step:
                    await store.aclose()
                    store = await open_store(path)
                    continue
                async with anyio.create_task_group() as tg:
                    for index, op in step.items():
                        tg.start_soon(run_op, store, pids[index], models[pids[index]], op)
            for pid, model in models.items():
                assert await store.read_log(pid, 0) == model.records[model.truncated_below :]
            assert {p.pid: p.term for p in await store.list_partitions()} == {
                pid: model.term for pid, model in models.items()
            }
        finally:
            await store.aclose()

    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(scenario, f"{tmp}/log.db")


# ---------------------------------------------------------------------- snapshots and reads


# ---------------------------------------------------------------------- bad input


async def test_file_that_is_not_sqlite_is_refused_naming_it(db: Path) -> None:
    db.write_bytes(os.urandom(8192))
    with pytest.raises(StorageError, match="cannot open as a levelzero log store") as caught:
        await SqliteLogStore.open(db)
    assert str(db) in str(caught.value)
    db.write_bytes(b"\0" * 100)  # the lock was released: a retry reaches the same check
    with pytest.raises(StorageError, match=str(db)):
        await SqliteLogStore.open(db)


async def test_newer_schema_version_is_refused(db: Path) -> None:
    async with await SqliteLogStore.open(db):
        pass
    with sqlite3.connect(db) as connection:
        connection.execute("PRAGMA user_version = 99")
    with pytest.raises(StorageError, match="schema version 99 is newer") as caught:
        await SqliteLogStore.open(db)
    assert str(db) in str(caught.value)


async def test_unknown_sqlite_database_is_refused(db: Path) -> None:
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE something_else (x)")
    with pytest.raises(StorageError, match="unknown schema version 0"):
        await SqliteLogStore.open(db)


async def test_corrupt_entry_blob_raises_corrupt_data_naming_partition_and_offset(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        (_, p) = await store.create_topic("t", 2, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(o, 0, o) for o in range(3)])
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE log SET entry = ? WHERE pid = ? AND log_offset = 1", (b"\xc1garbage", p.pid)
        )
    async with await SqliteLogStore.open(db) as store:
        assert await store.read_log(p.pid, 2) == [placeholder_record(2, 0, 2)]
        with pytest.raises(CorruptData) as caught:
            await store.read_log(p.pid, 0)
        message = str(caught.value)
        assert str(db) in message and f"pid={p.pid}" in message
        assert "t/1" in message and "log offset 1" in message
        with pytest.raises(CorruptData, match="log offset 1"):
            await store.read_placeholders(p.pid, 0, 10)


async def test_entry_blob_of_another_kind_is_corrupt(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
    with sqlite3.connect(db) as connection:
        blob = msgspec.msgpack.encode(TermStart(7))
        connection.execute("UPDATE log SET entry = ?", (blob,))
    async with await SqliteLogStore.open(db) as store:
        with pytest.raises(CorruptData, match="holds term_start, row says placeholder"):
            await store.read_log(p.pid, 0)


async def test_second_open_of_a_locked_file_is_refused(db: Path) -> None:
    async with await SqliteLogStore.open(db):
        with pytest.raises(StorageError, match="already open") as caught:
            await SqliteLogStore.open(db)
        assert str(db) in str(caught.value) and f"process {os.getpid()}" in str(caught.value)
    async with await SqliteLogStore.open(db):  # released on close
        pass


async def test_bad_options_are_refused(db: Path) -> None:
    with pytest.raises(InvalidInput, match="synchronous"):
        await SqliteLogStore.open(db, synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="queue_max"):
        await SqliteLogStore.open(db, queue_max=0)
    with pytest.raises(StorageError, match="lock file"):
        await SqliteLogStore.open(db.parent / "missing-dir" / "x.db")


async def test_a_file_of_schema_1_is_migrated_to_the_current_version_once(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
        await store.l1_insert(l1_row("old-l1", p.pid, 0, L1State.COPY_FINISHED))
    with sqlite3.connect(db) as connection:  # what the first release wrote: schema 1
        connection.execute("DROP TABLE consumer_offsets")
        connection.execute("DROP TABLE producer_batches")
        connection.execute("DROP TABLE topic_configs")
        connection.execute("DROP TABLE deleted_partitions")
        connection.execute("DROP TABLE transactions")
        connection.execute("DROP TABLE txn_ranges")
        connection.execute("DROP TABLE cleaner_offsets")
        connection.execute("DROP TABLE l1_compacted")
        connection.execute("DROP TABLE group_metadata")
        connection.execute("DROP INDEX l0_objects_live")
        connection.execute("ALTER TABLE fence_events DROP COLUMN decisions")
        connection.execute("ALTER TABLE l1_objects DROP COLUMN max_timestamp_ms")
        connection.execute("PRAGMA user_version = 1")
    assert SCHEMA_VERSION == 11
    for _ in range(2):  # the second open finds nothing to migrate
        async with await SqliteLogStore.open(db) as store:
            assert [r.log_offset for r in await store.read_log(p.pid, 0)] == [0]
            # An L1 row from before schema 8 has no largest timestamp: a lookup by time reads it.
            (old_l1,) = await store.l1_list(pid=p.pid)
            assert (old_l1.key, old_l1.max_timestamp_ms) == ("old-l1", None)
        with sqlite3.connect(db) as connection:
            assert connection.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
            names = {n for (n,) in connection.execute("SELECT name FROM sqlite_master")}
            assert {
                "consumer_offsets",
                "producer_batches",
                "l0_objects_live",
                "topic_configs",
                "deleted_partitions",
                "transactions",
                "txn_ranges",
                "cleaner_offsets",
                "l1_compacted",
            } <= names
            columns = {row[1] for row in connection.execute("PRAGMA table_info(fence_events)")}
            assert "decisions" in columns
            columns = {row[1] for row in connection.execute("PRAGMA table_info(consumer_offsets)")}
            assert "leader_epoch" in columns


async def test_a_file_of_schema_2_gets_its_log_table_in_order_of_appends(db: Path) -> None:
    """Schema 3 keeps the log as a rowid table (one page written per commit's worth of entries,
    not one per partition in it); a file of schema 2, clustered on (pid, log_offset), is
    rebuilt at open with every entry kept, and appends go on where its log ended."""
    async with await SqliteLogStore.open(db) as store:
        rows = await store.create_topic("t", 3, 1, 0.0)
        for n in range(4):
            for row in rows:
                await store.append(row.pid, 0, [placeholder_record(n, 0, n * 10, count=10)])
        before = {row.pid: await store.read_log(row.pid, 0) for row in rows}
    columns = ", ".join(LOG_COLUMNS)
    with sqlite3.connect(db) as connection:  # the layout of schema 1 and 2
        connection.execute("ALTER TABLE log RENAME TO log_v3")
        connection.execute("DROP INDEX log_placeholders")
        connection.execute(
            LOG_TABLE.replace("UNIQUE (pid, log_offset)\n)", "PRIMARY KEY (pid, log_offset)\n) WITHOUT ROWID")
        )
        connection.execute(f"INSERT INTO log ({columns}) SELECT {columns} FROM log_v3")  # noqa: S608 (our columns)
        connection.execute("DROP TABLE log_v3")
        connection.execute(LOG_PLACEHOLDERS_INDEX)
        connection.execute("PRAGMA user_version = 2")
        assert (
            "WITHOUT ROWID"
            in connection.execute("SELECT sql FROM sqlite_master WHERE name = 'log'").fetchone()[0]
        )
    async with await SqliteLogStore.open(db) as store:
        assert {row.pid: await store.read_log(row.pid, 0) for row in rows} == before
        assert [r.log_offset for r in await store.read_placeholders(rows[1].pid, 25, 10)] == [2, 3]
        await store.append(rows[0].pid, 0, [placeholder_record(4, 0, 40, count=10)])
        assert [r.log_offset for r in await store.read_log(rows[0].pid, 3)] == [3, 4]
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        sql = connection.execute("SELECT sql FROM sqlite_master WHERE name = 'log'").fetchone()[0]
        assert "WITHOUT ROWID" not in sql and "UNIQUE (pid, log_offset)" in sql
        names = {n for (n,) in connection.execute("SELECT name FROM sqlite_master")}
        assert "log_placeholders" in names and "log_v3" not in names


async def test_append_many_past_the_group_commit_bound_is_split_into_jobs(db: Path) -> None:
    """An appender's call may hold more records than one group commit takes: it becomes as many
    jobs as it needs, each within `group_commit_max_records`, and every partition's records land."""
    async with await SqliteLogStore.open(db, group_commit_max_records=8) as store:
        rows = await store.create_topic("t", 5, 1, 0.0)
        before = store.statistics()
        refused = await store.append_many(
            [Append(row.pid, 0, [placeholder_record(i, 0, i) for i in range(3)]) for row in rows]
        )
        assert refused == [None] * 5
        after = store.statistics()
        assert after.appends - before.appends == 5 and after.records - before.records == 15
        assert after.largest_batch_records <= 8
        for row in rows:
            assert [r.log_offset for r in await store.read_log(row.pid, 0)] == [0, 1, 2]
        with pytest.raises(InvalidInput, match="group_commit_max_records"):
            await store.append_many(
                [Append(rows[0].pid, 0, [placeholder_record(3 + i, 0, 3 + i) for i in range(9)])]
            )


async def test_append_many_of_a_crowd_tells_each_partition_at_its_own_batchs_commit(db: Path) -> None:
    """A call of 2 * SPLIT_JOBS_MIN partitions (the node's appender sends every waiting partition
    in one) goes to the writer as two batches, and the first batch's partitions are told when it
    committed, while the second is still on its way: so their writers write again meanwhile.
    (Held here by keeping the writer process's second answer from the store.)"""
    count = 2 * store_module.SPLIT_JOBS_MIN
    async with await SqliteLogStore.open(db) as store:
        rows = await store.create_topic("t", count, 1, 0.0)
        process = store._process
        receive = process.receive
        answers = 0
        second_answer = anyio.Event()

        async def held_receive() -> str | None:
            nonlocal answers
            answers += 1
            if answers == 2:
                await second_answer.wait()
            return await receive()

        process.receive = held_receive  # type: ignore[method-assign]
        before = store.statistics()
        told: list[tuple[int, int]] = []  # (index, commits when told)
        answered: list[list[NotLeader | None]] = []

        async def call() -> None:
            answered.append(
                await store.append_many(
                    [Append(row.pid, 0, [placeholder_record(0, 0, 0)]) for row in rows],
                    lambda index, refusal: told.append((index, store.statistics().commits)),
                )
            )

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            for _ in range(2_000):  # bounded: the first batch commits without the second
                if told:
                    break
                await anyio.sleep(0.01)
            assert told == [(i, before.commits + 1) for i in range(count // 2)]
            assert not answered
            second_answer.set()
        assert answered == [[None] * count]
        assert told[count // 2 :] == [(i, before.commits + 2) for i in range(count // 2, count)]
        after = store.statistics()
        assert after.commits - before.commits == 2 and after.records - before.records == count
        for row in rows:
            assert [r.log_offset for r in await store.read_log(row.pid, 0)] == [0]


async def test_append_many_of_fewer_partitions_is_one_commit(db: Path) -> None:
    """Below 2 * SPLIT_JOBS_MIN partitions a call is one batch: halves of fewer partitions are
    not worth a second fsync (and a closed loop's halves then stay two batches)."""
    count = 2 * store_module.SPLIT_JOBS_MIN - 1
    async with await SqliteLogStore.open(db) as store:
        rows = await store.create_topic("t", count, 1, 0.0)
        before = store.statistics()
        told: list[int] = []
        refused = await store.append_many(
            [Append(row.pid, 0, [placeholder_record(0, 0, 0)]) for row in rows],
            lambda index, refusal: told.append(index),
        )
        assert refused == [None] * count and told == list(range(count))
        after = store.statistics()
        assert after.commits - before.commits == 1 and after.records - before.records == count


async def test_synchronous_mode_and_wal_are_applied(db: Path) -> None:
    async with await SqliteLogStore.open(db, synchronous="NORMAL") as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
        assert (await store._writer.execute_fetchall("PRAGMA synchronous"))[0][0] == 1
    with sqlite3.connect(db) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    async with await SqliteLogStore.open(db) as store:
        assert (await store._writer.execute_fetchall("PRAGMA synchronous"))[0][0] == 2


# ---------------------------------------------------------------------- cluster epoch, topics


# ---------------------------------------------------------------------- L1 and events


def l1_row(key: str, pid: int, base: int, state: str = L1State.COPY_STARTED) -> L1Row:
    return L1Row(key, pid, base, base + 9, base + 2, 1, 1000, state, 1.0, 1.0)


async def test_event_rows_are_readable_with_plain_sql(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0, epoch=3, count=7)])
        await store.record_l0_object(L0ObjectRow("obj-a", 3, 500, 1.0, 2))
        await store.record_l0_object(L0ObjectRow("obj-b", 4, 600, 1.5, 1))
        await store.record_l0_object(L0ObjectRow("obj-a", 9, 9, 9.0, 9))  # replay: first wins
        await store.mark_l0_deleted(["obj-a", "unknown"], at=5.0, m=3)
        await store.mark_l0_deleted(["obj-a"], at=6.0, m=4)  # already deleted: unchanged
        gc_round = GcRoundRow(1, 5.0, 5.5, 6, 3, False, 2, 1, 500, 0, 1, 0, None)
        await store.record_gc_round(gc_round)
        fence = FenceEventRow(1.0, p.pid, 1, 3, "admitted", 2, 3)
        sample = StateSampleRow(2.0, p.pid, 1, 2, 3, 2, 1, 4, 7, 0)
        async with anyio.create_task_group() as tg:  # concurrent: staged in one batch
            tg.start_soon(store.record_fence_events, [fence, fence])
            tg.start_soon(store.record_state_samples, [sample])
            tg.start_soon(store.record_fence_events, [])

    with sqlite3.connect(db) as connection:
        assert connection.execute(
            "SELECT kind, epoch, record_count, byte_length, object_key FROM log"
        ).fetchall() == [("placeholder", 3, 7, 70, f"level_zero/data/000/{3:018}/obj-0")]
        assert connection.execute("SELECT * FROM l0_objects ORDER BY key").fetchall() == [
            ("obj-a", 3, 500, 1.0, 2, 5.0, 3),
            ("obj-b", 4, 600, 1.5, 1, None, None),
        ]
        assert connection.execute("SELECT * FROM gc_rounds").fetchall() == [
            tuple(int(v) if isinstance(v, bool) else v for v in msgspec.structs.astuple(gc_round))
        ]
        assert (
            connection.execute("SELECT * FROM fence_events").fetchall()
            == [msgspec.structs.astuple(fence)] * 2
        )
        assert connection.execute("SELECT * FROM state_samples").fetchall() == [
            msgspec.structs.astuple(sample)
        ]
        # The export reads these tables by name: their columns are the row structs' fields.
        for table, row_type in [
            ("l1_objects", L1Row),
            ("l0_objects", L0ObjectRow),
            ("gc_rounds", GcRoundRow),
            ("fence_events", FenceEventRow),
            ("state_samples", StateSampleRow),
        ]:
            columns = [c[1] for c in connection.execute(f"PRAGMA table_info({table})")]
            assert tuple(columns) == row_type.__struct_fields__, table


# ---------------------------------------------------------------------- lifecycle


async def test_open_in_runs_the_writer_in_the_callers_task_group(db: Path) -> None:
    async with anyio.create_task_group() as tg:
        store = await SqliteLogStore.open_in(tg, db)
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
        await store.aclose()
    async with anyio.create_task_group() as tg, await SqliteLogStore.open_in(tg, db) as store:
        assert await store.read_log(p.pid, 0) == [placeholder_record(0, 0, 0)]


async def test_open_then_aclose_without_context_manager(db: Path) -> None:
    store = await SqliteLogStore.open(db)
    try:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
    finally:
        await store.aclose()
    await store.aclose()  # idempotent
    with pytest.raises(ShuttingDown):
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
    with pytest.raises(ShuttingDown):
        await store.read_log(p.pid, 0)


async def test_sqlite_failure_mid_batch_fails_the_batch_and_refuses_writes(db: Path) -> None:
    async with await SqliteLogStore.open(db) as store:
        (p,) = await store.create_topic("t", 1, 1, 0.0)
        await store.append(p.pid, 0, [placeholder_record(0, 0, 0)])
        drop_fence_events(db)
        fence = FenceEventRow(1.0, p.pid, 0, 1, "admitted", 1, 1)
        errors: list[BaseException] = []

        async with anyio.create_task_group() as tg:  # one batch: the append shares its fate
            tg.start_soon(
                storage_error_into, errors, lambda: store.append(p.pid, 0, [placeholder_record(1, 0, 1)])
            )
            tg.start_soon(storage_error_into, errors, lambda: store.record_fence_events([fence]))
        assert len(errors) == 2 and all("refuses writes" in str(e) for e in errors)
        assert store.statistics().failed
        with pytest.raises(StorageError, match="until the daemon restarts"):
            await store.append(p.pid, 0, [placeholder_record(1, 0, 1)])
        assert await store.read_log(p.pid, 0) == [placeholder_record(0, 0, 0)]  # reads still work
    with pytest.raises(StorageError, match="lacks tables fence_events"):
        await SqliteLogStore.open(db)


async def test_fence_event_decisions_are_added_to_old_files(tmp_path: Path) -> None:
    """Files made before fence_events.decisions get the column on open; their rows count one
    decision each, and new rows carry their own count."""
    path = tmp_path / "log.db"
    async with await SqliteLogStore.open(path) as log_store:
        (p,) = await log_store.create_topic("t", 1, 1, 0.0)
    with sqlite3.connect(path) as connection:
        connection.execute("ALTER TABLE fence_events DROP COLUMN decisions")
        connection.execute("INSERT INTO fence_events VALUES (1.0, ?, 1, 3, 'admitted', 3, 3)", (p.pid,))
        connection.execute("PRAGMA user_version = 1")  # such files are all of schema 1
    async with await SqliteLogStore.open(path) as log_store:
        await log_store.record_fence_events([FenceEventRow(2.0, p.pid, 1, 3, "admitted", 3, 3, decisions=41)])
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT at, decisions FROM fence_events ORDER BY at").fetchall()
        columns = [c[1] for c in connection.execute("PRAGMA table_info(fence_events)")]
    assert rows == [(1.0, 1), (2.0, 41)]
    assert tuple(columns) == FenceEventRow.__struct_fields__


async def test_a_collected_deleted_partition_holds_no_tombstone_after_a_restart(tmp_path: Path) -> None:
    """Every partition ever deleted had its writer's tombstone reloaded at each start (170 B
    each, for ever: a client making and deleting topics grew it). Once collected, none is kept;
    an uncollected one still refuses its writes, and new ids stay above every id ever given."""
    db = tmp_path / "levelzero.db"
    async with await SqliteLogStore.open(str(db)) as store:
        gone = await store.create_topic("gone", 2, 1, 0.0)
        waiting = await store.create_topic("waiting", 1, 1, 0.0)
        await store.delete_topic("gone", 1.0)
        await store.delete_topic("waiting", 1.0)
        for row in gone:
            assert await store.forget_deleted_partition(row.pid)
    async with await SqliteLogStore.open(str(db)) as store:
        assert sorted(store._cursors) == [waiting[0].pid]
        with pytest.raises(PartitionDeleted):
            await store.append(waiting[0].pid, 0, [])
        (new,) = await store.create_topic("new", 1, 1, 0.0)
        assert new.pid > waiting[0].pid > max(r.pid for r in gone)
