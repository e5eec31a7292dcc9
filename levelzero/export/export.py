"""Export a levelzero store's SQLite tables to date-partitioned Parquet, incrementally.

    report = export("/var/lib/levelzero/levelzero.db", "/data/lz-export")

Safe beside a running daemon: the database is opened read-only (`mode=ro`) and never locked
(the store's `<db>.lock` is not touched); every table is read inside one read transaction, which
in WAL mode is a consistent snapshot that the daemon's writer neither blocks nor waits for. It
works the same on a stopped daemon's data directory.

Memory stays bounded whatever the table sizes: rows are fetched `chunk_rows` at a time and each
chunk goes straight to a `ParquetWriter` (one per date partition, at most `WRITERS_OPEN_MAX`
open) as one row group. Only the manifest's watermarks live across chunks.

An export is all or nothing: files are written under hidden temporary names, renamed when every
table is done, and the manifest (`manifest.py`) — the commit point — is replaced last. Two
exports into one directory exclude each other with a lock file of the output directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from levelzero.core.errors import directory_problem
from levelzero.storage.sqlite.schema import SELECT_CLUSTER_EPOCH, SELECT_LOG_ENDS

from levelzero.storage.postgres.schema import SELECT_LOG_ENDS as PG_SELECT_LOG_ENDS
from levelzero.storage.postgres.store import redacted

from . import manifest as manifest_file
from .compact import SMALL_FILE_BYTES, compact, remove_superseded
from .errors import ExportError
from .postgres_source import NEW_ROWS, is_dsn, postgres_snapshot
from .sqlite_source import sqlite_snapshot
from .manifest import EXPORT_HISTORY_MAX, ExportRecord, Manifest, RowRuns, Watermarks
from .schemas import L1_STATE_RANK, L1_TERMINAL_RANK, TABLES

CHUNK_ROWS = 50_000  # rows fetched, converted and written at a time (one row group)
WRITERS_OPEN_MAX = 32  # date partitions of one table written at once
DB_FILE_NAME = "levelzero.db"  # inside a daemon's data_dir
LOCK_NAME = "_levelzero_export.lock"
SECONDS_PER_DAY = 86_400
MICROS_PER_S = 1_000_000
MICROS_PER_DAY = SECONDS_PER_DAY * MICROS_PER_S


@dataclass(frozen=True, slots=True)
class ExportProgress:
    table: str
    rows: int  # rows of `table` written so far by this export
    done: bool  # the table is complete


ProgressCallback = Callable[[ExportProgress], None]


@dataclass(frozen=True, slots=True)
class ExportReport:
    export_id: str
    db_path: str
    out_dir: str
    rows: dict[str, int]  # rows added per table
    files: list[str]  # data files added, relative to out_dir
    cluster_epoch: int
    duration_s: float
    warnings: list[str] = field(default_factory=list)

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())

    @property
    def rows_per_s(self) -> float:
        return self.total_rows / self.duration_s if self.duration_s > 0 else math.inf

    def summary(self) -> str:
        per_table = ", ".join(f"{name} {count}" for name, count in self.rows.items())
        return (
            f"export {self.export_id}: {self.total_rows} new rows ({per_table}) from "
            f"{self.db_path} to {self.out_dir} in {self.duration_s:.2f} s "
            f"({self.rows_per_s:,.0f} rows/s), {len(self.files)} files, "
            f"cluster epoch {self.cluster_epoch}"
        )


def db_path_in(data_dir: str | os.PathLike[str]) -> str:
    """The SQLite database of a daemon's `data_dir`."""
    return os.path.join(os.fspath(data_dir), DB_FILE_NAME)


def export(
    db_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    progress: ProgressCallback | None = None,
    chunk_rows: int = CHUNK_ROWS,
    small_file_bytes: int = SMALL_FILE_BYTES,
    password: str | None = None,
) -> ExportReport:
    """Add every row of the store at `db_path` not yet in `out_dir` to `out_dir`, then fold
    the small files of the date partitions it wrote into (`compact.py`; 0: never). `db_path`
    may be a PostgreSQL control plane's DSN (`postgresql://...`; `password` apart, or from
    PGPASSWORD / ~/.pgpass)."""
    if not (isinstance(chunk_rows, int) and 1 <= chunk_rows <= 1_000_000):
        raise ExportError(f"chunk_rows must be an integer in 1..1000000, not {chunk_rows!r}")
    started_wall, started = time.time(), time.monotonic()
    source = os.fspath(db_path)
    dsn = source if is_dsn(source) else None
    db_path = redacted(source) if dsn else _check_db_file(source)
    out_dir = os.path.abspath(os.fspath(out_dir))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as error:
        raise ExportError(f"output directory: {directory_problem(out_dir, error)}") from None
    with _locked(out_dir):
        manifest = manifest_file.load(out_dir) or Manifest()
        _remove_uncommitted(out_dir, manifest.last_seq)
        remove_superseded(out_dir, manifest.superseded)  # left by a crash after the commit
        manifest.superseded = []
        seq = manifest.last_seq + 1
        export_id = f"{seq:06d}-{datetime.fromtimestamp(started_wall, UTC):%Y%m%dT%H%M%SZ}"
        files = _FileSet(out_dir)
        try:
            opened = postgres_snapshot(dsn, password) if dsn else sqlite_snapshot(db_path)
            with opened as connection:
                fingerprint = _fingerprint(connection)
                _check_same_source(out_dir, manifest, fingerprint, db_path)
                cluster_epoch = _cluster_epoch(connection)
                run = _ExportRun(connection, files, export_id, manifest.watermarks, progress, chunk_rows)
                watermarks, rows, warnings = run.run()
            files.commit()
        except BaseException:
            files.abort()
            raise
        # Renamed, still invisible (seq > last_seq); a failure here leaves nothing committed.
        compaction = compact(out_dir, files.committed, seq, export_id, small_file_bytes)
        record = ExportRecord(
            export_id=export_id,
            started_at=started_wall,
            finished_at=time.time(),
            cluster_epoch=cluster_epoch,
            rows=rows,
        )
        manifest.source_db = db_path
        manifest.fingerprint = manifest.fingerprint or fingerprint
        manifest.last_seq = seq
        manifest.exports = [*manifest.exports, record][-EXPORT_HISTORY_MAX:]
        manifest.watermarks = watermarks
        manifest.superseded = compaction.superseded
        manifest_file.save(out_dir, manifest)
        remove_superseded(out_dir, compaction.superseded)
    removed = set(compaction.removed)
    written = [path for path in files.committed if path not in removed] + compaction.written
    return ExportReport(
        export_id=export_id,
        db_path=db_path,
        out_dir=out_dir,
        rows=rows,
        files=written,
        cluster_epoch=cluster_epoch,
        duration_s=time.monotonic() - started,
        warnings=warnings,
    )


# ------------------------------------------------------------------------ the source database


def _check_db_file(db_path: str) -> str:
    path = os.path.abspath(db_path)
    if os.path.isdir(path):
        if os.path.isfile(db_path_in(path)):
            return db_path_in(path)
        raise ExportError(
            f"{path} is a directory without {DB_FILE_NAME}; pass the daemon's data directory "
            f"(--data-dir) or its {DB_FILE_NAME} (--db)"
        )
    if not os.path.exists(path):
        raise ExportError(
            f"{path}: no such database file; expected a levelzero store (<data_dir>/{DB_FILE_NAME})"
        )
    if not os.access(path, os.R_OK):
        raise ExportError(f"{path}: permission denied (the export needs read access)")
    return path


class Snapshot(Protocol):
    """What an export reads through, in one snapshot: a read-only sqlite3.Connection inside a
    read transaction, or a PostgresSnapshot (which answers `execute` the same way)."""

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> Any: ...


def _fingerprint(connection: Snapshot) -> str | None:
    """The store's first partition and its creation time: enough to tell two stores apart."""
    row = connection.execute(
        "SELECT topic, partition, created_at FROM partitions ORDER BY pid LIMIT 1"
    ).fetchone()
    return None if row is None else f"{row[0]}/{row[1]}@{row[2]!r}"


def _check_same_source(out_dir: str, manifest: Manifest, fingerprint: str | None, db_path: str) -> None:
    if manifest.fingerprint is not None and fingerprint != manifest.fingerprint:
        raise ExportError(
            f"{out_dir} holds an export of another store ({manifest.source_db}, first "
            f"partition {manifest.fingerprint}); {db_path} starts with {fingerprint}. "
            "Export it into a new directory"
        )


def _cluster_epoch(connection: Snapshot) -> int:
    row = connection.execute(SELECT_CLUSTER_EPOCH).fetchone()
    return row[0] if row else 1


# ------------------------------------------------------------------------ output files


@contextmanager
def _locked(out_dir: str) -> Iterator[None]:
    path = os.path.join(out_dir, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise ExportError(f"cannot create {path}: {error.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportError(f"another export is writing to {out_dir}; try again later") from None
        yield
    finally:
        os.close(fd)


def _remove_uncommitted(out_dir: str, last_seq: int) -> None:
    """Temporary files and files of exports that never committed (a crash before the manifest)."""
    for table in TABLES:
        table_dir = os.path.join(out_dir, table)
        if not os.path.isdir(table_dir):
            continue
        for partition in os.scandir(table_dir):
            if not (partition.is_dir() and partition.name.startswith("date=")):
                continue
            for entry in os.scandir(partition.path):
                seq = manifest_file.file_seq(entry.name)
                stale_temp = entry.name.startswith(".part-") and entry.name.endswith(".tmp")
                if stale_temp or (seq is not None and seq > last_seq):
                    os.unlink(entry.path)


class _FileSet:
    """Every file this export writes: temporary until `commit` renames them all."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self._pending: list[tuple[str, str]] = []  # (temporary path, final path)
        self.committed: list[str] = []

    def new(self, table: str, date: str, name: str) -> str:
        directory = os.path.join(self.out_dir, table, f"date={date}")
        os.makedirs(directory, exist_ok=True)
        final = os.path.join(directory, name)
        temp = os.path.join(directory, f".{name}.tmp")
        self._pending.append((temp, final))
        return temp

    def commit(self) -> None:
        directories = set()
        for temp, final in self._pending:
            os.replace(temp, final)
            directories.add(os.path.dirname(final))
            self.committed.append(os.path.relpath(final, self.out_dir))
        for directory in sorted(directories):
            manifest_file.fsync_dir(directory)
        self._pending.clear()

    def abort(self) -> None:
        for temp, _ in self._pending:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
        self._pending.clear()


class _TableSink:
    """Rows of one table → date-partitioned Parquet, `chunk_rows` rows per row group."""

    def __init__(
        self,
        table: str,
        files: _FileSet,
        export_id: str,
        chunk_rows: int,
        progress: ProgressCallback | None,
    ) -> None:
        self.table = table
        self._spec = TABLES[table]
        self._files = files
        self._export_id = export_id
        self._chunk_rows = chunk_rows
        self._progress = progress
        self._buffer: list[tuple[Any, ...]] = []
        self._writers: OrderedDict[int, pq.ParquetWriter] = OrderedDict()  # by day number
        self._files_per_day: dict[int, int] = {}
        self.rows = 0

    def add(self, row: tuple[Any, ...]) -> None:
        self._buffer.append(row)
        if len(self._buffer) >= self._chunk_rows:
            self.flush()

    def add_many(self, rows: Sequence[tuple[Any, ...]]) -> None:
        self._buffer.extend(rows)
        if len(self._buffer) >= self._chunk_rows:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        table = self._to_arrow(self._buffer)
        self._buffer = []
        micros = pc.cast(table.column(self._spec.time_column), pa.int64())
        days = pc.cast(pc.floor(pc.divide(micros, float(MICROS_PER_DAY))), pa.int64())
        bounds = pc.min_max(days)
        first, last = bounds["min"].as_py(), bounds["max"].as_py()
        if first == last:
            self._writer(first).write_table(table)
        else:
            for day in pc.unique(days).to_pylist():
                self._writer(day).write_table(table.filter(pc.equal(days, day)))
        self.rows += table.num_rows
        if self._progress is not None:
            self._progress(ExportProgress(self.table, self.rows, done=False))

    def close(self) -> None:
        self.flush()
        while self._writers:
            _, writer = self._writers.popitem(last=False)
            _close_durably(writer)
        if self._progress is not None:
            self._progress(ExportProgress(self.table, self.rows, done=True))

    def _to_arrow(self, rows: list[tuple[Any, ...]]) -> pa.Table:
        schema = self._spec.schema
        columns = list(zip(*rows, strict=True))
        arrays = []
        for index, column_field in enumerate(schema):
            values: Sequence[Any] = columns[index]
            if pa.types.is_boolean(column_field.type):
                values = [None if v is None else bool(v) for v in values]
            elif pa.types.is_timestamp(column_field.type):
                arrays.append(_timestamps(values, column_field.type))
                continue
            arrays.append(pa.array(values, type=column_field.type))
        return pa.Table.from_arrays(arrays, schema=schema)

    def _writer(self, day: int) -> pq.ParquetWriter:
        writer = self._writers.get(day)
        if writer is not None:
            self._writers.move_to_end(day)
            return writer
        if len(self._writers) >= WRITERS_OPEN_MAX:
            _, oldest = self._writers.popitem(last=False)
            _close_durably(oldest)
        count = self._files_per_day.get(day, 0)
        self._files_per_day[day] = count + 1
        date = datetime.fromtimestamp(day * SECONDS_PER_DAY, UTC).strftime("%Y-%m-%d")
        name = f"part-{self._export_id}{f'-{count}' if count else ''}.parquet"
        writer = pq.ParquetWriter(self._files.new(self.table, date, name), self._spec.schema)
        self._writers[day] = writer
        return writer


def _timestamps(seconds: Sequence[float | None], type_: pa.DataType) -> pa.Array:
    """Unix seconds as the store records them -> TIMESTAMP (microseconds, UTC), rounded."""
    micros = pc.round(pc.multiply(pa.array(seconds, pa.float64()), float(MICROS_PER_S)))
    return pc.cast(pc.cast(micros, pa.int64()), type_)


def _close_durably(writer: pq.ParquetWriter) -> None:
    writer.close()
    fd = os.open(writer.where, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------ the tables


def _dialect(connection: Any) -> str:
    return getattr(connection, "dialect", "sqlite")


def _fetch(cursor: sqlite3.Cursor, chunk_rows: int) -> Iterator[list[tuple[Any, ...]]]:
    while rows := cursor.fetchmany(chunk_rows):
        yield rows


class _ExportRun:
    """One export: reads each table above its watermark into its sink, in one snapshot."""

    def __init__(
        self,
        connection: Snapshot,
        files: _FileSet,
        export_id: str,
        watermarks: Watermarks,
        progress: ProgressCallback | None,
        chunk_rows: int,
    ) -> None:
        self._db = connection
        self._files = files
        self._export_id = export_id
        self._old = watermarks
        self._progress = progress
        self._chunk_rows = chunk_rows
        self._warnings: list[str] = []
        self._rows: dict[str, int] = {}
        self._horizon: int = getattr(connection, "xid_horizon", 0)  # PostgreSQL only

    def _new_rows(self, alias: str, after: int) -> tuple[str, tuple[int, ...]]:
        """The WHERE clause choosing rows not exported yet, and its parameters: above the last
        exported rowid on SQLite, inside the snapshots' xid horizons on PostgreSQL."""
        if _dialect(self._db) == "postgres":
            return NEW_ROWS.format(t=alias), (self._old.xid_horizon, self._horizon, after)
        return f"{alias}rowid > ?", (after,)

    def run(self) -> tuple[Watermarks, dict[str, int], list[str]]:
        self._check_not_behind()
        pruned = self._pruned_above_watermarks()
        new = Watermarks(xid_horizon=self._horizon)
        with self._sinks("log_entries") as (log_entries,):
            new.log_offsets = self._log_entries(log_entries)
        with self._sinks("state_samples") as (samples,):
            new.state_samples_rowid = self._by_rowid(
                samples, _SELECT_SAMPLES, "s.", self._old.state_samples_rowid
            )
        with self._sinks("fence_events") as (events,):
            new.fence_events_rowid = self._by_rowid(
                events, _select_fence_events(self._db), "f.", self._old.fence_events_rowid
            )
        with self._sinks("l0_objects", "l0_deletions") as (created, deleted):
            new.l0_rowid, new.l0_open, pruned_deletions = self._l0_objects(created, deleted)
        if pruned_deletions:
            pruned["l0_deletions"] = pruned_deletions
        with self._sinks("gc_rounds") as (rounds,):
            new.gc_finished_at, new.gc_at_finished = self._gc_rounds(rounds)
        with self._sinks("l1_objects") as (l1,):
            new.l1_rowid, new.l1_open, pruned_l1 = self._l1_objects(l1)
        if pruned_l1:
            pruned["l1_deletions"] = pruned_l1
        rows = {name: self._rows[name] for name in TABLES}
        self._warn_pruned(pruned)
        return new, rows, self._warnings

    @contextmanager
    def _sinks(self, *tables: str) -> Iterator[tuple[_TableSink, ...]]:
        sinks = tuple(
            _TableSink(t, self._files, self._export_id, self._chunk_rows, self._progress) for t in tables
        )
        yield sinks
        for sink in sinks:
            sink.close()
            self._rows[sink.table] = sink.rows

    def _check_not_behind(self) -> None:
        """A store whose tables end below the watermarks is not the one exported before (or
        was restored from an older backup): exporting would silently skip rows."""
        old = self._old
        for table, exported in (
            ("state_samples", old.state_samples_rowid),
            ("fence_events", old.fence_events_rowid),
            ("l0_objects", old.l0_rowid),
            ("l1_objects", old.l1_rowid),
        ):
            ((last,),) = self._db.execute(f"SELECT COALESCE(MAX(rowid), 0) FROM {table}")
            if last < exported:
                raise ExportError(
                    f"the store's {table} ends at row {last}, but row {exported} was exported "
                    "already: this output directory belongs to another (or a newer copy of "
                    "this) store; export into a new directory"
                )
        if self._horizon < self._old.xid_horizon:
            raise ExportError(
                f"the store's transactions are at {self._horizon}, but those up to "
                f"{self._old.xid_horizon} were exported already: this output directory belongs "
                "to another (or a newer copy of this) store; export into a new directory"
            )

    def _pruned_above_watermarks(self) -> dict[str, int]:
        """Per history table, the rows the store pruned (`control.history_retention_s`, 7 days
        by default) before this directory exported them: numbered above the last export's
        watermark and gone. SQLite numbers a table's rows without gaps (pruning never deletes
        the newest row), so the count is exact there. PostgreSQL's sequences leave gaps (a
        group commit retried, a transaction still open while this export reads): a count
        there would name rows that never were, so it is not made (the L0 deletions are counted
        on both, `_l0_objects`)."""
        if _dialect(self._db) == "postgres":
            return {}
        old = self._old
        pruned: dict[str, int] = {}
        for table, after in (
            ("state_samples", old.state_samples_rowid),
            ("fence_events", old.fence_events_rowid),
            ("l0_objects", old.l0_rowid),
            ("l1_objects", old.l1_rowid),
        ):
            ((top, kept),) = self._db.execute(
                f"SELECT COALESCE(MAX(rowid), 0), COUNT(*) FROM {table} WHERE rowid > ?", (after,)
            )
            if gone := max(0, top - after - kept):
                pruned[table] = gone
        return pruned

    def _warn_pruned(self, pruned: dict[str, int]) -> None:
        if not pruned:
            return
        total = sum(pruned.values())
        counted = ", ".join(f"{n} of {table}" for table, n in pruned.items())
        self._warnings.append(
            f"{total} history {'row' if total == 1 else 'rows'} ({counted}) "
            f"{'was' if total == 1 else 'were'} pruned from the store (older than its "
            "control.history_retention_s) before this directory exported "
            f"{'it' if total == 1 else 'them'}: export more often than that to keep every row"
        )

    def _log_entries(self, sink: _TableSink) -> dict[int, int]:
        """Per partition, entries above the last exported log offset. The end of a log is its
        last entry or, when truncation emptied it, its snapshot: entries between the watermark
        and the end that are gone were truncated before they could be exported."""
        offsets = dict(self._old.log_offsets)
        lost_entries = lost_partitions = 0
        ends = PG_SELECT_LOG_ENDS if _dialect(self._db) == "postgres" else SELECT_LOG_ENDS
        partitions = self._db.execute(ends).fetchall()
        for pid, topic, partition, _term, end in partitions:
            after = offsets.get(pid, -1)
            if end < after:
                raise ExportError(
                    f"partition {topic}/{partition} ends at log offset {end}, but offset {after} "
                    "was exported already: this output directory belongs to another store"
                )
            if end == after:
                continue
            exported = 0
            cursor = self._db.execute(_SELECT_LOG, (pid, after))
            for rows in _fetch(cursor, self._chunk_rows):
                sink.add_many([(topic, partition, *row) for row in rows])
                exported += len(rows)
            lost = end - after - exported
            assert lost >= 0, (topic, partition, end, after, exported)
            if lost:
                lost_entries += lost
                lost_partitions += 1
            offsets[pid] = end
        if lost_entries:
            self._warnings.append(
                f"{lost_entries} log entries of {lost_partitions} partitions were truncated "
                "from the store before this directory exported them (export more often than "
                "the log is truncated to keep every entry)"
            )
        return offsets

    def _by_rowid(self, sink: _TableSink, select: str, alias: str, after: int) -> int:
        """New rows in rowid order; the highest rowid exported so far."""
        where, params = self._new_rows(alias, after)
        last = after
        cursor = self._db.execute(f"{select} WHERE {where} ORDER BY {alias}rowid", params)
        for rows in _fetch(cursor, self._chunk_rows):
            sink.add_many(rows)
            last = max(last, rows[-1][0])
        return last

    def _l0_objects(
        self, created: _TableSink, deleted: _TableSink
    ) -> tuple[int, list[tuple[int, int, int]], int]:
        """Creations by rowid; deletions of the objects that were live at the last export and
        of the new ones. The rows live now become the next export's open runs. Also how many
        rows of the objects live at the last export are gone (deleted, then pruned before
        their deletion was exported): a run names consecutive rows that were all there."""
        still_live: list[tuple[int, int]] = []
        expected = found = 0
        for first, last, _ in self._old.l0_open:
            expected += last - first + 1
            cursor = self._db.execute(_SELECT_L0_OPEN, (first, last))
            for rows in _fetch(cursor, self._chunk_rows):
                found += len(rows)
                for rowid, key, deleted_at, deleted_at_m in rows:
                    if deleted_at is None:
                        still_live.append((rowid, 0))
                    else:
                        deleted.add((key, deleted_at, deleted_at_m))
        last_rowid = self._old.l0_rowid
        where, params = self._new_rows("", last_rowid)
        cursor = self._db.execute(f"{_SELECT_L0} WHERE {where} ORDER BY rowid", params)
        for rows in _fetch(cursor, self._chunk_rows):
            for rowid, key, epoch, size, created_at, extents, deleted_at, deleted_at_m in rows:
                created.add((key, epoch, size, created_at, extents))
                if deleted_at is None:
                    still_live.append((rowid, 0))
                else:
                    deleted.add((key, deleted_at, deleted_at_m))
            last_rowid = max(last_rowid, rows[-1][0])
        return last_rowid, _runs(still_live), max(0, expected - found)

    def _l1_objects(self, sink: _TableSink) -> tuple[int, list[tuple[int, int, int]], int]:
        """New objects by rowid, and every object not yet DELETE_FINISHED again: a row is
        exported whenever its state differs from the one exported last. Also how many rows of
        the objects open at the last export are gone (their delete finished, then pruned as
        history before it was exported), as `_l0_objects` counts its own."""
        still_open: list[tuple[int, int]] = []
        expected = found = 0

        def observe(row: tuple[Any, ...], exported_rank: int | None) -> None:
            rowid, *values = row
            state = values[8]
            rank = L1_STATE_RANK.get(state)
            if rank is None:
                raise ExportError(f"L1 object {values[0]!r} has an unknown state {state!r}")
            if rank != exported_rank:
                sink.add(tuple(values))
            if rank != L1_TERMINAL_RANK:
                still_open.append((rowid, rank))

        for first, last, rank in self._old.l1_open:
            expected += last - first + 1
            cursor = self._db.execute(
                _SELECT_L1 + " WHERE l.rowid BETWEEN ? AND ? ORDER BY l.rowid", (first, last)
            )
            for rows in _fetch(cursor, self._chunk_rows):
                found += len(rows)
                for row in rows:
                    observe(row, rank)
        last_rowid = self._old.l1_rowid
        where, params = self._new_rows("l.", last_rowid)
        cursor = self._db.execute(f"{_SELECT_L1} WHERE {where} ORDER BY l.rowid", params)
        for rows in _fetch(cursor, self._chunk_rows):
            for row in rows:
                observe(row, None)
            last_rowid = max(last_rowid, rows[-1][0])
        return last_rowid, _runs(still_open), max(0, expected - found)

    def _gc_rounds(self, sink: _TableSink) -> tuple[float | None, list[tuple[int, float]]]:
        """Rounds are written once, when they end, and in the order they end: export those
        ending after the last exported end, and those ending at it not exported yet."""
        finished_at = self._old.gc_finished_at
        at_finished: set[tuple[int, float]] = {(pair[0], pair[1]) for pair in self._old.gc_at_finished}
        if finished_at is None:
            cursor = self._db.execute(_SELECT_GC_ROUNDS + " ORDER BY finished_at, round_id")
        else:
            cursor = self._db.execute(
                _SELECT_GC_ROUNDS + " WHERE finished_at >= ? ORDER BY finished_at, round_id",
                (finished_at,),
            )
        for rows in _fetch(cursor, self._chunk_rows):
            for row in rows:
                round_id, started_at, ended_at = row[0], row[1], row[2]
                if ended_at == finished_at and (round_id, started_at) in at_finished:
                    continue
                sink.add(row)
                if ended_at != finished_at:
                    finished_at, at_finished = ended_at, set()
                at_finished.add((round_id, started_at))
        return finished_at, sorted(at_finished)


def _runs(rows: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """`(rowid, rank)` pairs as rowid runs. On PostgreSQL a new row's rowid may lie below an
    open row's of the last export (it committed later), so the pairs are sorted first."""
    runs = RowRuns()
    for rowid, rank in sorted(rows):
        runs.append(rowid, rank)
    return runs.runs


def _columns(table: str, *, skip: Iterable[str] = ()) -> str:
    skipped = set(skip)
    return ", ".join(f.name for f in TABLES[table].schema if f.name not in skipped)


_SELECT_LOG = (
    f"SELECT {_columns('log_entries', skip=('topic', 'partition'))}"
    " FROM log WHERE pid = ? AND log_offset > ? ORDER BY log_offset"
)
_SELECT_SAMPLES = (
    "SELECT s.rowid, s.at, p.topic, p.partition, s.term, s.previous_applied_epoch,"
    " s.max_applied_epoch, s.min_epoch_lower_bound, s.mp, s.lro, s.high_watermark,"
    " s.start_offset FROM state_samples s JOIN partitions p ON p.pid = s.pid"
)
_SELECT_FENCE_EVENTS = (
    "SELECT f.rowid, f.at, p.topic, p.partition, f.term, f.epoch, f.outcome, f.window_min,"
    " f.window_max, {decisions} FROM fence_events f JOIN partitions p ON p.pid = f.pid"
)


def _select_fence_events(connection: Snapshot) -> str:
    """A store that no levelzero with `fence_events.decisions` has opened yet (the log store adds
    the column on open; the export only reads) has a row per decision: it counts one each."""
    if _dialect(connection) == "postgres":
        return _SELECT_FENCE_EVENTS.format(decisions="f.decisions")
    columns = {row[1] for row in connection.execute("PRAGMA table_info(fence_events)")}
    return _SELECT_FENCE_EVENTS.format(
        decisions="f.decisions" if "decisions" in columns else "1 AS decisions"
    )


_SELECT_L0_OPEN = (
    "SELECT rowid, key, deleted_at, deleted_at_m FROM l0_objects WHERE rowid BETWEEN ? AND ? ORDER BY rowid"
)
_SELECT_L0 = "SELECT rowid, key, epoch, size, created_at, extents, deleted_at, deleted_at_m FROM l0_objects"
_SELECT_L1 = (
    "SELECT l.rowid, l.key, p.topic, p.partition, l.base_offset, l.last_offset,"
    " l.last_log_offset, l.term, l.size, l.state, l.created_at, l.updated_at"
    " FROM l1_objects l JOIN partitions p ON p.pid = l.pid"
)
_SELECT_GC_ROUNDS = f"SELECT {_columns('gc_rounds')} FROM gc_rounds"

# The SELECTs above must produce each table's columns in schema order.
assert _columns("state_samples") == (
    "seq, sampled_at, topic, partition, term, previous_applied_epoch, max_applied_epoch, "
    "min_epoch_lower_bound, mp, lro, high_watermark, start_offset"
)
assert _columns("fence_events") == (
    "seq, decided_at, topic, partition, term, epoch, outcome, window_min, window_max, decisions"
)
assert _columns("l1_objects") == (
    "key, topic, partition, base_offset, last_offset, last_log_offset, term, size, state, "
    "created_at, updated_at"
)
assert _columns("log_entries").startswith("topic, partition, ")
