"""The durable `LogStore`: partition logs, snapshots, cluster epoch, L1 metastore and event tables
in one SQLite database (aiosqlite), written through one group-committing writer task.

Why one writer: SQLite admits one writer at a time anyway. Funnelling every write through one
task lets it take *all* pending appends, check their terms against an in-memory cursor per
partition, and make them durable with one `executemany` and one commit — the fsync is paid once
per batch, not once per append. The in-memory cursors are only right because nothing else writes
the database: a lock file (`flock` on `<db>.lock`) keeps a second store, in this process or
another, out.

Where a batch is executed: a batch of staged rows only (appends, event rows: nearly every
batch) goes to the writer process (`writer_process.py`), which runs it on its own connection
beside the event loop instead of taking turns with it for the GIL. Up to
`SENT_BATCHES_MAX` such batches are on their way at once, each staged on the cursors the
previous one leaves, so one commit's fsync overlaps the loop's work on the next batch. A batch
with `run` jobs (own statements, results read back) waits until the process has answered every
batch sent, then runs here on the store's own connection. Both connections write the same file,
strictly one after the other.

Reads use a third, query-only connection: in WAL mode it sees every committed batch without
queueing behind the writer's fsync.

A batch is one transaction, so an append is durable when it returns and an unacknowledged one is
either wholly there or wholly absent after a crash. If SQLite itself fails mid-batch (disk full,
I/O error), or the writer process ends, the store stops accepting writes: the in-memory cursors
can no longer be trusted, and reopening rebuilds them from the file.

Shape (structured concurrency): the writer runs in an anyio task group —
- `await SqliteLogStore.open_in(task_group, path)`: in the caller's task group (the daemon's);
- `await SqliteLogStore.open(path)`: in a task group the store owns, entered by `open()` and
  exited by `aclose()`. anyio requires both calls in the same task, with every cancel scope or
  task group opened in between already closed; `async with await SqliteLogStore.open(path) as
  store:` guarantees that. (A pytest-asyncio fixture does not: its setup and teardown run in
  different tasks. Use `open_in` there, or open the store inside the test.)
Either way `aclose()` lets the writer finish every queued write, then closes the connections and
releases the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import aiosqlite
import anyio
import anyio.abc
import msgspec

from levelzero.core.entries import ENTRY_KINDS, LogRecord, TermStart, decode_entry
from levelzero.core.errors import (
    CorruptData,
    InvalidInput,
    InvariantViolation,
    LevelZeroError,
    LogMovedOn,
    NotLeader,
    PartitionDeleted,
    SnapshotSuperseded,
    ShuttingDown,
    StorageError,
    StoreNeedsRestart,
    TopicExists,
    UnknownTopic,
)
from levelzero.storage.protocols import (
    TransactionRow,
    TxnRangeRow,
    Append,
    OnDurable,
    CompactionCommit,
    CompactionState,
    L1State,
    FenceEventRow,
    GcRoundRow,
    L0ObjectRow,
    L1Row,
    LogStoreStatistics,
    OffsetRow,
    PartitionRow,
    ProducerBatchRow,
    Snapshot,
    StateSampleRow,
)
from levelzero.storage.history import HISTORY_TABLES, prune_statement
from levelzero.storage.lifecycle import StoreLifecycle
from levelzero.storage.sqlite import writer_process

from levelzero.storage.log_rules import (
    check_append_records,
    check_call_records,
    check_cluster_epoch,
    check_create_topic,
    check_l1_state,
    compaction_commit_refusal,
    log_row,
)

from .lockfile import lock_exclusively
from .schema import (
    INSERT_FENCE_EVENT,
    INSERT_GC_ROUND,
    INSERT_L0,
    INSERT_L1,
    INSERT_LOG,
    INSERT_STATE_SAMPLE,
    INSERT_PRODUCER_BATCH,
    ABORT_TXN_RANGE,
    DELETE_TXN_RANGE,
    INSERT_TXN_RANGE,
    SELECT_TRANSACTIONS,
    EXPIRE_TRANSACTION,
    SELECT_TXN_RANGES,
    PRUNE_TXN_RANGES,
    UPSERT_TRANSACTION,
    PRUNE_PRODUCER_BATCHES,
    EXPIRE_PRODUCER_BATCHES,
    SELECT_OFFSETS,
    SELECT_METADATA_GROUPS,
    SELECT_OFFSET_GROUPS,
    DELETE_GROUP_OFFSETS,
    DELETE_OFFSET,
    EXPIRE_OFFSETS,
    DELETE_GROUP_METADATA,
    SELECT_GROUP_METADATA,
    UPSERT_GROUP_METADATA,
    SELECT_PRODUCER_BATCHES,
    UPSERT_OFFSET,
    MARK_L0_DELETED,
    SELECT_L1,
    SELECT_LOG,
    SELECT_LOG_ENDS,
    SELECT_PLACEHOLDERS,
    UPDATE_TERM,
    DELETE_TOPIC_CONFIGS,
    INSERT_TOPIC_CONFIG,
    SELECT_TOPIC_CONFIGS,
    check_or_create_schema,
)
from .staging import Batch, Cursor, Job, stage_job
from .writer_link import WriterProcess

GROUP_COMMIT_MAX_RECORDS = 4096  # records (or event rows) per batch; also the per-call maximum
QUEUE_MAX = 1024  # write jobs waiting for the writer before callers block
BUSY_TIMEOUT_MS = 5000
SENT_BATCHES_MAX = 2  # batches sent to the writer process and not yet answered
SPLIT_JOBS_MIN = 32  # this many waiting jobs, with none sent, go out as two batches
WRITER_ANSWER_TIMEOUT_S = 120.0  # for one batch's commit, then the store refuses writes
_JSON_ENCODE = msgspec.json.Encoder().encode

Synchronous = Literal["FULL", "NORMAL"]


class _Sent(NamedTuple):
    """A batch sent to the writer process, waiting for its commit."""

    jobs: list[Job]
    log_records: int


class SqliteLogStore(StoreLifecycle):
    """`LogStore` on SQLite. Create with `open` or `open_in`, never directly."""

    def __init__(
        self,
        path: str,
        lock_fd: int,
        writer: aiosqlite.Connection,
        reader: aiosqlite.Connection,
        cursors: dict[int, Cursor],
        process: WriterProcess,
        *,
        group_commit_max_records: int,
        queue_max: int,
        clock: Callable[[], float],
    ) -> None:
        self._path = path
        self._lock_fd: int | None = lock_fd
        self._writer = writer
        self._reader = _Reads(reader, path)
        # Owned by the writer task: committed state plus the batches sent to the writer
        # process (if one of those fails, the store refuses every write until the daemon restarts).
        self._cursors = cursors
        self._process = process
        self._sent: deque[_Sent] = deque()  # in the order the process answers them
        # Raised (and replaced) whenever `_sent` changes. An asyncio event: anyio's looks up
        # the async backend on every creation, twice a batch (levelzero runs on asyncio).
        self._sent_changed = asyncio.Event()
        self._group_commit_max_records = group_commit_max_records
        self._queue_max = queue_max
        self._clock = clock
        self._job_send, self._job_receive = anyio.create_memory_object_stream[Job](queue_max)
        self._writer_done = anyio.Event()
        self._writer_started = False
        self._owned_task_group: anyio.abc.TaskGroup | None = None
        self._closed = False
        self._failure: StorageError | None = None
        self._batches = 0
        self._commits = 0
        self._jobs = 0
        self._appends = 0
        self._records = 0
        self._rejected_appends = 0
        self._largest_batch_records = 0

    # ------------------------------------------------------------------ open / close

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        group_commit_max_records: int = GROUP_COMMIT_MAX_RECORDS,
        queue_max: int = QUEUE_MAX,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        clock: Callable[[], float] = time.time,
    ) -> SqliteLogStore:
        """Open (creating if needed) with the writer in a task group the store owns; call
        `aclose()` from this same task (or use `async with await SqliteLogStore.open(...)`)."""
        store = await cls._open_files(
            path, synchronous, group_commit_max_records, queue_max, busy_timeout_ms, clock
        )
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        try:
            await task_group.start(store._run_writer)
        except BaseException as error:
            await store._stop_writer()
            await task_group.__aexit__(type(error), error, error.__traceback__)
            await store._close_files()
            raise
        store._owned_task_group = task_group
        return store

    @classmethod
    async def open_in(
        cls,
        task_group: anyio.abc.TaskGroup,
        path: str | os.PathLike[str],
        *,
        synchronous: Synchronous = "FULL",
        group_commit_max_records: int = GROUP_COMMIT_MAX_RECORDS,
        queue_max: int = QUEUE_MAX,
        busy_timeout_ms: int = BUSY_TIMEOUT_MS,
        clock: Callable[[], float] = time.time,
    ) -> SqliteLogStore:
        """Open (creating if needed) with the writer running in `task_group`; call `aclose()`
        before the task group ends or the group waits for the writer forever."""
        store = await cls._open_files(
            path, synchronous, group_commit_max_records, queue_max, busy_timeout_ms, clock
        )
        try:
            await task_group.start(store._run_writer)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await store._close_files()
            raise
        return store

    async def _release(self) -> None:
        """Close the database and release the lock (`StoreLifecycle.aclose` calls this last)."""
        await self._close_files()

    @property
    def path(self) -> str:
        return self._path

    @property
    def writer_pid(self) -> int:
        """The process id of the writer process (it shows in `ps` as `writer_process.py`)."""
        return self._process.pid

    def statistics(self) -> LogStoreStatistics:
        return LogStoreStatistics(
            batches=self._batches,
            commits=self._commits,
            jobs=self._jobs,
            appends=self._appends,
            records=self._records,
            rejected_appends=self._rejected_appends,
            largest_batch_records=self._largest_batch_records,
            queued=self._job_send.statistics().current_buffer_used,
            queue_max=self._queue_max,
            failed=self._failure is not None,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else "failed" if self._failure else "open"
        return f"<SqliteLogStore {self._path} {state}>"

    @classmethod
    async def _open_files(
        cls,
        path: str | os.PathLike[str],
        synchronous: str,
        group_commit_max_records: int,
        queue_max: int,
        busy_timeout_ms: int,
        clock: Callable[[], float],
    ) -> SqliteLogStore:
        """Lock, connect, check or create the schema and load the writer's cursors."""
        if synchronous not in ("FULL", "NORMAL"):
            raise InvalidInput(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        for name, value, high in (
            ("group_commit_max_records", group_commit_max_records, 1_000_000),
            ("queue_max", queue_max, 1_000_000),
            ("busy_timeout_ms", busy_timeout_ms, 3_600_000),
        ):
            if not (isinstance(value, int) and 1 <= value <= high):
                raise InvalidInput(f"{name} must be an integer in [1, {high}], not {value!r}")
        db_path = os.path.abspath(os.fspath(path))
        lock_fd = await lock_exclusively(db_path)
        writer = reader = None
        try:
            # "IMMEDIATE": sqlite3 begins the batch's transaction in the same thread hop as its
            # first write statement (saves one hop per batch); reads and PRAGMAs never begin one.
            writer = await aiosqlite.connect(db_path, isolation_level="IMMEDIATE")
            await writer.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            await check_or_create_schema(writer, db_path)
            await writer.execute(f"PRAGMA synchronous = {synchronous}")
            cursors = await _load_cursors(writer)
            reader = await aiosqlite.connect(db_path, isolation_level=None)
            await reader.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            await reader.execute("PRAGMA query_only = ON")
            process = await WriterProcess.start(db_path, lock_fd, synchronous, busy_timeout_ms)
        except BaseException as error:
            with anyio.CancelScope(shield=True):
                for connection in (reader, writer):
                    if connection is not None:
                        await connection.close()
            os.close(lock_fd)
            if isinstance(error, sqlite3.DatabaseError):
                raise StorageError(f"{db_path}: cannot open as a levelzero log store: {error}") from error
            raise
        return cls(
            db_path,
            lock_fd,
            writer,
            reader,
            cursors,
            process,
            group_commit_max_records=group_commit_max_records,
            queue_max=queue_max,
            clock=clock,
        )

    async def _stop_writer(self) -> None:
        """Close the queue; the writer drains what is buffered, then ends."""
        await self._job_send.aclose()
        if self._writer_started:
            await self._writer_done.wait()

    async def _close_files(self) -> None:
        try:
            try:
                await self._process.stop()  # before the lock: it shares it until it is gone
            finally:
                try:
                    await self._reader.close()
                finally:
                    await self._writer.close()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None

    # ------------------------------------------------------------------ the writer task

    async def _run_writer(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Take pending writes (up to `group_commit_max_records`), execute them as one
        transaction, answer every caller once it committed; repeat until the queue is closed."""
        self._writer_started = True
        carried: Job | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._receive_answers)
                task_status.started()
                while self._failure is None:
                    if carried is None:
                        try:
                            carried = await self._job_receive.receive()
                        except anyio.EndOfStream:
                            break
                    # A slot first, then the batch: what waits meanwhile joins it.
                    with anyio.CancelScope(shield=True):
                        await self._wait_sent_below(SENT_BATCHES_MAX)
                    batch, weight, carried = [carried], carried.weight, None
                    # With nothing on its way, send half of what waits and the rest right
                    # behind it: callers that wait for their commit before they write again
                    # would otherwise keep meeting in one batch, and the event loop would idle
                    # through every fsync. A few jobs are not worth a second fsync.
                    jobs_max = 1 + self._job_receive.statistics().current_buffer_used
                    if not self._sent and jobs_max >= SPLIT_JOBS_MIN:
                        jobs_max = (jobs_max + 1) // 2
                    while len(batch) < jobs_max:
                        try:
                            job = self._job_receive.receive_nowait()
                        except (anyio.WouldBlock, anyio.EndOfStream):
                            break
                        if weight + job.weight > self._group_commit_max_records:
                            carried = job
                            break
                        batch.append(job)
                        weight += job.weight
                    # A started batch always finishes: its callers are owed an answer and the
                    # transaction must not be abandoned halfway through a thread hop.
                    with anyio.CancelScope(shield=True):
                        await self._execute_batch(batch)
                with anyio.CancelScope(shield=True):
                    await self._wait_sent_below(1)  # every sent batch answered
                tg.cancel_scope.cancel()
        finally:
            # Only after a failure or cancellation can jobs be left; answer them, then close
            # the stream so later senders fail fast instead of waiting for nobody. (Sent
            # batches are answered by now: `_receive_answers` finishes them even when
            # cancelled, or fails them if the writer process ends.)
            if self._sent:  # only if answering itself failed (a bug): the outcome is unknown
                self._fail_sent("the writer stopped with batches unanswered")
            leftovers = [carried] if carried is not None else []
            while True:
                try:
                    leftovers.append(self._job_receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream):
                    break
            self._job_receive.close()
            self._refuse(leftovers)
            self._writer_done.set()

    async def _execute_batch(self, jobs: list[Job]) -> None:
        self._batches += 1
        if all(job.stage is not None for job in jobs):
            await self._send_batch(jobs)
        else:
            await self._wait_sent_below(1)  # the two connections write strictly in turn
            await self._execute_here(jobs)

    async def _send_batch(self, jobs: list[Job]) -> None:
        """Stage the jobs on the cursors the batches before left, and send the rows to the
        writer process; `_receive_answers` answers the callers when it committed."""
        assert len(self._sent) < SENT_BATCHES_MAX
        if self._failure is not None:
            self._refuse(jobs)
            return
        batch = Batch(self._cursors)
        try:
            for job in jobs:
                stage_job(job, batch)
            message = writer_process.frame(batch.statements())
        except Exception as error:
            self._fail_batch(jobs, error)
            raise  # a bug in the writer: crash loudly (the callers got StorageError)
        self._cursors.update(batch.cursors)
        self._sent.append(_Sent(jobs, len(batch.pending.get(INSERT_LOG, ()))))
        self._signal_sent_changed()
        try:
            await self._process.send(message)
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as error:
            self._fail_sent(f"the writer process cannot be reached ({error!r})")

    async def _receive_answers(self) -> None:
        """Answer the callers of each sent batch in order, as the writer process commits them.

        Cancellation ends it only while nothing is on its way: a sent batch may commit
        whatever happens here, so its callers get the truth, which takes at most
        WRITER_ANSWER_TIMEOUT_S (then the store refuses writes)."""
        while True:
            while not self._sent:
                await self._sent_changed.wait()  # cancellable: nothing is owed
            with anyio.CancelScope(shield=True):
                answer: str | None = None
                with anyio.move_on_after(WRITER_ANSWER_TIMEOUT_S) as waited:
                    try:
                        answer = await self._process.receive()
                    except (
                        anyio.EndOfStream,
                        anyio.IncompleteRead,
                        OSError,
                        anyio.BrokenResourceError,
                        anyio.ClosedResourceError,
                        msgspec.DecodeError,
                    ) as error:
                        self._fail_sent(f"the writer process ended ({error!r})")
                        return
                if waited.cancelled_caught:
                    self._fail_sent(f"the writer process did not answer within {WRITER_ANSWER_TIMEOUT_S} s")
                    return
            if not self._sent:
                return  # failed meanwhile (a send to the process failed)
            if answer is not None:
                self._fail_sent(f"the writer process could not commit a batch: {answer}")
                return
            sent = self._sent.popleft()
            self._complete(sent.jobs, sent.log_records)
            self._signal_sent_changed()

    def _fail_sent(self, why: str) -> None:
        """Every sent batch failed (a batch after a failed one was staged on its cursors, and
        the writer process stops at the first failure)."""
        jobs = [job for sent in self._sent for job in sent.jobs]
        self._sent.clear()
        self._fail_batch(jobs, StorageError(f"{self._path}: {why}"))
        self._signal_sent_changed()

    def _signal_sent_changed(self) -> None:
        self._sent_changed.set()
        self._sent_changed = asyncio.Event()

    async def _wait_sent_below(self, count: int) -> None:
        while len(self._sent) >= count:
            await self._sent_changed.wait()

    def _refuse(self, jobs: list[Job]) -> None:
        for job in jobs:
            job.error = self._write_refused()
            job.done.set()

    async def _execute_here(self, jobs: list[Job]) -> None:
        """A batch with `run` jobs, on the store's own connection."""
        if self._failure is not None:
            self._refuse(jobs)
            return
        batch = Batch(self._cursors)
        connection = self._writer
        try:
            for job in jobs:
                if job.stage is not None:
                    stage_job(job, batch)
                    continue
                assert job.run is not None
                await self._flush(batch)
                if not connection.in_transaction:  # SAVEPOINT would begin (and RELEASE end) one
                    await connection.execute("BEGIN IMMEDIATE")
                await connection.execute("SAVEPOINT job")
                try:
                    job.result = await job.run(connection, batch)
                except (LevelZeroError, AssertionError) as error:
                    job.error = error
                    await connection.execute("ROLLBACK TO job")
                await connection.execute("RELEASE job")
            await self._flush(batch)
            await connection.commit()  # no-op (no fsync) when every job was rejected
        except Exception as error:
            with contextlib.suppress(sqlite3.Error):
                await connection.rollback()
            self._fail_batch(jobs, error)
            if not isinstance(error, sqlite3.Error):
                raise  # a bug in the writer: crash loudly (the callers got StorageError)
            return
        self._cursors.update(batch.cursors)
        self._complete(jobs, batch.log_records)

    def _complete(self, jobs: list[Job], log_records: int) -> None:
        """The batch committed: count it and answer its callers."""
        self._commits += 1
        self._records += log_records
        self._largest_batch_records = max(self._largest_batch_records, log_records)
        for job in jobs:
            self._jobs += 1
            if job.appends:
                refused = (
                    job.appends if job.error is not None else sum(error is not None for error in job.result)
                )
                self._appends += job.appends - refused
                self._rejected_appends += refused
            job.done.set()

    async def _flush(self, batch: Batch) -> None:
        """Run the staged rows: one executemany per statement."""
        for sql, rows in batch.statements():
            await self._writer.executemany(sql, rows)
            if sql == INSERT_LOG:
                batch.log_records += len(rows)
        batch.pending.clear()

    def _fail_batch(self, jobs: list[Job], error: Exception) -> None:
        """SQLite failed mid-batch: nothing of it committed, and the in-memory cursors can no
        longer be trusted to match the file, so refuse every write until the store is reopened."""
        if self._failure is None:
            self._failure = StorageError(failed_batch_message(self._path, error))
            self._failure.__cause__ = error
        self._refuse(jobs)

    def _write_refused(self) -> LevelZeroError:
        """The error for a write the store will not execute (a fresh instance per caller)."""
        if self._failure is not None:
            refused = StoreNeedsRestart(str(self._failure))
            refused.__cause__ = self._failure.__cause__
            return refused
        return ShuttingDown(f"{self._path}: log store is closing")

    async def _submit(self, job: Job) -> Any:
        """Hand a job to the writer and wait until its batch committed (or failed)."""
        return (await self._submit_all([job]))[0]

    async def _submit_all(self, jobs: Sequence[Job]) -> list[Any]:
        """Hand jobs to the writer in order, then wait until each one's batch committed (or
        failed); their results, or the first job's error."""
        await self._send_jobs(jobs)
        for job in jobs:
            await job.done.wait()
        for job in jobs:
            if job.error is not None:
                raise job.error
        return [job.result for job in jobs]

    async def _send_jobs(self, jobs: Sequence[Job]) -> None:
        """Hand jobs to the writer in order (refused at once if the store stopped writing)."""
        for job in jobs:
            check_call_records(job.weight, self._group_commit_max_records)
        for job in jobs:
            if self._failure is not None or self._closed:
                raise self._write_refused()
            try:
                try:  # no checkpoint when there is room: the caller waits for `done` next
                    self._job_send.send_nowait(job)
                except anyio.WouldBlock:
                    await self._job_send.send(job)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                raise self._write_refused() from None

    def _check_readable(self) -> None:
        if self._closed:
            raise ShuttingDown(f"{self._path}: log store is closed")

    # ------------------------------------------------------------------ partitions

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        creation_epoch: int,
        now: float,
        configs: Mapping[str, str] | None = None,
    ) -> list[PartitionRow]:
        check_create_topic(topic, partitions, creation_epoch)
        config_rows = [(topic, name, value, now) for name, value in sorted((configs or {}).items())]

        async def run(connection: aiosqlite.Connection, batch: Batch) -> list[PartitionRow]:
            async with connection.execute(
                "SELECT 1 FROM partitions WHERE topic = ? LIMIT 1", (topic,)
            ) as cursor:
                if await cursor.fetchone() is not None:
                    raise TopicExists(f"topic {topic!r} exists")
            await connection.execute(DELETE_TOPIC_CONFIGS, (topic,))  # a deleted topic's leftovers
            await connection.executemany(INSERT_TOPIC_CONFIG, config_rows)
            return await _insert_partitions(connection, batch, topic, range(partitions), creation_epoch, now)

        return await self._submit(Job(run=run))

    async def add_partitions(
        self, topic: str, count: int, creation_epoch: int, now: float
    ) -> list[PartitionRow]:
        check_create_topic(topic, count, creation_epoch)

        async def run(connection: aiosqlite.Connection, batch: Batch) -> list[PartitionRow]:
            ((current,),) = await connection.execute_fetchall(
                "SELECT COUNT(*) FROM partitions WHERE topic = ?", (topic,)
            )
            if current == 0:
                raise UnknownTopic(topic)
            if count <= current:
                raise InvalidInput(f"topic {topic!r} has {current} partitions; {count} would not add any")
            added = range(current, count)
            return await _insert_partitions(connection, batch, topic, added, creation_epoch, now)

        return await self._submit(Job(run=run))

    async def delete_topic(self, topic: str, now: float) -> list[PartitionRow]:
        async def run(connection: aiosqlite.Connection, batch: Batch) -> list[PartitionRow]:
            rows = [
                PartitionRow(*row)
                for row in await connection.execute_fetchall(
                    "SELECT pid, topic, partition, creation_epoch, term, created_at"
                    " FROM partitions WHERE topic = ? ORDER BY pid",
                    (topic,),
                )
            ]
            if not rows:
                raise UnknownTopic(topic)
            pids = [(row.pid,) for row in rows]
            await connection.executemany(
                "INSERT INTO deleted_partitions (pid, topic, partition, creation_epoch, term,"
                " created_at, deleted_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(*msgspec.structs.astuple(row), now) for row in rows],
            )
            for table in ("partitions", "log", "snapshots"):
                await connection.executemany(f"DELETE FROM {table} WHERE pid = ?", pids)
            for table in ("consumer_offsets", "producer_batches", "txn_ranges"):
                await connection.execute(f"DELETE FROM {table} WHERE topic = ?", (topic,))
            await connection.execute(DELETE_TOPIC_CONFIGS, (topic,))
            for row in rows:
                cursor = batch.cursor(row.pid)
                batch.cursors[row.pid] = msgspec.structs.replace(cursor, deleted=True)
            return rows

        return await self._submit(Job(run=run))

    async def deleted_partitions(self) -> list[PartitionRow]:
        self._check_readable()
        rows = await self._reader.execute_fetchall(
            "SELECT pid, topic, partition, creation_epoch, term, created_at FROM deleted_partitions"
            " WHERE collected_at IS NULL ORDER BY pid"
        )
        return [PartitionRow(*row) for row in rows]

    async def forget_deleted_partition(self, pid: int) -> bool:
        now = self._clock()

        async def run(connection: aiosqlite.Connection, _batch: Batch) -> bool:
            pending = await connection.execute_fetchall(
                "SELECT 1 FROM deleted_partitions WHERE pid = ? AND collected_at IS NULL", (pid,)
            )
            unfinished = await connection.execute_fetchall(
                "SELECT 1 FROM l1_objects WHERE pid = ? AND state != ? LIMIT 1",
                (pid, L1State.DELETE_FINISHED),
            )
            if not pending or unfinished:
                return False
            await connection.execute("DELETE FROM l1_objects WHERE pid = ?", (pid,))
            await connection.execute("DELETE FROM l1_compacted WHERE pid = ?", (pid,))
            await connection.execute("DELETE FROM cleaner_offsets WHERE pid = ?", (pid,))
            await connection.execute(
                "UPDATE deleted_partitions SET collected_at = ? WHERE pid = ?", (now, pid)
            )
            return True

        return await self._submit(Job(run=run))

    async def list_partitions(self) -> list[PartitionRow]:
        self._check_readable()
        rows = await self._reader.execute_fetchall(
            "SELECT pid, topic, partition, creation_epoch, term, created_at FROM partitions ORDER BY pid"
        )
        return [PartitionRow(*row) for row in rows]

    # ------------------------------------------------------------------ topic configs

    async def topic_configs(self, topic: str | None = None) -> dict[str, dict[str, str]]:
        self._check_readable()
        if topic is None:
            rows = await self._reader.execute_fetchall(SELECT_TOPIC_CONFIGS + " ORDER BY topic, name")
        else:
            rows = await self._reader.execute_fetchall(
                SELECT_TOPIC_CONFIGS + " WHERE topic = ? ORDER BY name", (topic,)
            )
        out: dict[str, dict[str, str]] = {}
        for name, key, value in rows:
            out.setdefault(name, {})[key] = value
        return out

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str], now: float) -> None:
        config_rows = [(topic, name, value, now) for name, value in sorted(configs.items())]

        async def run(connection: aiosqlite.Connection, batch: Batch) -> None:  # noqa: ARG001 - no cursor moves
            async with connection.execute(
                "SELECT 1 FROM partitions WHERE topic = ? LIMIT 1", (topic,)
            ) as cursor:
                if await cursor.fetchone() is None:
                    raise UnknownTopic(topic)
            await connection.execute(DELETE_TOPIC_CONFIGS, (topic,))
            await connection.executemany(INSERT_TOPIC_CONFIG, config_rows)

        await self._submit(Job(run=run))

    async def begin_term(self, pid: int, log_offset: int, base_offset: int, at_least: int = 0) -> LogRecord:
        now = self._clock()

        def stage(batch: Batch) -> LogRecord:
            cursor = batch.cursor(pid)
            if cursor.deleted:
                raise PartitionDeleted(cursor.name, "TermStart")
            if log_offset < cursor.next_log_offset:
                raise LogMovedOn(cursor.name, log_offset, cursor.next_log_offset)
            if log_offset != cursor.next_log_offset:
                raise InvariantViolation(
                    f"partition {cursor.name}: TermStart at log offset {log_offset}, "
                    f"the log continues at {cursor.next_log_offset}"
                )
            term = max(cursor.term + 1, at_least)
            record = LogRecord(log_offset, term, base_offset, TermStart(term))
            batch.stage(INSERT_LOG, [log_row(pid, record, now)])
            batch.stage(UPDATE_TERM, [(term, pid)])
            batch.cursors[pid] = Cursor(cursor.name, term, log_offset + 1)
            return record

        return await self._submit(Job(stage=stage))

    # ------------------------------------------------------------------ log

    async def append(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
        [refused] = await self.append_many([Append(pid, expected_term, records)])
        if refused is not None:
            raise refused

    async def append_many(
        self, appends: Sequence[Append], on_durable: OnDurable | None = None
    ) -> list[NotLeader | None]:
        now = self._clock()
        parts: list[_AppendRows] = []
        for append in appends:
            pid, expected_term, records = append.pid, append.expected_term, list(append.records)
            check_append_records(pid, expected_term, records)
            parts.append(
                _AppendRows(
                    pid,
                    expected_term,
                    records[0].log_offset if records else None,
                    [log_row(pid, record, now) for record in records],
                )
            )
        assert len({part.pid for part in parts}) == len(parts), "append_many: a partition twice"
        # A crowd of partitions goes to the writer as a crowd of jobs (`SPLIT_JOBS_MIN` or
        # more), so that with nothing on its way the writer sends it as two batches, and each
        # partition is told at its own batch's COMMIT: the first batch's writers then write
        # again while the second one commits. As one job, the node's appender made every
        # partition of the closed loop meet in one commit, and the event loop idled through
        # each fsync while the writer process idled through the loop's work (BENCHMARKS.md,
        # item 4). A job also never holds more than `group_commit_max_records` (more would be
        # refused; one part alone larger than that is, as a single `append` of it is).
        # Only a crowd whose halves are crowds themselves: a call of fewer partitions goes as
        # one job, so the halves of a closed loop's crowd stay two batches, not ever smaller.
        per_job = len(parts) // SPLIT_JOBS_MIN if len(parts) >= 2 * SPLIT_JOBS_MIN else len(parts)
        jobs: list[Job] = []
        chunk: list[_AppendRows] = []
        weight = 0
        for part in parts:
            if chunk and (len(chunk) == per_job or weight + len(part.rows) > self._group_commit_max_records):
                jobs.append(_appends_job(chunk, weight))
                chunk, weight = [], 0
            chunk.append(part)
            weight += len(part.rows)
        if chunk:
            jobs.append(_appends_job(chunk, weight))
        await self._send_jobs(jobs)
        # Batches commit in order, so the jobs finish in order: each job's partitions are told
        # as it finishes (a failed job's are not). A job's error, then what `on_durable`
        # raised, is raised once every job settled.
        refused: list[NotLeader | None] = []
        failures: list[BaseException] = []
        told: list[Exception] = []
        base = 0  # index of the job's first append in `appends`
        for job in jobs:
            await job.done.wait()
            if job.error is not None:
                failures.append(job.error)
            else:
                refused.extend(job.result)
                if on_durable is not None:
                    for index, refusal in enumerate(job.result, base):
                        try:
                            on_durable(index, refusal)
                        except Exception as error:  # noqa: BLE001 - raised once every job settled
                            told.append(error)
            base += job.appends
        if failures or told:
            raise (failures or told)[0]
        return refused

    async def read_log(self, pid: int, from_log_offset: int, limit: int | None = None) -> list[LogRecord]:
        """Records at `from_log_offset` and after, in log order; `limit=None` reads to the end."""
        self._check_readable()
        if limit is not None and limit < 0:
            raise InvalidInput(f"limit must be >= 0, not {limit}")
        rows = await self._reader.execute_fetchall(
            f"{SELECT_LOG} WHERE pid = ? AND log_offset >= ? ORDER BY log_offset LIMIT ?",
            (pid, from_log_offset, -1 if limit is None else limit),
        )
        return [self._decode(pid, row) for row in rows]

    async def read_placeholders(self, pid: int, from_data_offset: int, limit: int) -> list[LogRecord]:
        self._check_readable()
        if limit < 0:
            raise InvalidInput(f"limit must be >= 0, not {limit}")
        rows = await self._reader.execute_fetchall(SELECT_PLACEHOLDERS, (pid, from_data_offset, limit))
        return [self._decode(pid, row) for row in rows]

    def _decode(self, pid: int, row: sqlite3.Row | tuple[Any, ...]) -> LogRecord:
        log_offset, term, base_offset, kind, blob = row
        try:
            entry = decode_entry(blob)
        except (msgspec.DecodeError, TypeError) as error:
            raise self._corrupt(pid, log_offset, f"entry blob does not decode ({error})") from None
        if ENTRY_KINDS[type(entry)] != kind:
            raise self._corrupt(
                pid, log_offset, f"entry blob holds {ENTRY_KINDS[type(entry)]}, row says {kind}"
            )
        return LogRecord(log_offset, term, base_offset, entry)

    def _corrupt(self, pid: int, log_offset: int, why: str) -> CorruptData:
        cursor = self._cursors.get(pid)
        name = cursor.name if cursor is not None else "unknown topic/partition"
        return CorruptData(f"{self._path}: partition pid={pid} ({name}) log offset {log_offset}: {why}")

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the partition's snapshot; it must cover no more than the log holds and never
        go back (truncation may already have removed what an older snapshot would need)."""
        now = self._clock()

        async def run(connection: aiosqlite.Connection, batch: Batch) -> None:
            cursor = batch.cursor(snapshot.pid)
            if cursor.deleted:
                raise PartitionDeleted(cursor.name, "snapshot")
            if not (-1 <= snapshot.log_offset < cursor.next_log_offset):
                raise InvariantViolation(
                    f"partition {cursor.name}: snapshot at log offset {snapshot.log_offset}, "
                    f"the log ends before {cursor.next_log_offset}"
                )
            previous = await _snapshot_offset(connection, snapshot.pid)
            if previous is not None and snapshot.log_offset < previous:
                raise SnapshotSuperseded(cursor.name, snapshot.log_offset, previous)
            await connection.execute(
                "INSERT OR REPLACE INTO snapshots (pid, log_offset, data, saved_at) VALUES (?, ?, ?, ?)",
                (snapshot.pid, snapshot.log_offset, snapshot.data, now),
            )

        await self._submit(Job(run=run))

    async def load_snapshot(self, pid: int) -> Snapshot | None:
        self._check_readable()
        rows = await self._reader.execute_fetchall(
            "SELECT log_offset, data FROM snapshots WHERE pid = ?", (pid,)
        )
        if not rows:
            return None
        ((log_offset, data),) = rows
        return Snapshot(pid=pid, log_offset=log_offset, data=bytes(data))

    async def truncate_below(self, pid: int, log_offset: int) -> int:
        async def run(connection: aiosqlite.Connection, batch: Batch) -> int:
            cursor = batch.cursor(pid)
            if cursor.deleted:
                raise PartitionDeleted(cursor.name, "truncation")
            snapshot_offset = await _snapshot_offset(connection, pid)
            allowed = -1 if snapshot_offset is None else snapshot_offset
            if log_offset > allowed + 1:
                raise InvariantViolation(
                    f"partition {cursor.name}: truncating below log offset {log_offset} would "
                    f"drop entries no snapshot covers (snapshot at {snapshot_offset})"
                )
            async with connection.execute(
                "DELETE FROM log WHERE pid = ? AND log_offset < ?", (pid, log_offset)
            ) as deleted:
                return deleted.rowcount

        return await self._submit(Job(run=run))

    # ------------------------------------------------------------------ cluster epoch

    async def get_cluster_epoch(self) -> int:
        """The stored cluster epoch; 1 before the first `set_cluster_epoch`."""
        self._check_readable()
        rows = list(await self._reader.execute_fetchall("SELECT epoch FROM cluster_epoch WHERE id = 1"))
        return rows[0][0] if rows else 1

    async def set_cluster_epoch(self, epoch: int) -> None:
        async def run(connection: aiosqlite.Connection, _batch: Batch) -> None:
            rows = list(await connection.execute_fetchall("SELECT epoch FROM cluster_epoch WHERE id = 1"))
            stored = rows[0][0] if rows else 1
            if epoch < stored:
                raise InvariantViolation(f"cluster epoch would go back from {stored} to {epoch}")
            await connection.execute(
                "INSERT INTO cluster_epoch (id, epoch) VALUES (1, ?)"
                " ON CONFLICT (id) DO UPDATE SET epoch = excluded.epoch",
                (epoch,),
            )

        check_cluster_epoch(epoch)
        await self._submit(Job(run=run))

    async def probe_write(self) -> None:
        async def run(connection: aiosqlite.Connection, _batch: Batch) -> None:
            await connection.execute(
                "INSERT INTO cluster_epoch (id, epoch) VALUES (1, 1)"
                " ON CONFLICT (id) DO UPDATE SET epoch = cluster_epoch.epoch"
            )

        await self._submit(Job(run=run))

    # ------------------------------------------------------------------ L1 metastore

    async def l1_insert(self, row: L1Row) -> None:
        check_l1_state(row.state)

        async def run(connection: aiosqlite.Connection, _batch: Batch) -> None:
            deleted = await connection.execute_fetchall(
                "SELECT topic, partition FROM deleted_partitions WHERE pid = ?", (row.pid,)
            )
            if deleted:
                ((topic, partition),) = deleted
                raise PartitionDeleted(f"{topic}/{partition}", "L1 insert")
            try:
                await connection.execute(INSERT_L1, msgspec.structs.astuple(row))
            except sqlite3.IntegrityError:
                raise InvariantViolation(f"L1 object {row.key!r} is already recorded") from None

        await self._submit(Job(run=run))

    async def l1_transition(self, key: str, from_state: str, to_state: str, now: float) -> bool:
        check_l1_state(from_state)
        check_l1_state(to_state)

        async def run(connection: aiosqlite.Connection, _batch: Batch) -> bool:
            async with connection.execute(
                "UPDATE l1_objects SET state = ?, updated_at = ? WHERE key = ? AND state = ?",
                (to_state, now, key, from_state),
            ) as updated:
                return updated.rowcount == 1

        return await self._submit(Job(run=run))

    async def l1_list(self, pid: int | None = None, states: Sequence[str] | None = None) -> list[L1Row]:
        self._check_readable()
        where: list[str] = []
        params: list[int | str] = []
        if pid is not None:
            where.append("pid = ?")
            params.append(pid)
        if states is not None:
            for state in states:
                check_l1_state(state)
            where.append(f"state IN ({', '.join('?' * len(states))})")
            params.extend(states)
        sql = SELECT_L1
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = await self._reader.execute_fetchall(sql + " ORDER BY pid, base_offset, key", params)
        return [L1Row(*row) for row in rows]

    async def l1_compaction_commit(self, commit: CompactionCommit, now: float) -> str | None:
        async def run(connection: aiosqlite.Connection, _batch: Batch) -> str | None:
            terms = [
                term
                for (term,) in await connection.execute_fetchall(
                    "SELECT term FROM partitions WHERE pid = ?", (commit.pid,)
                )
            ]
            accepted: dict[int, int] = {
                term: end
                for term, end in await connection.execute_fetchall(
                    "SELECT term, cleaned_to FROM cleaner_offsets WHERE pid = ?", (commit.pid,)
                )
            }
            keys = (*commit.new_keys, *commit.superseded_keys)
            found = await connection.execute_fetchall(
                f"SELECT key, pid, state FROM l1_objects WHERE key IN ({', '.join('?' * len(keys))})", keys
            )
            rows = {key: (pid, state) for key, pid, state in found}
            refusal = compaction_commit_refusal(commit, terms[0] if terms else None, accepted, rows)
            if refusal is not None:
                return refusal
            await connection.execute("DELETE FROM cleaner_offsets WHERE pid = ?", (commit.pid,))
            await connection.executemany(
                "INSERT INTO cleaner_offsets (pid, term, cleaned_to) VALUES (?, ?, ?)",
                [(commit.pid, term, end) for term, end in commit.cleaner_offsets.items()],
            )
            for key, to_state in [(k, L1State.COPY_FINISHED) for k in commit.new_keys] + [
                (k, L1State.DELETE_STARTED) for k in commit.superseded_keys
            ]:
                await connection.execute(
                    "UPDATE l1_objects SET state = ?, updated_at = ? WHERE key = ?", (to_state, now, key)
                )
            await connection.executemany(
                "INSERT INTO l1_compacted (key, pid, committed_at) VALUES (?, ?, ?)",
                [(key, commit.pid, now) for key in commit.new_keys],
            )
            return None

        return await self._submit(Job(run=run))

    async def l1_compaction_state(self, pid: int) -> CompactionState:
        self._check_readable()
        offsets = await self._reader.execute_fetchall(
            "SELECT term, cleaned_to FROM cleaner_offsets WHERE pid = ?", (pid,)
        )
        keys = await self._reader.execute_fetchall("SELECT key FROM l1_compacted WHERE pid = ?", (pid,))
        return CompactionState({term: end for term, end in offsets}, frozenset(key for (key,) in keys))

    # ------------------------------------------------------------------ events

    async def record_l0_object(self, row: L0ObjectRow) -> None:
        """Idempotent: recording a key twice keeps the first row."""
        await self._stage_rows(INSERT_L0, [msgspec.structs.astuple(row)])

    async def mark_l0_deleted(self, keys: Sequence[str], at: float, m: int) -> None:
        """Stamp recorded, not yet deleted keys; unknown keys are ignored. Staged like the rows
        it stamps: a batch runs its catalog inserts before its marks, and batches commit in
        order, so a mark sees every row recorded before it."""
        if not keys:
            return
        params = [(at, m, _JSON_ENCODE(list(keys)).decode())]  # the page's keys, one statement

        def stage(batch: Batch) -> None:
            batch.stage(INSERT_L0, ())  # the inserts' turn comes first in this batch
            batch.stage(MARK_L0_DELETED, params)

        await self._submit(Job(weight=len(keys), stage=stage))

    async def l0_live_objects(
        self, max_epoch: int, after: tuple[int, str] | None = None, limit: int = 1000
    ) -> list[L0ObjectRow]:
        assert limit >= 1, limit
        self._check_readable()
        after_epoch, after_key = after if after is not None else (-1, "")
        # The partial index l0_objects_live holds exactly the rows this reads, in this order.
        rows = await self._reader.execute_fetchall(
            "SELECT key, epoch, size, created_at, extents FROM l0_objects"
            " WHERE deleted_at IS NULL AND epoch <= ? AND (epoch, key) > (?, ?)"
            " ORDER BY epoch, key LIMIT ?",
            (max_epoch, after_epoch, after_key, limit),
        )
        return [L0ObjectRow(*row) for row in rows]

    async def record_gc_round(self, row: GcRoundRow) -> None:
        await self._stage_rows(INSERT_GC_ROUND, [msgspec.structs.astuple(row)])

    async def record_fence_events(self, rows: Sequence[FenceEventRow]) -> None:
        await self._stage_rows(INSERT_FENCE_EVENT, [msgspec.structs.astuple(r) for r in rows])

    async def record_state_samples(self, rows: Sequence[StateSampleRow]) -> None:
        await self._stage_rows(INSERT_STATE_SAMPLE, [msgspec.structs.astuple(r) for r in rows])

    async def prune_history(self, before: float, limit: int) -> int:
        assert limit >= 1, limit

        async def run(connection: aiosqlite.Connection, _batch: Batch) -> int:
            gone = 0
            for table in HISTORY_TABLES:
                cursor = await connection.execute(prune_statement(table, "sqlite"), (before, limit))
                gone += cursor.rowcount
            return gone

        result: int = await self._submit(Job(run=run))
        return result

    # ------------------------------------------------------------------ consumer offsets

    async def commit_offsets(self, rows: Sequence[OffsetRow]) -> None:
        await self._stage_rows(UPSERT_OFFSET, [msgspec.structs.astuple(r) for r in rows])

    async def committed_offsets(self, group_id: str) -> list[OffsetRow]:
        self._check_readable()
        rows = await self._reader.execute_fetchall(SELECT_OFFSETS, (group_id,))
        return [OffsetRow(*row) for row in rows]

    async def offset_groups(self) -> list[str]:
        self._check_readable()
        return [row[0] for row in await self._reader.execute_fetchall(SELECT_OFFSET_GROUPS)]

    async def delete_offsets(self, group_id: str, partitions: Sequence[tuple[str, int]] | None) -> None:
        # (The group coordinator lets no commit of the group be under way meanwhile: staged
        # statements of one batch run in the order first staged.)
        if partitions is None:
            await self._stage_rows(DELETE_GROUP_OFFSETS, [(group_id,)])
        else:
            await self._stage_rows(DELETE_OFFSET, [(group_id, t, p) for t, p in partitions])

    async def expire_offsets(self, group_id: str, committed_before: float) -> None:
        await self._stage_rows(EXPIRE_OFFSETS, [(group_id, committed_before)])

    async def store_group_metadata(self, group_id: str, metadata: bytes | None, now: float) -> None:
        if metadata is None:
            await self._stage_rows(DELETE_GROUP_METADATA, [(group_id,)])
        else:
            await self._stage_rows(UPSERT_GROUP_METADATA, [(group_id, metadata, now)])

    async def group_metadata(self, group_id: str) -> bytes | None:
        self._check_readable()
        rows = list(await self._reader.execute_fetchall(SELECT_GROUP_METADATA, (group_id,)))
        return bytes(rows[0][0]) if rows else None

    async def metadata_groups(self) -> list[str]:
        self._check_readable()
        return [row[0] for row in await self._reader.execute_fetchall(SELECT_METADATA_GROUPS)]

    # ------------------------------------------------------------------ idempotent producers

    async def record_producer_batches(self, rows: Sequence[ProducerBatchRow], keep: int) -> None:
        assert keep >= 1
        if not rows:
            return
        pairs = sorted({(r.producer_id, r.topic, r.partition) for r in rows})
        prune = [(pid, topic, partition, pid, topic, partition, keep) for pid, topic, partition in pairs]
        inserted = [msgspec.structs.astuple(r) for r in rows]

        def stage(batch: Batch) -> None:
            batch.stage(INSERT_PRODUCER_BATCH, inserted)
            batch.stage(PRUNE_PRODUCER_BATCHES, prune)

        await self._submit(Job(weight=len(rows), stage=stage))

    async def expire_producer_batches(
        self, producer_id_min: int, stored_before: float, rows_max: int, producer_id_below: int = 2**63 - 1
    ) -> None:
        assert rows_max >= 1, rows_max
        rows = [(producer_id_min, stored_before, rows_max, producer_id_below)]
        await self._stage_rows(EXPIRE_PRODUCER_BATCHES, rows)

    async def producer_batches(self, producer_id: int) -> list[ProducerBatchRow]:
        self._check_readable()
        rows = await self._reader.execute_fetchall(SELECT_PRODUCER_BATCHES, (producer_id,))
        return [ProducerBatchRow(*row) for row in rows]

    # ------------------------------------------------------------------ transactions

    async def put_transaction(
        self, row: TransactionRow, opened: Sequence[TxnRangeRow] = (), closed: Sequence[TxnRangeRow] = ()
    ) -> None:
        """One job: the state and the ranges commit together."""
        statements: list[tuple[str, list[tuple[Any, ...]]]] = [
            (UPSERT_TRANSACTION, [msgspec.structs.astuple(row)]),
            (INSERT_TXN_RANGE, [(*msgspec.structs.astuple(r)[:5], int(r.aborted)) for r in opened]),
            (ABORT_TXN_RANGE, [_abort_args(r) for r in closed if r.aborted]),
            (DELETE_TXN_RANGE, [_range_key(r) for r in closed if not r.aborted]),
        ]

        def stage(batch: Batch) -> None:
            for sql, rows in statements:
                if rows:
                    batch.stage(sql, rows)

        await self._submit(Job(weight=1 + len(opened) + len(closed), stage=stage))

    async def transactions(self) -> list[TransactionRow]:
        self._check_readable()
        return [TransactionRow(*row) for row in await self._reader.execute_fetchall(SELECT_TRANSACTIONS)]

    async def expire_transaction(self, transactional_id: str, updated_at: float) -> None:
        await self._stage_rows(EXPIRE_TRANSACTION, [(transactional_id, updated_at)])

    async def open_txn_range(self, row: TxnRangeRow) -> None:
        await self._stage_rows(INSERT_TXN_RANGE, [(*msgspec.structs.astuple(row)[:5], int(row.aborted))])

    async def close_txn_range(
        self, topic: str, partition: int, producer_id: int, first_offset: int, last_offset: int, aborted: bool
    ) -> None:
        row = TxnRangeRow(topic, partition, producer_id, first_offset, last_offset, aborted)
        if aborted:
            await self._stage_rows(ABORT_TXN_RANGE, [_abort_args(row)])
        else:
            await self._stage_rows(DELETE_TXN_RANGE, [_range_key(row)])

    async def txn_ranges(self, topic: str, partition: int) -> list[TxnRangeRow]:
        self._check_readable()
        rows = await self._reader.execute_fetchall(SELECT_TXN_RANGES, (topic, partition))
        return [
            TxnRangeRow(t, p, producer, first, last, bool(aborted))
            for t, p, producer, first, last, aborted in rows
        ]

    async def prune_txn_ranges(self, topic: str, partition: int, below: int) -> None:
        await self._stage_rows(PRUNE_TXN_RANGES, [(topic, partition, below)])

    async def _stage_rows(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """Event rows ride along with the batch's other staged rows."""
        if rows:
            await self._submit(Job(weight=len(rows), stage=lambda batch: batch.stage(sql, rows)))


def _range_key(row: TxnRangeRow) -> tuple[str, int, int, int]:
    return row.topic, row.partition, row.producer_id, row.first_offset


def _abort_args(row: TxnRangeRow) -> tuple[int, str, int, int, int]:
    return row.last_offset, *_range_key(row)


# ---------------------------------------------------------------------- appends' staging


class _AppendRows(msgspec.Struct, frozen=True):
    """One partition's append, encoded: its log rows and where they must go (a msgspec struct:
    one per partition per call)."""

    pid: int
    expected_term: int
    first_offset: int | None  # None: an empty append (only the term is checked)
    rows: list[tuple[Any, ...]]


def _appends_job(parts: list[_AppendRows], weight: int) -> Job:
    return Job(weight=weight, appends=len(parts), stage=functools.partial(_stage_appends, parts))


def _stage_appends(parts: list[_AppendRows], batch: Batch) -> list[NotLeader | None]:
    """Check every part against the batch's cursors, then stage the accepted ones: a part that
    breaks the log (a bug) fails the whole job before anything of it is staged; a moved-on term
    refuses that part alone."""
    refused: list[NotLeader | None] = []
    accepted: list[tuple[_AppendRows, Cursor]] = []
    for part in parts:
        cursor = batch.cursor(part.pid)
        if cursor.deleted:
            refused.append(PartitionDeleted(cursor.name, "append"))
            continue
        if part.expected_term != cursor.term:
            refused.append(NotLeader(cursor.name, part.expected_term, cursor.term))
            continue
        refused.append(None)
        if part.first_offset is None:
            continue
        if part.first_offset != cursor.next_log_offset:
            raise InvariantViolation(
                f"partition {cursor.name}: append at log offset {part.first_offset}, "
                f"the log continues at {cursor.next_log_offset}"
            )
        accepted.append((part, cursor))
    cursors = batch.cursors
    for part, cursor in accepted:
        cursors[part.pid] = Cursor(cursor.name, cursor.term, cursor.next_log_offset + len(part.rows))
    batch.stage(INSERT_LOG, [row for part, _ in accepted for row in part.rows])  # in order
    return refused


# ---------------------------------------------------------------------- partitions


async def _insert_partitions(
    connection: aiosqlite.Connection,
    batch: Batch,
    topic: str,
    indexes: range,
    creation_epoch: int,
    now: float,
) -> list[PartitionRow]:
    """Insert partitions `indexes` of `topic` with ids above every id ever given (a deleted
    partition's id stays taken: its L1 rows and events name it); the new rows."""
    ((last,),) = await connection.execute_fetchall(
        "SELECT MAX(pid) FROM (SELECT MAX(pid) AS pid FROM partitions"
        " UNION ALL SELECT MAX(pid) FROM deleted_partitions)"
    )
    first = (last or 0) + 1
    created = [
        PartitionRow(first + i, topic, index, creation_epoch, 0, now) for i, index in enumerate(indexes)
    ]
    await connection.executemany(
        "INSERT INTO partitions (pid, topic, partition, creation_epoch, term, created_at)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [msgspec.structs.astuple(row) for row in created],
    )
    for row in created:
        batch.cursors[row.pid] = Cursor(f"{topic}/{row.partition}", 0, 0)
    return created


# SQLite's primary result codes (an exception's `sqlite_errorcode` is the extended one: its low
# byte): a statement's own error (no such table or column: a bug), a damaged file, no database.
_SQLITE_ERROR, _SQLITE_CORRUPT, _SQLITE_NOTADB = 1, 11, 26


class _Reads:
    """The store's read connection, its failures made the store's errors: a read that SQLite
    fails (an I/O error, a full disk for a temporary sort, a damaged file, a lock past the busy
    timeout) came out as `sqlite3`'s own exception, which every caller takes for a bug (an HTTP
    500 with a traceback, a Kafka request failed and its connection closed). Now StorageError
    (a 503 to retry), or CorruptData for a damaged file."""

    __slots__ = ("_connection", "_path")

    def __init__(self, connection: aiosqlite.Connection, path: str) -> None:
        self._connection = connection
        self._path = path

    async def execute_fetchall(self, sql: str, parameters: Any = ()) -> Iterable[sqlite3.Row]:
        try:
            return await self._connection.execute_fetchall(sql, parameters)
        except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise  # the statement's fault, not the file's: a bug
        except sqlite3.Error as error:
            code = getattr(error, "sqlite_errorcode", None)
            primary = None if code is None else code & 0xFF
            if primary == _SQLITE_ERROR:
                raise  # the statement's fault too (a retry would meet it for ever): a bug
            if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
                raise CorruptData(f"{self._path}: a read found the log store damaged: {error}") from error
            raise StorageError(f"{self._path}: a read failed: {error}") from error
        except ValueError as error:
            if str(error) not in ("Connection closed", "no active connection"):  # aiosqlite's words
                raise
            raise ShuttingDown(f"{self._path}: log store is closed") from error

    async def close(self) -> None:
        await self._connection.close()


# SQLite's words for SQLITE_FULL, in its own errors and in the writer process's answers.
_DISK_FULL = "database or disk is full"


def failed_batch_message(path: str, error: BaseException) -> str:
    """What the store says once a write batch failed (it refuses writes from then on, and the
    daemon stops at the next write a partition cannot make: a restart replays the log). On a
    full disk it says what to do about it: nothing acknowledged is lost, the daemon starts
    again once there is room (systemd restarts it; the unit never gives up)."""
    message = (
        f"{path}: a write batch failed and was rolled back ({error!r}); "
        "the log store refuses writes until the daemon restarts"
    )
    if _DISK_FULL not in str(error):
        return message
    directory = os.path.dirname(os.path.abspath(path))
    try:
        free = f"{shutil.disk_usage(directory).free:,} bytes free"
    except OSError:
        free = "free space unknown"
    return (
        f"{message}. The file system of {directory} is full ({free}): free space there (the "
        "log store needs room for its write-ahead log), then start the daemon again (systemd "
        "restarts it every few seconds by itself); it replays its log: nothing acknowledged "
        "is lost"
    )


# ---------------------------------------------------------------------- start-up helpers


async def _load_cursors(connection: aiosqlite.Connection) -> dict[int, Cursor]:
    """Each partition's term and next log offset. The log may be truncated to nothing after a
    snapshot, so the snapshot's offset bounds the next offset from below too."""
    rows = await connection.execute_fetchall(SELECT_LOG_ENDS)
    cursors = {
        pid: Cursor(f"{topic}/{partition}", term, last_log_offset + 1)
        for pid, topic, partition, term, last_log_offset in rows
    }
    # Deleted partitions not yet collected: a write naming one is refused as PartitionDeleted,
    # not a bug. (A collected one's writers are long gone, none after a restart: every deleted
    # partition's tombstone, reloaded at each start, held 170 B a partition ever deleted.)
    deleted = await connection.execute_fetchall(
        "SELECT pid, topic, partition, term FROM deleted_partitions WHERE collected_at IS NULL"
    )
    for pid, topic, partition, term in deleted:
        cursors[pid] = Cursor(f"{topic}/{partition}", term, 0, deleted=True)
    return cursors


async def _snapshot_offset(connection: aiosqlite.Connection, pid: int) -> int | None:
    rows = list(await connection.execute_fetchall("SELECT log_offset FROM snapshots WHERE pid = ?", (pid,)))
    return rows[0][0] if rows else None
