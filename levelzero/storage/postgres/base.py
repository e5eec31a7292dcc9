"""The PostgreSQL store's shared part: the pool, opening and closing, retries of connection
trouble, and the group-commit dispatcher every role's writes go through (the store is described
in store.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Self

import anyio
import anyio.abc
import asyncpg

from levelzero.core.entries import LogRecord
from levelzero.core.errors import (
    InvalidInput,
    InvariantViolation,
    LevelZeroError,
    NotLeader,
    PartitionDeleted,
    ShuttingDown,
    StorageError,
    StoreRefused,
)
from levelzero.storage.done import Done
from levelzero.storage.lifecycle import StoreLifecycle
from levelzero.storage.log_rules import check_call_records
from levelzero.storage.protocols import GcRoundRow, L1Row, LogStoreStatistics, OffsetRow

from .schema import migrate

GROUP_COMMIT_MAX_RECORDS = 4096  # records (or event rows) per batch; also the per-call maximum
QUEUE_MAX = 1024  # write calls waiting for the dispatcher before callers block
WRITERS = 2  # batches on their way at once (one pooled connection each)
POOL_MAX = 8  # connections: writers + readers
CONNECT_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 60.0
# The server ends a session left idle inside a transaction this long (the daemon passes its
# lease TTL): a node stopped (SIGSTOP, a VM paused, cut off) between a batch's statements and
# its COMMIT would otherwise hold its partitions' row locks until it woke, and the node that
# takes those partitions over when the leases expire would wait behind them to start its term.
# No other node waits for it before then: a batch locks only its own partitions' rows. Its
# transaction is rolled back, so nothing of it was acknowledged; it fails when the node wakes.
# A healthy node never idles in a transaction longer than a stall of its event loop.
IDLE_IN_TRANSACTION_TIMEOUT_S = 10.0
# How the daemon takes the password (levelzero/config.py), named when the server refuses it.
REFUSED_LOGIN_HINT = (
    "give the password as LEVELZERO_CONTROL_PASSWORD in the environment, or in the file "
    "control.password_file names (a password in control.dsn is refused)"
)
SPLIT_JOBS_MIN = 32  # this many waiting calls, with no batch on its way, go out as two batches
# ... the second that long after the first: half a statement (the writers' recent mean), up to
# STAGGER_MAX_S (a slow statement or two must not hold the second half back for long).
STAGGER_FRACTION = 0.5
STAGGER_MAX_S = 0.010
STATEMENT_MEAN_WEIGHT = 0.2  # of each new batch's statement time in the writers' running mean
RECONNECT_TIMEOUT_S = 30.0  # how long one call retries connection trouble before StorageError
RETRY_DELAY_MIN_S = 0.05
RETRY_DELAY_MAX_S = 1.0

# What a restart, a failover or a dropped connection looks like to asyncpg.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,  # class 08
    asyncpg.exceptions.OperatorInterventionError,  # 57: admin/crash shutdown, cannot connect now
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.InterfaceError,  # "the underlying connection is closed" (a retry gets a new one)
    # Releasing a connection the server dropped mid-reset ("cannot switch to state ...; another
    # operation is in progress"): the pool discards it, a retry gets a new one.
    asyncpg.exceptions.InternalClientError,
)
# Transient conflicts between concurrent transactions: run the batch again.
CONFLICT_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
    # A lease or watermark written for a partition whose topic a concurrent transaction
    # deleted: tried again, the statement's join with `partitions` leaves it out.
    asyncpg.exceptions.ForeignKeyViolationError,
)


async def unknown_partition(
    connection: asyncpg.Connection, pid: int, what: str
) -> PartitionDeleted | InvariantViolation:
    """Why a write named a partition id the partitions table does not hold: its topic was
    deleted (a leader that has not heard yet: PartitionDeleted), or a bug."""
    row = await connection.fetchrow("SELECT topic, partition FROM deleted_partitions WHERE pid = $1", pid)
    if row is not None:
        return PartitionDeleted(f"{row['topic']}/{row['partition']}", what)
    return InvariantViolation(f"unknown partition id {pid}")


_PARTITION_COLUMNS = "pid, topic, partition, creation_epoch, term, created_at"
_LOG_COLUMNS = "log_offset, term, base_offset, kind, entry"
_LOG_INSERT = """INSERT INTO log (pid, log_offset, term, base_offset, kind, epoch, record_count,
    byte_length, object_key, entry, appended_at)
SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[],
    $6::bigint[], $7::bigint[], $8::bigint[], $9::text[], $10::bytea[], $11::float8[])"""
# The fence and the append in one statement: lock the batch's partitions in pid order (two
# batches never deadlock), advance only those whose term and next offset are still the caller's,
# insert the log rows of exactly those. Returns every locked partition: accepted or why not.
# The log rows are one array of the `log` table's row type ($5), each a `log_row` tuple (its
# columns in the table's order, LOG_ROW_COLUMNS): asyncpg encodes a tuple as a record with
# one type check a row, where eleven arrays of columns took one per value (and a transposition
# in Python): half the client's CPU a row (3.5 -> 1.8 us at 111 rows a batch).
APPEND_BATCH = """WITH locked AS MATERIALIZED (
    SELECT pid, term, next_log_offset FROM partitions
    WHERE pid = ANY($1::bigint[]) ORDER BY pid FOR UPDATE
), asks AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[])
        AS a (pid, term, first_offset, next_offset)
), advanced AS (
    UPDATE partitions p SET next_log_offset = COALESCE(a.next_offset, l.next_log_offset)
    FROM asks a JOIN locked l ON l.pid = a.pid
    WHERE p.pid = a.pid AND l.term = a.term
      AND (a.first_offset IS NULL OR l.next_log_offset = a.first_offset)
    RETURNING p.pid
), inserted AS (
    INSERT INTO log (pid, log_offset, term, base_offset, kind, epoch, record_count, byte_length,
        object_key, entry, appended_at)
    SELECT r.pid, r.log_offset, r.term, r.base_offset, r.kind, r.epoch, r.record_count,
        r.byte_length, r.object_key, r.entry, r.appended_at
    FROM unnest($5::log[]) AS r
    WHERE r.pid IN (SELECT pid FROM advanced)
    RETURNING 1
)
SELECT l.pid, l.term, l.next_log_offset, l.pid IN (SELECT pid FROM advanced) AS accepted,
    (SELECT count(*) FROM inserted) AS inserted, txid_current() AS txid
FROM locked l"""
_L0_INSERT = """INSERT INTO l0_objects (key, epoch, size, created_at, extents, deleted_at, deleted_at_m)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::float8[], $5::bigint[],
    $6::float8[], $7::bigint[])
ON CONFLICT (key) DO NOTHING"""
_FENCE_INSERT = """INSERT INTO fence_events (at, pid, term, epoch, outcome, window_min, window_max,
    decisions)
SELECT * FROM unnest($1::float8[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[],
    $6::bigint[], $7::bigint[], $8::bigint[])"""
_SAMPLE_INSERT = """INSERT INTO state_samples (at, pid, term, previous_applied_epoch,
    max_applied_epoch, min_epoch_lower_bound, mp, lro, high_watermark, start_offset)
SELECT * FROM unnest($1::float8[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[],
    $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[])"""
_GC_COLUMNS = GcRoundRow.__struct_fields__
_GC_UPSERT = (
    f"INSERT INTO gc_rounds ({', '.join(_GC_COLUMNS)}) VALUES "
    f"({', '.join(f'${i + 1}' for i in range(len(_GC_COLUMNS)))}) ON CONFLICT (round_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _GC_COLUMNS[1:])
)
_OFFSET_COLUMNS = ", ".join(OffsetRow.__struct_fields__)
_NOW = "extract(epoch from clock_timestamp())::double precision"  # the control plane's clock
_PRODUCER_BATCH_COLUMNS = (
    "producer_id, producer_epoch, topic, partition, base_sequence, record_count, base_offset, stored_at"
)
_PRODUCER_BATCH_UPSERT = (
    f"INSERT INTO producer_batches ({_PRODUCER_BATCH_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    " ON CONFLICT (producer_id, topic, partition, base_sequence) DO UPDATE SET"
    " producer_epoch = excluded.producer_epoch, record_count = excluded.record_count,"
    " base_offset = excluded.base_offset, stored_at = excluded.stored_at"
)
# The `$4` newest batches of one (producer, topic, partition) remain.
_PRODUCER_BATCH_PRUNE = (
    "DELETE FROM producer_batches WHERE producer_id = $1 AND topic = $2 AND partition = $3"
    " AND base_sequence NOT IN (SELECT base_sequence FROM producer_batches WHERE producer_id = $1"
    " AND topic = $2 AND partition = $3 ORDER BY stored_at DESC, base_sequence DESC LIMIT $4)"
)
_OFFSET_UPSERT = (
    f"INSERT INTO consumer_offsets ({_OFFSET_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"
    " ON CONFLICT (group_id, topic, partition) DO UPDATE SET"
    " committed_offset = excluded.committed_offset, metadata = excluded.metadata,"
    " committed_at = excluded.committed_at, leader_epoch = excluded.leader_epoch"
)
_L1_COLUMNS = ", ".join(L1Row.__struct_fields__)
_SELECT_PLACEHOLDERS = f"""SELECT {_LOG_COLUMNS} FROM log
WHERE pid = $1 AND kind = 'placeholder'
  AND base_offset >= COALESCE(
      (SELECT MAX(base_offset) FROM log
       WHERE pid = $1 AND kind = 'placeholder' AND base_offset <= $2), $2)
  AND base_offset + record_count > $2
ORDER BY base_offset, log_offset
LIMIT $3"""


def stagger_s(statement_s: float) -> float:
    """How long after the first half of a crowd the second goes (`PostgresBase._pick`): half a
    statement by the writers' running mean, at most `STAGGER_MAX_S`; 0 before any statement."""
    return min(STAGGER_FRACTION * max(0.0, statement_s), STAGGER_MAX_S)


def redacted(dsn: str) -> str:
    """The DSN without its password, for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(dsn)
    except ValueError:
        return "<unparsable DSN>"
    if parts.password is None:
        return dsn
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


async def _keep_session(connection: asyncpg.Connection) -> None:
    """The pool's reset of a connection it takes back, after asyncpg rolled back any open
    transaction: nothing more. The store leaves no session state behind a call (no SET, LISTEN,
    cursor or session advisory lock: migrate's is released, or its pool closed), and asyncpg's
    default reset (`RESET ALL`, `CLOSE ALL`, ...) is one more round trip for every batch."""


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [[row[i] for row in rows] for i in range(width)] if rows else [[] for _ in range(width)]


class _Job:
    """One write call waiting for a batch: an append (`pid` set) or rows for a table."""

    __slots__ = (
        "weight",
        "pid",
        "term",
        "records",
        "log_rows",
        "table",
        "rows",
        "done",
        "result",
        "error",
        "notify",
    )

    def __init__(
        self,
        *,
        weight: int,
        pid: int | None = None,
        term: int = 0,
        records: list[LogRecord] | None = None,
        log_rows: list[tuple[Any, ...]] | None = None,
        table: str | None = None,
        rows: list[tuple[Any, ...]] | None = None,
    ) -> None:
        assert (pid is None) != (table is None)
        self.weight = max(1, weight)
        self.pid = pid
        self.term = term
        self.records = records or []
        self.log_rows = log_rows or []
        self.table = table
        self.rows = rows or []
        self.done = Done()
        self.result: Any = None
        self.error: BaseException | None = None
        # Called (on the batch's task) when the job's batch has committed, before its caller
        # wakes: `append_many` tells each partition at its own batch's COMMIT through it.
        self.notify: Callable[[_Job], None] | None = None


class _InDoubt(Exception):
    def __init__(self, txid: int) -> None:
        self.txid = txid


class PostgresBase(StoreLifecycle):
    """What every role shares: the pool, opening and closing, retries, the group-commit
    dispatcher. `store.PostgresLogStore` is this and every role: create it with `open` or
    `open_in`, never directly."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        where: str,
        *,
        group_commit_max_records: int,
        queue_max: int,
        writers: int,
        reconnect_timeout_s: float,
        clock: Callable[[], float],
    ) -> None:
        self._pool = pool
        self._where = where
        self._group_commit_max_records = group_commit_max_records
        self._queue_max = queue_max
        self._writers = writers
        self._reconnect_timeout_s = reconnect_timeout_s
        self._clock = clock
        self._job_send, self._job_receive = anyio.create_memory_object_stream[_Job](queue_max)
        # The writers' shared state (see `_writer`): calls taken from the queue and not yet in
        # a batch, whether the queue is still open, the writers waiting for work.
        self._waiting: deque[_Job] = deque()
        self._open = True
        self._idle: deque[asyncio.Future[None]] = deque()
        # Each writer's connection, held from its first batch of appends to the store's end.
        self._connections: list[asyncpg.Connection | None] = [None] * writers
        self._busy_pids: set[int] = set()
        self._in_flight = 0  # batches on their way
        # The append statement's recent time (a running mean) and the timer that wakes a
        # writer for the second half of a split crowd (see `_writer`).
        self._statement_s = 0.0
        self._staggered: asyncio.TimerHandle | None = None
        self._writer_done = anyio.Event()
        self._writer_started = False
        self._owned_task_group: anyio.abc.TaskGroup | None = None
        self._closed = False
        self._unavailable_since: float | None = None
        # Told of each connection failure the store retries (the daemon's storage health).
        self.on_connection_error: Callable[[str, BaseException], None] | None = None
        self._batches = self._commits = self._jobs = self._appends = 0
        self._records = self._rejected_appends = self._largest_batch_records = 0

    if TYPE_CHECKING:
        # ProducerBatchRole defines it; the catalog and consumer-offset roles stage their rows
        # through it in the composed store (PostgresLogStore).
        async def _stage(self, table: str, rows: list[tuple[Any, ...]]) -> None: ...

    # ------------------------------------------------------------------ open / close

    @classmethod
    async def open(cls, dsn: str, **options: Any) -> Self:
        """Connect, migrate, start the dispatcher in a task group the store owns; call
        `aclose()` from this same task (or `async with await PostgresLogStore.open(...)`)."""
        store = await cls._connect(dsn, **options)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        try:
            await task_group.start(store._run_writer)
        except BaseException as error:
            await store._stop_writer()
            await task_group.__aexit__(type(error), error, error.__traceback__)
            await store._pool.close()
            raise
        store._owned_task_group = task_group
        return store

    @classmethod
    async def open_in(cls, task_group: anyio.abc.TaskGroup, dsn: str, **options: Any) -> Self:
        """Like `open`, with the dispatcher in `task_group`; `aclose()` before it ends."""
        store = await cls._connect(dsn, **options)
        try:
            await task_group.start(store._run_writer)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await store._pool.close()
            raise
        return store

    @classmethod
    async def _connect(
        cls,
        dsn: str,
        *,
        password: str | None = None,
        pool_max: int = POOL_MAX,
        writers: int = WRITERS,
        group_commit_max_records: int = GROUP_COMMIT_MAX_RECORDS,
        queue_max: int = QUEUE_MAX,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        reconnect_timeout_s: float = RECONNECT_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        idle_in_transaction_timeout_s: float = IDLE_IN_TRANSACTION_TIMEOUT_S,
        application_name: str = "levelzero",
    ) -> Self:
        for name, value, high in (
            ("writers", writers, 64),
            ("pool_max", pool_max, 1000),
            ("group_commit_max_records", group_commit_max_records, 1_000_000),
            ("queue_max", queue_max, 1_000_000),
        ):
            if not (isinstance(value, int) and 1 <= value <= high):
                raise InvalidInput(f"{name} must be an integer in [1, {high}], not {value!r}")
        if not 0.1 <= idle_in_transaction_timeout_s <= 3600.0:
            raise InvalidInput(
                f"idle_in_transaction_timeout_s must be in [0.1, 3600], not {idle_in_transaction_timeout_s!r}"
            )
        if pool_max < writers + 1:
            raise InvalidInput(f"pool_max ({pool_max}) must exceed writers ({writers})")
        where = redacted(dsn)
        try:
            pool = await asyncpg.create_pool(
                dsn,
                password=password,
                min_size=1,
                max_size=pool_max,
                timeout=connect_timeout_s,
                command_timeout=COMMAND_TIMEOUT_S,
                reset=_keep_session,
                server_settings={
                    "idle_in_transaction_session_timeout": str(round(idle_in_transaction_timeout_s * 1000)),
                    # pg_stat_activity names the node each session belongs to
                    "application_name": application_name,
                },
            )
        except asyncpg.InvalidPasswordError as error:
            raise StoreRefused(f"{where}: authentication failed: {error}: {REFUSED_LOGIN_HINT}") from None
        except asyncpg.InvalidAuthorizationSpecificationError as error:
            raise StoreRefused(
                f"{where}: authentication failed: {error}: check the user in control.dsn, and that "
                "the server's pg_hba.conf lets it connect"
            ) from None
        except asyncpg.InvalidCatalogNameError as error:
            raise StoreRefused(f"{where}: {error}") from None
        except CONNECTION_ERRORS as error:
            raise StorageError(f"{where}: cannot connect: {error!r}") from None
        except (ValueError, asyncpg.exceptions.ClientConfigurationError) as error:
            raise StoreRefused(f"{where}: bad DSN: {error}") from None
        try:
            async with pool.acquire() as connection:
                await migrate(connection, where)
        except BaseException as error:
            with anyio.CancelScope(shield=True):
                await pool.close()
            if isinstance(error, asyncpg.PostgresError) and not isinstance(error, CONNECTION_ERRORS):
                raise StoreRefused(f"{where}: cannot set up the schema: {error}") from None
            if isinstance(error, CONNECTION_ERRORS):
                raise StorageError(f"{where}: connection lost during start-up: {error!r}") from None
            raise
        return cls(
            pool,
            where,
            group_commit_max_records=group_commit_max_records,
            queue_max=queue_max,
            writers=writers,
            reconnect_timeout_s=reconnect_timeout_s,
            clock=clock,
        )

    async def _release(self) -> None:
        """Close the pool (`StoreLifecycle.aclose` calls this last)."""
        with anyio.move_on_after(CONNECT_TIMEOUT_S):
            await self._pool.close()
        if not self._pool.is_closing():
            self._pool.terminate()

    async def _stop_writer(self) -> None:
        await self._job_send.aclose()
        self._wake_idle(everyone=True)  # to see the queue closed
        if self._writer_started:
            await self._writer_done.wait()

    @property
    def where(self) -> str:
        """The database, without its password."""
        return self._where

    @property
    def available(self) -> bool:
        """False while the database cannot be reached (readiness turns 503)."""
        return self._unavailable_since is None

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
            failed=not self.available,
        )

    def __repr__(self) -> str:
        return f"<PostgresLogStore {self._where} {'closed' if self._closed else 'open'}>"

    # ------------------------------------------------------------------ retries

    def _note(self, ok: bool) -> None:
        if ok:
            self._unavailable_since = None
        elif self._unavailable_since is None:
            self._unavailable_since = time.monotonic()

    async def _retrying(self, attempt: Callable[[], Awaitable[Any]], what: str) -> Any:
        """Run `attempt` until it gets through connection trouble, for up to
        reconnect_timeout_s; then StorageError (retriable)."""
        deadline = anyio.current_time() + self._reconnect_timeout_s
        delay = RETRY_DELAY_MIN_S
        while True:
            try:
                result = await attempt()
            except CONNECTION_ERRORS + CONFLICT_ERRORS as error:
                if not isinstance(error, CONFLICT_ERRORS):
                    self._note(False)
                    if self.on_connection_error is not None:
                        self.on_connection_error(what, error)
                if anyio.current_time() + delay > deadline:
                    raise StorageError(f"{self._where}: {what} failed: {error!r}") from None
                await anyio.sleep(delay)
                delay = min(delay * 2, RETRY_DELAY_MAX_S)
                continue
            except asyncpg.PostgresError as error:
                raise StorageError(f"{self._where}: {what} failed: {error}") from None
            self._note(True)
            return result

    async def _read(self, what: str, query: str, *args: Any) -> list[asyncpg.Record]:
        self._check_open()

        async def attempt() -> list[asyncpg.Record]:
            async with self._pool.acquire() as connection:
                return await connection.fetch(query, *args)

        return await self._retrying(attempt, what)

    async def _transact(
        self,
        what: str,
        work: Callable[[asyncpg.Connection], Awaitable[Any]],
        resolve: Callable[[asyncpg.Connection], Awaitable[Any]] | None = None,
        *,
        check_open: bool = True,
        work_returns_txid: bool = False,
    ) -> Any:
        """`work` in one transaction. If its COMMIT went unanswered, the transaction's
        `txid_status` says whether it happened: committed → `resolve` rebuilds the result
        (None: None), otherwise `work` runs again."""
        if check_open:
            self._check_open()
        txid: list[int] = []

        async def attempt() -> Any:
            if txid:
                status = await self._txid_status(txid[0])
                if status == "committed":
                    if resolve is None:
                        return None
                    async with self._pool.acquire() as connection:
                        return await resolve(connection)
                txid.clear()
            async with self._pool.acquire() as connection, connection.transaction():
                if not work_returns_txid:
                    txid.append(await connection.fetchval("SELECT txid_current()"))
                    return await work(connection)
                result, their_txid = await work(connection)
                txid.append(their_txid)  # before COMMIT: an unanswered one is resolved
                return result

        return await self._retrying(attempt, what)

    async def _txid_status(self, txid: int) -> str:
        """committed | aborted; waits out 'in progress' (the server has not yet noticed the
        connection is gone). Raises a connection error to be retried."""
        while True:
            async with self._pool.acquire() as connection:
                status = await connection.fetchval("SELECT txid_status($1)", txid)
            if status != "in progress":
                if status is None:
                    raise StorageError(f"{self._where}: the outcome of transaction {txid} is lost")
                return str(status)
            await anyio.sleep(RETRY_DELAY_MIN_S)

    def _check_open(self) -> None:
        if self._closed:
            raise ShuttingDown(f"{self._where}: log store is closed")

    # ------------------------------------------------------------------ the dispatcher

    async def _run_writer(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """`writers` writers, each running one batch at a time on its own connection, until the
        queue is closed and every call is answered."""
        self._writer_started = True
        try:
            async with anyio.create_task_group() as tg:
                for k in range(self._writers):
                    tg.start_soon(self._writer, k)
                task_status.started()
        finally:
            if self._staggered is not None:
                self._staggered.cancel()
                self._staggered = None
            for job in self._waiting:
                job.error = self._write_refused()
                job.done.set()
            self._waiting.clear()
            self._job_receive.close()
            self._writer_done.set()

    async def _writer(self, k: int) -> None:
        """Writer `k`: takes the waiting calls into a batch (one append per partition in flight)
        and runs it, then the next, without a turn of the event loop between a batch's answer
        and the next batch's statement when calls are waiting. A writer that finds none (or
        only calls of partitions another writer's batch holds) waits until a call is queued
        (`_send_all` wakes it) or another writer leaves calls behind.

        A writer per connection, each taking its own next batch, where a dispatcher task took
        the calls and started a task per batch: the batch's task, the dispatcher's wake-up and
        the pool's acquire and (shielded-task) release were two to four turns of the loop and
        a task spawn between a writer's answer and its next statement, while the closed loop's
        callers, back from the other batch, kept the loop busy (`levelzero bench --only
        control`)."""
        try:
            while True:
                self._take_queued()
                batch, halved = self._pick(self._waiting) if self._waiting else ([], False)
                if batch:
                    self._in_flight += 1
                    if self._waiting:  # what is left: half of a crowd, or past the bound
                        if halved:
                            self._wake_idle_later(stagger_s(self._statement_s))
                        else:
                            self._wake_idle()
                    await self._execute_batch(batch, k)
                    continue
                if not self._open and not self._waiting:
                    return
                # Nothing to take (or every waiting call's partition is in another batch: that
                # writer takes them when its batch is answered).
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._idle.append(waiter)
                try:
                    await waiter
                finally:
                    if not waiter.done():  # cancelled: not woken, not waiting any more
                        self._idle.remove(waiter)
        finally:
            connection, self._connections[k] = self._connections[k], None
            if connection is not None:
                await self._give_back(connection)

    async def _give_back(self, connection: asyncpg.Connection) -> None:
        """A writer's connection back to the pool, whatever happens (a broken one is dropped):
        its batches were answered or failed already."""
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(CONNECT_TIMEOUT_S),
            contextlib.suppress(*CONNECTION_ERRORS),  # the pool dropped it
        ):
            await self._pool.release(connection)

    def _take_queued(self) -> None:
        """Every call queued, into `_waiting` (no turn of the loop)."""
        while self._open:
            try:
                self._waiting.append(self._job_receive.receive_nowait())
            except anyio.WouldBlock:
                return
            except anyio.EndOfStream:
                self._open = False
                self._wake_idle(everyone=True)  # to finish and end

    def _wake_idle_later(self, delay_s: float) -> None:
        """A waiting writer looks for work `delay_s` from now (at once if 0): the second half
        of a crowd split with nothing on its way.

        Why later: a closed loop's callers (a node's producers, the benchmark's callers) write
        again as soon as their batch is answered. Two halves sent together are answered
        together, their callers turn around together on the event loop, while both
        connections sit idle, and come back as one crowd: the halves stay in lock-step, every
        cycle a statement *plus* a turnaround long (`levelzero bench --only control`: each
        connection busy two thirds of the time). Half a statement apart, one half's callers
        turn around while the other half's statement runs. A call queued meanwhile wakes a
        writer at once (`_send_all`), and a writer answered meanwhile takes what waits itself."""
        if delay_s <= 0:
            self._wake_idle()
            return
        if self._staggered is None:
            self._staggered = asyncio.get_running_loop().call_later(delay_s, self._staggered_wake)

    def _staggered_wake(self) -> None:
        self._staggered = None
        self._wake_idle()

    def _wake_idle(self, *, everyone: bool = False) -> None:
        """One waiting writer (`everyone`: all) looks for work: the last to wait, so that calls
        one at a time keep to one writer's connection."""
        while self._idle:
            waiter = self._idle.pop()
            if not waiter.done():
                waiter.set_result(None)
                if not everyone:
                    return

    def _pick(self, waiting: deque[_Job]) -> tuple[list[_Job], bool]:
        """The next batch: calls in arrival order, skipping appends of partitions with an
        append in flight (or skipped already: their order holds), up to the record bound; and
        whether it is the first half of a crowd (the rest go half a statement later)."""
        batch: list[_Job] = []
        skipped: deque[_Job] = deque()
        blocked: set[int] = set()
        weight = 0
        jobs_max = len(waiting)
        halved = self._in_flight == 0 and jobs_max >= SPLIT_JOBS_MIN and self._writers > 1
        if halved:
            # Half now, the rest half a statement behind it (`_wake_idle_later`): callers that
            # wait for their commit before they write again would otherwise keep meeting in
            # one batch, one commit at a time.
            jobs_max = (jobs_max + 1) // 2
        while waiting and len(batch) < jobs_max:
            job = waiting.popleft()
            if job.pid is not None and (job.pid in self._busy_pids or job.pid in blocked):
                blocked.add(job.pid)
                skipped.append(job)
                continue
            if batch and weight + job.weight > self._group_commit_max_records:
                waiting.appendleft(job)
                break
            batch.append(job)
            weight += job.weight
            if job.pid is not None:
                self._busy_pids.add(job.pid)
        waiting.extendleft(reversed(skipped))
        return batch, halved

    async def _execute_batch(self, jobs: list[_Job], writer: int) -> None:
        freed = False

        def answer(outcomes: list[tuple[Any, BaseException | None]]) -> None:
            """Tell the batch's callers and free its partitions and its slot (once)."""
            nonlocal freed
            self._complete(jobs, outcomes)
            freed = True
            self._free(jobs)

        try:
            self._batches += 1
            try:
                if all(job.pid is not None for job in jobs):
                    # Answered by `_append_batch` itself as soon as the statement's answer is in.
                    outcomes = await self._append_batch(jobs, answer, writer)
                else:
                    outcomes = await self._transact(
                        "a write batch",
                        lambda c: self._run_batch(c, jobs),
                        check_open=False,
                        work_returns_txid=True,
                    )
                if freed:
                    return
                if outcomes is None:  # committed, answer lost: what was decided then stands
                    outcomes = [(job.result, job.error) for job in jobs]
            except Exception as error:
                if not freed:
                    for job in jobs:
                        job.error = StorageError(f"{self._where}: a write batch failed: {error!r}")
                        job.done.set()
                if not isinstance(error, LevelZeroError):
                    raise  # a bug: crash loudly (the callers got StorageError)
                return
            answer(outcomes)
        finally:
            if not freed:
                freed = True
                self._free(jobs)

    def _free(self, jobs: list[_Job]) -> None:
        """A batch is over: its partitions may append again (its writer takes the next)."""
        for job in jobs:
            if job.pid is not None:
                self._busy_pids.discard(job.pid)
        self._in_flight -= 1

    def _complete(self, jobs: list[_Job], outcomes: list[tuple[Any, BaseException | None]]) -> None:
        self._commits += 1
        records = 0
        for job, (result, error) in zip(jobs, outcomes, strict=True):
            job.result, job.error = result, error
            self._jobs += 1
            if job.pid is not None:
                if error is None:
                    self._appends += 1
                    records += len(job.log_rows)
                else:
                    self._rejected_appends += 1
            job.done.set()
            if job.notify is not None:
                job.notify(job)
        self._records += records
        self._largest_batch_records = max(self._largest_batch_records, records)

    async def _append_batch(
        self,
        jobs: list[_Job],
        answer: Callable[[list[tuple[Any, BaseException | None]]], None],
        writer: int,
    ) -> list[tuple[Any, BaseException | None]] | None:
        """A batch of appends only (the hot path): the fence-and-append statement alone, a
        transaction by itself, so that the batch is one round trip; BEGIN, the statement and
        COMMIT were three, and on a busy event loop each answer waits its turn to be read. The
        answer comes after the COMMIT (its WAL flushed: the same durability), and the statement
        is atomic as the explicit transaction was.

        If that answer is lost (the connection failed, the server restarted, a conflict), no
        txid says whether it committed: the batch runs again as an explicit transaction that
        first locks its partitions' rows, in pid order as the statement does (a statement still
        running on the lost session finishes first), then counts as accepted each append whose
        first record is in the log under its term (nothing else writes it: a partition has one
        append on its way), and appends the rest. A lost statement that had not locked them yet
        is refused by the fence when it does (the partition's next offset moved on).

        The batch runs on its writer's own connection (`writer`), held from batch to batch:
        taking one from the pool and giving it back for every batch was a shielded task of
        asyncpg's and turns of the event loop. A failed attempt gives the connection back (the
        pool drops a broken one) and the next takes another. The batch is answered (`answer`)
        as soon as the statement's answer is in. Returns None once answered; otherwise (the
        answer lost, the batch resolved) its outcomes."""
        lost = False

        async def attempt() -> list[tuple[Any, BaseException | None]] | None:
            nonlocal lost
            if lost:
                outcomes: list[tuple[Any, BaseException | None]] | None = await self._transact(
                    "a write batch",
                    lambda c: self._run_batch(c, jobs, resolve=True),
                    check_open=False,
                    work_returns_txid=True,
                )
                return outcomes
            connection = self._connections[writer]
            if connection is None:
                connection = self._connections[writer] = await self._pool.acquire()
            lost = True  # from here, a failure may come after the COMMIT
            try:
                started = time.perf_counter()
                outcomes, _ = await self._run_batch(connection, jobs)
                self._note_statement(time.perf_counter() - started)
            except BaseException:
                self._connections[writer] = None
                await self._give_back(connection)
                raise
            answer(outcomes)
            return None

        result: list[tuple[Any, BaseException | None]] | None = await self._retrying(attempt, "a write batch")
        return result

    def _note_statement(self, took_s: float) -> None:
        """An append statement's round trip, into the writers' running mean (the stagger)."""
        if self._statement_s == 0.0:
            self._statement_s = took_s
        else:
            self._statement_s += STATEMENT_MEAN_WEIGHT * (took_s - self._statement_s)

    async def _run_batch(
        self, connection: asyncpg.Connection, jobs: list[_Job], *, resolve: bool = False
    ) -> tuple[list[tuple[Any, BaseException | None]], int]:
        """The batch's statements; decides every call's outcome (kept on the job too, for a
        batch whose COMMIT answer is lost). In one transaction, or (appends only) outside any:
        its one statement is then a transaction by itself. `resolve`: the batch ran before and
        its answer was lost (`_append_batch`): appends already in the log are accepted."""
        outcomes: list[tuple[Any, BaseException | None]] = [(None, None)] * len(jobs)
        appends = [(index, job) for index, job in enumerate(jobs) if job.pid is not None]
        txid: int | None = None
        if resolve and appends:
            await connection.execute(
                "SELECT 1 FROM partitions WHERE pid = ANY($1::bigint[]) ORDER BY pid FOR UPDATE",
                [job.pid for _, job in appends],
            )
            firsts = [(job.pid, job.records[0].log_offset, job.term) for _, job in appends if job.records]
            present = {
                row["pid"]
                for row in await connection.fetch(
                    "SELECT l.pid FROM log l JOIN unnest($1::bigint[], $2::bigint[], $3::bigint[])"
                    " AS a (pid, log_offset, term) ON l.pid = a.pid AND l.log_offset = a.log_offset"
                    " AND l.term = a.term",
                    *_columns(firsts, 3),
                )
            }
            appends = [(index, job) for index, job in appends if job.pid not in present]
        if appends:
            asks = [
                (
                    job.pid,
                    job.term,
                    job.records[0].log_offset if job.records else None,
                    job.records[-1].log_offset + 1 if job.records else None,
                )
                for _, job in appends
            ]
            log_rows = [row for _, job in appends for row in job.log_rows]
            # One round trip: lock, fence, advance and insert (the log rows of refused appends
            # are filtered out by the statement itself).
            rows = await connection.fetch(APPEND_BATCH, *_columns(asks, 4), log_rows)
            locked = {row["pid"]: row for row in rows}
            txid = rows[0]["txid"] if rows else None
            for index, job in appends:
                row = locked.get(job.pid)
                assert job.pid is not None
                if row is None:
                    outcomes[index] = (None, await unknown_partition(connection, job.pid, "append"))
                elif not row["accepted"]:
                    outcomes[index] = (None, await self._refusal(connection, job, row))
        if txid is None:
            txid = await connection.fetchval("SELECT txid_current()")
        for table, statement, width in (
            ("l0_objects", _L0_INSERT, 7),
            ("fence_events", _FENCE_INSERT, 8),
            ("state_samples", _SAMPLE_INSERT, 10),
        ):
            rows = [row for job in jobs if job.table == table for row in job.rows]
            if rows:
                await connection.execute(statement, *_columns(rows, width))
        for table, statement in (("gc_rounds", _GC_UPSERT), ("consumer_offsets", _OFFSET_UPSERT)):
            rows = [row for job in jobs if job.table == table for row in job.rows]
            if rows:  # upserts: in call order, a later row of one key wins
                await connection.executemany(statement, rows)
        batches = [row for job in jobs if job.table == "producer_batches" for row in job.rows]
        if batches:  # rows carry `keep` last: upsert each, then keep the newest per partition
            await connection.executemany(_PRODUCER_BATCH_UPSERT, [row[:-1] for row in batches])
            kept = {(row[0], row[2], row[3]): row[-1] for row in batches}
            await connection.executemany(
                _PRODUCER_BATCH_PRUNE, [(*key, keep) for key, keep in sorted(kept.items())]
            )
        for job, (result, error) in zip(jobs, outcomes, strict=True):
            job.result, job.error = result, error
        return outcomes, txid

    async def _refusal(
        self, connection: asyncpg.Connection, job: _Job, row: asyncpg.Record
    ) -> LevelZeroError | InvariantViolation:
        """Why the database refused an append (rare: read the partition's name only then)."""
        names = await connection.fetchrow("SELECT topic, partition FROM partitions WHERE pid = $1", job.pid)
        name = f"{names['topic']}/{names['partition']}"
        if row["term"] != job.term:
            return NotLeader(name, job.term, row["term"])
        return InvariantViolation(
            f"partition {name}: append at log offset {job.records[0].log_offset}, "
            f"the log continues at {row['next_log_offset']}"
        )

    def _write_refused(self) -> LevelZeroError:
        return ShuttingDown(f"{self._where}: log store is closing")

    async def _submit(self, job: _Job) -> Any:
        await self._send_all([job])
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    async def _send_all(self, jobs: Sequence[_Job]) -> None:
        """Hand jobs to the writers in order (the caller then waits for each one's `done`)."""
        for job in jobs:
            check_call_records(job.weight, self._group_commit_max_records)
        woken = False
        for job in jobs:
            if self._closed:
                raise self._write_refused()
            try:
                try:
                    self._job_send.send_nowait(job)
                except anyio.WouldBlock:
                    await self._job_send.send(job)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                raise self._write_refused() from None
            if self._idle and (self._in_flight or not woken):
                # (A busy writer takes it when its batch is answered. With nothing on its way,
                # one writer for the call: it splits a crowd and staggers the halves, `_pick`.)
                self._wake_idle()
                woken = True
