"""A PySpark Python Data Source, "levelzero": a topic's records read straight from the store.

    register(spark)  # levelzero.export.spark_datasource
    spark.read.format("levelzero").option("data_dir", "/var/lib/levelzero").load("orders")
    spark.read.format("levelzero").option("config", "/etc/levelzero/levelzero.toml").load("orders")

Also a stream (`spark.readStream.format("levelzero")`: `spark_stream`) and a sink
(`df.write.format("levelzero")`, `writeStream`: `spark_sink`).

Columns: topic, partition, offset, timestamp (TIMESTAMP, as the export's tables: the record's
milliseconds, null when the record has none or one beyond year 294247, which no TIMESTAMP holds:
a warning says so), key, value, headers (array of (key, value) structs).

Where the store is: `data_dir` (a daemon's data directory on embedded defaults: `levelzero.db`
and the local object store under `objects/`), or `config` (the daemon's TOML file, read as the
daemon reads it, LEVELZERO_* environment variables and `*_file` secrets included): its object
store (local or S3/MinIO, with the key prefix) and its control plane (SQLite or PostgreSQL).
Credentials the TOML leaves to the environment may be given as options instead
(`s3_access_key`, `s3_secret_key`, `s3_session_token`, `control_password`): the planned read
carries them to the executors inside Spark's task (never in a log line or a plan string), so the
executors need no environment of their own. Executors run the data source in Python: their
`PYSPARK_PYTHON` must be a Python with levelzero installed (the venv's).

What is read: the options `start_offset` (inclusive), `end_offset` (exclusive) and `partitions`
("1,7,300") narrow the planned object ranges (BATCH_OPTIONS: any other option is refused).
Filters on `topic`, `partition` (`=`, `IN`) and `offset` (`=`, `<`, `<=`, `>`, `>=`, `IN` as a
set, `BETWEEN`) narrow them too where Spark plans
each scan from its own pushed filters (see PLAN_SCOPED_TO_SCAN: not up to Spark 4.3, where
Spark evaluates those filters itself and every query of a DataFrame reads its whole range).

Planning (driver) reads the control plane in one read-only snapshot (SQLite read transaction,
PostgreSQL REPEATABLE READ) and replays each partition's snapshot plus log with the pure state
machine: that gives the readable range (start offset to high watermark), the LRO and the term
lineage. Offsets up to the LRO come from valid L1 objects (the L1 metastore), the unreconciled
tail from the L0 extents the placeholders point at. The object ranges are grouped into Spark
partitions (tasks) of about equal bytes (`tasks`); executors read the objects themselves, through
the daemon's own object-store code, an Arrow batch per range.
"""

from __future__ import annotations

import itertools
import logging
import msgspec
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from levelzero.core.entries import LogRecord, Placeholder, decode_entry
from levelzero.core.compaction import l1_object_extent
from levelzero.core.l0format import NO_TIMESTAMP, Record, decode_verified_extent, verify_extent
from levelzero.core.state import PartitionState
from levelzero.core.txn_marks import TXN_HEADER, client_headers, delivered

from levelzero.core.errors import LevelZeroError, ObjectNotFound

from .errors import ExportError

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter

    from .extent_columns import ExtentColumns, Field

    from levelzero.config import Config

log = logging.getLogger("levelzero.export")

FORMAT_NAME = "levelzero"
DB_FILE_NAME = "levelzero.db"
OBJECTS_DIR = "objects"
SCHEMA_DDL = (
    "topic string, partition int, offset long, timestamp timestamp, key binary, value binary,"
    " headers array<struct<key: string, value: binary>>"
)
_COPY_FINISHED = "COPY_FINISHED"


@dataclass(frozen=True, slots=True)
class ObjectRange:
    """One Spark partition: offsets `first..last` of one partition, from one object extent.
    `byte_offset`/`byte_length` are the extent's (L0); for L1 the object's header says."""

    topic: str
    partition: int
    tier: str  # "l0" | "l1"
    object_key: str
    base_offset: int  # the offset of the extent's first record
    first: int
    last: int
    byte_offset: int = 0
    byte_length: int = 0
    record_count: int = 0
    checksum: int = 0
    size_bytes: int = 0  # the bytes read for it (an estimate for L1: the object's size, prorated)


def _replay(db: sqlite3.Connection, pid: int, creation_epoch: int) -> PartitionState:
    """The partition's state now: its snapshot plus the log entries after it."""
    row = db.execute("SELECT log_offset, data FROM snapshots WHERE pid = ?", (pid,)).fetchone()
    state = PartitionState.decode_snapshot(row[1]) if row else PartitionState(creation_epoch)
    cursor = db.execute(
        "SELECT log_offset, term, base_offset, entry FROM log WHERE pid = ? AND log_offset > ?"
        " ORDER BY log_offset",
        (pid, state.last_applied_log_offset),
    )
    for log_offset, term, base_offset, blob in cursor:
        state.apply(LogRecord(log_offset, term, base_offset, decode_entry(blob)))
    return state


# Options naming a credential -> the configuration key they set.
SECRET_OPTIONS = {
    "s3_access_key": ("s3", "access_key"),
    "s3_secret_key": ("s3", "secret_key"),
    "s3_session_token": ("s3", "session_token"),
    "control_password": ("control", "password"),
}


def store_config(
    data_dir: str | None = None,
    config_path: str | None = None,
    secrets: Mapping[tuple[str, str], str] | None = None,
) -> Config:
    """The daemon configuration naming the store: a data directory on embedded defaults, or
    the daemon's TOML file (with its environment, as the daemon reads it), with `secrets`
    (credentials given as options) over both."""
    from levelzero.config import ConfigError, load_config

    if (data_dir is None) == (config_path is None):
        raise ExportError(
            'the levelzero data source needs option("data_dir", ...) or option("config", ...), one of them'
        )
    try:
        if config_path is not None:
            return load_config(config_path, overrides=secrets)
        overrides = {("storage", "data_dir"): data_dir, **(secrets or {})}
        return load_config(None, environ={}, overrides=overrides)
    except ConfigError as error:
        raise ExportError(str(error)) from None


# The options every reader takes: the topic (`path`: Spark passes `load("topic")` as it), where
# the store is, and the credentials.
STORE_OPTIONS = ("path", "data_dir", "config", *SECRET_OPTIONS)
# The batch read's options.
BATCH_OPTIONS = (*STORE_OPTIONS, "start_offset", "end_offset", "partitions", "task_bytes", "min_tasks")


def check_options(options: Mapping[str, str], valid: Sequence[str], what: str) -> None:
    """Refuse an option `valid` does not name. Spark hands a data source whatever options it is
    given: a misspelt one (`partitons`) was ignored, and the read widened to the whole topic.
    Spark passes the names lowercased (it matches them case-insensitively); `valid` names them
    as documented."""
    known = {name.lower() for name in valid}
    unknown = sorted(name for name in options if name.lower() not in known)
    if unknown:
        raise ExportError(
            f"the levelzero {what} has no option {unknown[0]!r}; its options: {', '.join(valid)}"
        )


def secrets_of(options: Mapping[str, str]) -> dict[tuple[str, str], str]:
    """The credentials given as options (SECRET_OPTIONS), by configuration key."""
    return {key: options[name] for name, key in SECRET_OPTIONS.items() if options.get(name)}


@contextmanager
def _catalog(config: Config) -> Iterator[Any]:
    """The control plane, read-only, in one snapshot."""
    if config.control.kind == "postgres":
        from .postgres_source import postgres_snapshot

        with postgres_snapshot(config.control.dsn, config.control.read_password()) as snapshot:
            yield snapshot
        return
    db_path = config.storage.db_path
    if not os.path.isfile(db_path):
        raise ExportError(
            f"data_dir {config.storage.data_dir}: no {DB_FILE_NAME} (not a levelzero data directory)"
        )
    from .sqlite_source import sqlite_snapshot  # checked as the table export checks it

    with sqlite_snapshot(db_path) as db:
        yield db


@dataclass(slots=True)
class Selection:
    """What one read asks for: offsets `[start, end)`, and where a query or an option says so,
    only the partitions in `partitions`, only the offsets in `offsets` (an IN set, planned as
    the offsets themselves: never widened to the range between them), only `topics`. Filters
    on the data source's columns narrow it (`push`)."""

    start: int = 0
    end: int | None = None
    partitions: frozenset[int] | None = None
    offsets: frozenset[int] | None = None
    topics: frozenset[str] | None = None
    # The partitions an option names: the topic must have each (a misnumbered one is an error,
    # not an empty read), while a filter naming one it lacks just matches nothing, as in SQL.
    required: frozenset[int] = frozenset()

    def below(self, end: int) -> None:
        self.end = end if self.end is None else min(self.end, end)

    def above(self, start: int) -> None:
        self.start = max(self.start, start)

    def only_partitions(self, partitions: Iterable[int]) -> None:
        given = frozenset(partitions)
        self.partitions = given if self.partitions is None else self.partitions & given

    def only_offsets(self, offsets: Iterable[int]) -> None:
        given = frozenset(offsets)
        self.offsets = given if self.offsets is None else self.offsets & given

    def only_topics(self, topics: Iterable[str]) -> None:
        given = frozenset(topics)
        self.topics = given if self.topics is None else self.topics & given

    def empty(self, topic: str) -> bool:
        """Nothing can match, whatever the store holds."""
        return (
            (self.end is not None and self.end <= self.start)
            or self.partitions == frozenset()
            or self.offsets == frozenset()
            or (self.topics is not None and topic not in self.topics)
        )

    def push(self, f: Any) -> bool:
        """Narrow by `f`; True when the planned ranges make `f` hold exactly (Spark need not
        check it again), False when Spark must still evaluate it (this selection unchanged)."""
        column = getattr(f, "attribute", None)
        if column not in (("offset",), ("partition",), ("topic",)):
            return False
        if isinstance(f, IsNotNull):
            return True  # every record has a topic, a partition and an offset
        kind = str if column == ("topic",) else int
        value: Any = getattr(f, "value", None)
        if isinstance(f, In):
            values = tuple(value or ())
            if not (values and all(type(v) is kind for v in values)):
                return False
        elif isinstance(f, EqualTo):
            if type(value) is not kind:
                return False
            values = (value,)
        elif column == ("offset",) and type(value) is int:
            values = ()
        else:
            return False
        if column == ("topic",):
            self.only_topics(values)
        elif column == ("partition",):
            self.only_partitions(values)
        elif values:
            self.only_offsets(values)
        elif isinstance(f, GreaterThan):
            self.above(value + 1)
        elif isinstance(f, GreaterThanOrEqual):
            self.above(value)
        elif isinstance(f, LessThan):
            self.below(value)
        elif isinstance(f, LessThanOrEqual):
            self.below(value + 1)
        else:
            return False
        return True


def plan(source: str | Config, topic: str, selection: Selection | None = None) -> list[ObjectRange]:
    """The object ranges holding `topic`'s readable records that `selection` asks for (all of
    them without one). `source`: a data directory (embedded defaults) or the daemon's
    configuration."""
    config = store_config(source) if isinstance(source, str) else source
    selection = Selection() if selection is None else selection
    with _catalog(config) as db:
        parts = topic_partitions(db, config, topic)
        _check_required(selection.required, parts, topic, config)
        if selection.empty(topic):
            return []
        ranges: list[ObjectRange] = []
        for pid, partition, creation_epoch in parts:
            if selection.partitions is not None and partition not in selection.partitions:
                continue
            state = _replay(db, pid, creation_epoch)
            low = max(state.start_offset, selection.start)
            end = state.high_watermark if selection.end is None else min(state.high_watermark, selection.end)
            for r in _partition_ranges(db, topic, partition, pid, state, low, end - 1):
                ranges.extend(_only_offsets(r, selection.offsets))
        return ranges


def topic_partitions(db: Any, config: Config, topic: str) -> list[tuple[int, int, int]]:
    """(pid, partition, creation epoch) of each of `topic`'s partitions, by partition, from the
    open catalog `db`; ExportError when the topic does not exist."""
    parts = db.execute(
        "SELECT pid, partition, creation_epoch FROM partitions WHERE topic = ? ORDER BY partition",
        (topic,),
    ).fetchall()
    if not parts:
        raise ExportError(f"topic {topic!r} not found in {_where(config)}")
    return [tuple(part) for part in parts]


def _check_required(
    required: frozenset[int], parts: Sequence[tuple[int, int, int]], topic: str, config: Config
) -> None:
    """ExportError naming the first of the `required` partitions (option partitions) that
    `topic` (its `parts`, from `topic_partitions`) does not have."""
    numbers = [partition for _, partition, _ in parts]
    missing = sorted(required.difference(numbers))
    if missing:
        raise ExportError(
            f"option partitions: partition {missing[0]} of topic {topic!r} not found in"
            f" {_where(config)} (its partitions: {numbers[0]}..{numbers[-1]})"
        )


def _partition_ranges(
    db: Any, topic: str, partition: int, pid: int, state: PartitionState, low: int, high: int
) -> Iterator[ObjectRange]:
    """The object ranges holding offsets `low..high` of one partition: valid L1 objects up to
    the LRO, the placeholders' L0 extents above it."""
    l1_high = min(state.lro, high)
    if low <= l1_high:
        rows = db.execute(
            "SELECT key, base_offset, last_offset, term, size FROM l1_objects"
            " WHERE pid = ? AND state = ? ORDER BY base_offset",
            (pid, _COPY_FINISHED),
        ).fetchall()
        compacted = _compacted_keys(db, pid)
        for key, base, last, term, size in rows:
            if key in compacted:
                # Valid once its compaction result was accepted (then COPY_FINISHED), as the
                # node's catalog has it: within the partition's term and reconciled offset.
                if term > state.term or last > state.lro:
                    continue
            elif not state.l1_range_valid(term, base, last):
                continue
            first, stop = max(base, low), min(last, l1_high)
            if first <= stop:
                share = size * (stop - first + 1) // (last - base + 1)
                yield ObjectRange(topic, partition, "l1", key, base, first, stop, size_bytes=share)
    if low > high:
        return
    placeholders = db.execute(
        "SELECT base_offset, entry FROM log WHERE pid = ? AND kind = 'placeholder'"
        " AND base_offset + record_count > ? ORDER BY log_offset",
        (pid, max(low, state.lro + 1)),
    ).fetchall()
    for base, blob in placeholders:
        p = decode_entry(blob)
        assert isinstance(p, Placeholder), (pid, base)
        first = max(base, low, state.lro + 1)
        stop = min(base + p.record_count - 1, high)
        if first > stop:
            continue
        if state.abandoned_range(first) is not None:
            continue  # given up by an operator: unreadable
        yield ObjectRange(
            topic,
            partition,
            "l0",
            p.object_key,
            base,
            first,
            stop,
            p.byte_offset,
            p.byte_length,
            p.record_count,
            p.checksum,
            p.byte_length,
        )


def _compacted_keys(db: Any, pid: int) -> set[str]:
    """The keys of the partition's compacted L1 objects (none in a store file older than
    schema 6, which has no such table)."""
    try:
        return {key for (key,) in db.execute("SELECT key FROM l1_compacted WHERE pid = ?", (pid,))}
    except sqlite3.OperationalError:
        return set()


def _only_offsets(r: ObjectRange, offsets: frozenset[int] | None) -> Iterator[ObjectRange]:
    """`r` cut down to the runs of consecutive offsets of `offsets` it holds (all of `r`
    without a set)."""
    if offsets is None:
        yield r
        return
    wanted = sorted(o for o in offsets if r.first <= o <= r.last)
    run_start = None
    for i, o in enumerate(wanted):
        if run_start is None:
            run_start = o
        if i + 1 == len(wanted) or wanted[i + 1] != o + 1:
            yield replace(r, first=run_start, last=o)
            run_start = None


def _where(config: Config) -> str:
    if config.control.kind == "postgres":
        from levelzero.storage.postgres.store import redacted

        return redacted(config.control.dsn)
    return config.storage.db_path


# key and value: None for a null key or value (a tombstone's value), b"" for an empty one.
Row = tuple[str, int, int, int | None, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


class ObjectGone(ExportError):
    """An object planned for a read is no longer in the store."""


def range_records(config: Config, r: ObjectRange) -> list[tuple[int, Record]]:
    """The records `r.first..r.last` of `r`'s partition, as planned, with their offsets (a
    compacted L1 object has gaps: the offsets compaction removed). See `range_runs`."""
    return [
        (offset, record)
        for base, records in range_runs(config, r)
        for offset, record in enumerate(records, base)
    ]


def range_runs(config: Config, r: ObjectRange) -> list[tuple[int, list[Record]]]:
    """The records `r.first..r.last` of `r`'s partition as runs: (first offset, records at
    consecutive offsets) — one run for an extent, one per stretch between compaction's gaps."""
    return [run for extent in _range_extents(config, r) for run in _record_runs(extent)]


@dataclass(frozen=True, slots=True)
class _Extent:
    """The extent a planned range reads, its checksum verified: its records' bytes, and its
    runs as (first offset, first index, count) — one for an L0 extent, one per stretch between
    compaction's gaps in an L1 object. `planned` is the range (or a part of it) it is read for."""

    planned: ObjectRange
    data: bytes | memoryview
    count: int
    runs: list[tuple[int, int, int]]
    where: str


def _range_extents(config: Config, r: ObjectRange) -> list[_Extent]:
    """The extents holding `r.first..r.last` of `r`'s partition.

    A read is a snapshot of the records as of planning, even while the daemon moves on: the
    GC deletes an L0 object once the records of its extents are in L1 (M passed its epoch, the
    grace period over), so a planned L0 extent may be gone by the time a task reads it. Its
    offsets are then planned again (a read of the control plane, now) and read from where they
    are now: the same records, from L1. Only if they are not in the store any more (deleted by
    retention since) does the read fail, saying so."""
    try:
        return [_read_extent(config, r)]
    except ObjectGone as gone:
        missing = gone
    again = plan(config, r.topic, Selection(r.first, r.last + 1, partitions=frozenset({r.partition})))
    extents: list[_Extent] = []
    expected = r.first
    for a in again:
        if a.first != expected or a.object_key == r.object_key:
            break  # a gap, or the same object still planned: the records are not there
        extents.append(_read_extent(config, a))
        expected = a.last + 1
    if expected != r.last + 1:
        raise ExportError(
            f"{r.topic}/{r.partition} offsets {r.first}..{r.last}: {missing}, and the offsets are"
            " no longer in the store (deleted since planning?)"
        )
    return extents


def _read_extent(config: Config, r: ObjectRange) -> _Extent:
    """`r`'s extent read from its object and checked against its checksum."""
    where = f"{r.tier.upper()} object {r.object_key}"
    if r.tier == "l0":
        data: bytes | memoryview = _get(config, r.object_key, r.byte_offset, r.byte_length)
        crc, count, runs = r.checksum, r.record_count, [(r.base_offset, 0, r.record_count)]
    else:
        data, crc, count, runs = l1_object_extent(_get(config, r.object_key), r.base_offset, where)
    verify_extent(data, crc, where)
    return _Extent(r, data, count, runs, where)


def _record_runs(extent: _Extent) -> list[tuple[int, list[Record]]]:
    """The extent's records cut to its planned offsets, as runs (slices, no test per record)."""
    records = decode_verified_extent(extent.data, extent.count, extent.where)
    r = extent.planned
    cut: list[tuple[int, list[Record]]] = []
    for base, i, n in extent.runs:
        start, stop = max(base, r.first), min(base + n, r.last + 1)
        if start < stop:
            whole = i == 0 and n == len(records) and start == base and stop == base + n
            cut.append((start, records if whole else records[i + start - base : i + stop - base]))
    return cut


def read_range(source: str | Config, r: ObjectRange) -> Iterator[Row]:
    """The records of one object range, as rows of the data source's schema (timestamps in
    milliseconds)."""
    config = store_config(source) if isinstance(source, str) else source
    for offset, rec in delivered(range_records(config, r)):
        ts = None if rec.timestamp_ms == NO_TIMESTAMP else rec.timestamp_ms
        yield (r.topic, r.partition, offset, ts, rec.key, rec.value, list(client_headers(rec.headers)))


def read_batch(source: str | Config, r: ObjectRange) -> Any:
    """The records of one object range as one Arrow record batch of the data source's schema
    (Spark takes it without converting row by row). Extents whose records carry no headers are
    read column by column from their bytes (`extent_columns`); others record by record."""
    from .extent_columns import extent_columns

    config = store_config(source) if isinstance(source, str) else source
    extents = _range_extents(config, r)
    pieces: list[_ColumnPiece] = []
    for extent in extents:
        piece = _column_piece(extent, extent_columns(extent.data, extent.count, extent.where))
        if piece is None:  # an extent the columns cannot take: the whole range record by record,
            # without finding the other extents' columns first
            return _records_batch(r, [run for e in extents for run in _record_runs(e)])
        pieces.append(piece)
    return _columns_batch(r, pieces)


@dataclass(frozen=True, slots=True)
class _ColumnPiece:
    """The records `lo:hi` of an extent's columns, at `offsets`."""

    data: bytes | memoryview
    columns: ExtentColumns
    offsets: Any  # numpy int64, one per record lo:hi
    lo: int
    hi: int


def _column_piece(extent: _Extent, columns: ExtentColumns | None) -> _ColumnPiece | None:
    """The extent's planned records of its `columns`; None without them (an extent not of the
    layout `extent_columns` takes: it is then read record by record)."""
    import numpy as np

    if columns is None:
        return None
    r = extent.planned
    if len(extent.runs) == 1:
        ((base, _, n),) = extent.runs
        lo = max(r.first - base, 0)
        hi = max(lo, min(r.last + 1 - base, n))
        offsets = np.arange(base + lo, base + hi, dtype=np.int64)
    else:
        firsts, indices, counts = (np.array(column, np.int64) for column in zip(*extent.runs, strict=True))
        every = np.arange(extent.count, dtype=np.int64) + np.repeat(firsts - indices, counts)
        if not (np.diff(every) > 0).all():
            return None  # runs out of offset order: cut record by record, in their order
        lo = int(np.searchsorted(every, r.first))
        hi = max(lo, int(np.searchsorted(every, r.last, "right")))
        offsets = every[lo:hi]
    return _ColumnPiece(extent.data, columns, offsets, lo, hi)


def _columns_batch(r: ObjectRange, pieces: list[_ColumnPiece]) -> Any:
    """The batch of `pieces` (one per extent the range reads, in offset order)."""
    import numpy as np
    import pyarrow as pa

    from .schemas import RECORDS_SCHEMA as SCHEMA

    def joined(arrays: list[Any]) -> Any:
        return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)

    count = sum(piece.hi - piece.lo for piece in pieces)
    timestamps = np.concatenate([piece.columns.timestamp_ms[piece.lo : piece.hi] for piece in pieces])
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(r.topic, pa.string()), count),
            pa.repeat(pa.scalar(r.partition, pa.int32()), count),
            pa.array(np.concatenate([piece.offsets for piece in pieces]), pa.int64()),
            _timestamps(timestamps, SCHEMA.field("timestamp").type),
            joined([_binary(p.data, p.columns.key, p.lo, p.hi) for p in pieces]),
            joined([_binary(p.data, p.columns.value, p.lo, p.hi) for p in pieces]),
            _no_headers(count, SCHEMA.field("headers").type),
        ],
        schema=SCHEMA,
    )


def _no_headers(count: int, arrow_type: Any) -> Any:
    """The headers column of `count` records without headers: empty lists."""
    import numpy as np
    import pyarrow as pa

    offsets = pa.array(np.zeros(count + 1, np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array([], arrow_type.value_type), type=arrow_type)


def _binary(data: bytes | memoryview, field: Field, lo: int, hi: int) -> Any:
    """The binary column of `field`'s records `lo:hi`, its bytes gathered from `data` in one
    Arrow `take`: over `data` seen (without a copy) as alternating fields and the bytes between
    them, the fields' elements taken (a null's index null)."""
    import numpy as np
    import pyarrow as pa

    count = hi - lo
    null = field.null[lo:hi]
    if count == 0 or null.all():
        return pa.nulls(count, pa.binary())
    start = field.start[lo:hi]
    bounds = np.empty(2 * count, np.int64)
    bounds[0::2] = start
    bounds[1::2] = start + field.length[lo:hi]
    # element 2i: record i's field; 2i + 1: the bytes from its end to the next record's field
    wide = int(bounds[-1]) >= 2**31
    if not wide:
        bounds = bounds.astype(np.int32)
    pieces = pa.Array.from_buffers(
        pa.large_binary() if wide else pa.binary(),
        2 * count - 1,
        [None, pa.py_buffer(bounds), pa.py_buffer(data)],
    )
    indices = pa.array(np.arange(0, 2 * count, 2, dtype=np.int64), mask=null if null.any() else None)
    taken = pieces.take(indices)
    return taken.cast(pa.binary()) if wide else taken


def _records_batch(r: ObjectRange, runs: list[tuple[int, list[Record]]]) -> Any:
    """The batch of records decoded one by one (extents with headers)."""
    import pyarrow as pa

    from .schemas import RECORDS_SCHEMA as SCHEMA

    records = runs[0][1] if len(runs) == 1 else [rec for _, rs in runs for rec in rs]
    headers = [rec.headers for rec in records]
    offsets: Any
    if any(headers) and any(h and h[-1][0] == TXN_HEADER for h in headers):
        # a Kafka transaction's records: markers left out (gaps), the reserved header stripped
        kept = list(delivered((offset, rec) for base, rs in runs for offset, rec in enumerate(rs, base)))
        offsets = pa.array([offset for offset, _ in kept], pa.int64())
        records = [msgspec.structs.replace(rec, headers=client_headers(rec.headers)) for _, rec in kept]
        headers = [rec.headers for rec in records]
    elif len(runs) == 1:
        offsets = pa.array(range(runs[0][0], runs[0][0] + len(records)), pa.int64())
    else:
        offsets = pa.array([o for base, rs in runs for o in range(base, base + len(rs))], pa.int64())
    count = len(records)
    return pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(r.topic, pa.string()), count),
            pa.repeat(pa.scalar(r.partition, pa.int32()), count),
            offsets,
            _timestamps([rec.timestamp_ms for rec in records], SCHEMA.field("timestamp").type),
            pa.array([rec.key for rec in records], pa.binary()),
            pa.array([rec.value for rec in records], pa.binary()),
            _headers(headers, SCHEMA.field("headers").type),
        ],
        schema=SCHEMA,
    )


def _headers(headers: list[tuple[tuple[str, bytes | None], ...]], arrow_type: Any) -> Any:
    """The headers column, built from the flat keys and values and each record's offset into
    them (no dict per header, nothing per record without headers)."""
    import pyarrow as pa

    offsets = list(itertools.accumulate(map(len, headers), initial=0))
    if offsets[-1] == 0:
        flat = pa.array([], arrow_type.value_type)
    else:
        pairs = [pair for h in headers for pair in h]
        flat = pa.StructArray.from_arrays(
            [pa.array([k for k, _ in pairs], pa.string()), pa.array([v for _, v in pairs], pa.binary())],
            fields=list(arrow_type.value_type),
        )
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat, type=arrow_type)


# The milliseconds a TIMESTAMP column (microseconds in an int64, as Spark's) holds either side of
# 1970: to 294247-01-10. A record may carry any int64 (the API and Kafka take them all).
TIMESTAMP_MS_MAX = (2**63 - 1) // 1000


def _timestamps(millis: Any, arrow_type: Any) -> Any:
    """Milliseconds (a list or a numpy array; NO_TIMESTAMP: none) as the TIMESTAMP column. One
    no TIMESTAMP can hold is null, and said so in a warning (it was multiplied into the
    microseconds regardless, wrapping around to a wrong time, often before 1970)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ms = pa.array(millis, pa.int64())
    beyond = pc.or_(pc.greater(ms, TIMESTAMP_MS_MAX), pc.less(ms, -TIMESTAMP_MS_MAX))
    lost = pc.sum(beyond).as_py() or 0
    if lost:
        log.warning(
            "%d records' timestamps are beyond what a TIMESTAMP holds (%d ms either side of "
            "1970): read with a null timestamp",
            lost,
            TIMESTAMP_MS_MAX,
        )
    none = pc.or_(pc.equal(ms, NO_TIMESTAMP), beyond)
    micros = pc.multiply_checked(pc.if_else(none, 0, ms), 1000)
    return pc.if_else(none, None, micros).cast(arrow_type)


def _get(config: Config, key: str, offset: int = 0, length: int | None = None) -> bytes:
    """An object (or a byte range of it), read with the daemon's own object-store code: the
    local store's files, or S3 through aiobotocore with the configured prefix."""
    if config.storage.kind == "local":
        path = os.path.join(config.storage.objects_dir, key)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read() if length is None else f.read(length)
        except FileNotFoundError:
            raise ObjectGone(
                f"object {key} is not in {config.storage.objects_dir}: collected since planning, or"
                " the daemon keeps its objects elsewhere (S3: read with the daemon's TOML, --config"
                " or option config)"
            ) from None

    async def read() -> bytes:
        from levelzero.storage.opening import open_object_store

        store = await open_object_store(config)
        try:
            return await store.get(key, offset, length)
        finally:
            await store.aclose()

    import anyio

    try:
        return anyio.run(read)
    except ObjectNotFound as error:
        raise ObjectGone(f"object {key}: {error}") from None
    except LevelZeroError as error:
        raise ExportError(f"object {key}: {error}") from None


def _int_option(options: Mapping[str, str], name: str) -> int | None:
    value = options.get(name)
    return None if value is None else _non_negative(name, value)


def _non_negative(name: str, value: str) -> int:
    try:
        parsed = int(value)
    except ValueError:
        raise ExportError(f"option {name}={value!r}: not an integer") from None
    if parsed < 0:
        raise ExportError(f"option {name}={value!r}: must be >= 0")
    return parsed


try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        InputPartition,
        IsNotNull,
        LessThan,
        LessThanOrEqual,
    )
except ImportError:  # pragma: no cover - pyspark is in the analysis extra
    # Without pyspark the module still imports (its planning runs without Spark): plain bases
    # and no filter classes stand in for pyspark's, which mypy knows as other types.
    DataSource = DataSourceReader = InputPartition = object  # type: ignore[misc,assignment]
    EqualTo = GreaterThan = GreaterThanOrEqual = In = IsNotNull = LessThan = LessThanOrEqual = ()  # type: ignore[misc,assignment]


class _Partition(InputPartition):
    """One Spark task: consecutive object ranges, read one Arrow batch each."""

    def __init__(self, ranges: Sequence[ObjectRange]) -> None:
        self.ranges = tuple(ranges)


def tasks(ranges: Sequence[ObjectRange], task_bytes: int, min_tasks: int = 1) -> list[list[ObjectRange]]:
    """`ranges` in order, cut into tasks of about equal bytes: as many as `task_bytes` asks for
    (a range is never split; one larger than that is a task of its own), and at least
    `min_tasks` when there are as many ranges. A task costs Spark a scheduling round trip and a
    Python worker's call: object ranges of a few MB each, one task apiece, spent more time on
    that than on reading (as Spark groups the files of a Parquet read into tasks of
    spark.sql.files.maxPartitionBytes, and into at least as many as the session's default
    parallelism). Equal shares, not tasks filled up to `task_bytes` one after the other: the
    item's 208 MB read was a task of 128 MiB and one of 74 MB, one core idle for a third of it.
    A range goes to the share its middle byte falls in (as Parquet assigns row groups to
    splits)."""
    assert task_bytes > 0 and min_tasks > 0, (task_bytes, min_tasks)
    if not ranges:
        return []
    weights = [max(r.size_bytes, 1) for r in ranges]
    total = sum(weights)
    count = max(-(-total // task_bytes), min(min_tasks, len(ranges)))
    share = total / count
    out: list[list[ObjectRange]] = [[] for _ in range(count)]
    before = 0
    for r, weight in zip(ranges, weights, strict=True):
        out[min(count - 1, int((before + weight / 2) / share))].append(r)
        before += weight
    return [task for task in out if task]


# Whether Spark keeps the read planned with pushed filters to the one scan that pushed them.
# Up to Spark 4.3 it is kept on the relation (the provider instance every DataFrame made from one
# `load()` shares): a later query of that DataFrame pushing no filter reuses the last filtered
# query's partitions and read function, so narrowing by a filter would silently drop records
# from it (`df.where("offset < 10").count()` then `df.count()` gave 10). The change that scopes
# the read plan to its scan (Spark 5.0, SPARK-58551) also gave the Python reader `pushLimit`.
PLAN_SCOPED_TO_SCAN = hasattr(DataSourceReader, "pushLimit")


class LevelZeroReader(DataSourceReader):
    """Reads the object ranges its selection (the options) plans."""

    def __init__(
        self, config: Config, topic: str, selection: Selection, task_bytes: int, min_tasks: int = 1
    ) -> None:
        self.config, self.topic, self.selection = config, topic, selection
        self.task_bytes, self.min_tasks = task_bytes, min_tasks

    def partitions(self) -> Sequence[InputPartition]:
        """The tasks of the planned ranges; one task of none when nothing is planned (an empty
        topic, partition or range): Spark turns an empty list into one task of
        `InputPartition(None)`, which is not a read of ranges."""
        ranges = plan(self.config, self.topic, self.selection)
        planned = [_Partition(task) for task in tasks(ranges, self.task_bytes, self.min_tasks)]
        return planned or [_Partition(())]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.config, partition)


def read_partition(config: Config, partition: InputPartition) -> Iterator[Any]:
    """One Spark task's records (batch or micro-batch): an Arrow batch per object range."""
    assert isinstance(partition, _Partition), partition
    for r in partition.ranges:
        yield read_batch(config, r)


class LevelZeroPushdownReader(LevelZeroReader):
    """A reader that also narrows its selection by the filters a query pushes: used only
    where Spark plans each scan from its own filters (PLAN_SCOPED_TO_SCAN)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 - Spark's name
        for f in filters:
            if not self.selection.push(f):
                yield f


def _set_option(options: Mapping[str, str], name: str) -> frozenset[int] | None:
    """A comma-separated set of non-negative integers (`partitions`), or None."""
    value = options.get(name)
    if value is None:
        return None
    numbers = [v.strip() for v in value.split(",") if v.strip()]
    if not numbers:
        raise ExportError(f"option {name}={value!r}: an empty list")
    if not all(n.isdigit() for n in numbers):
        raise ExportError(f"option {name}={value!r}: not a list of non-negative integers")
    return frozenset(int(n) for n in numbers)


def selection_of(options: Mapping[str, str]) -> Selection:
    """The read the options ask for: `start_offset`, `end_offset`, `partitions` ("1,7,300").
    An equal start and end ask for no offsets; a start past the end is refused (offsets
    `[start, end)`: the two swapped, or one of them mistyped, would read nothing, silently)."""
    start = _int_option(options, "start_offset") or 0
    end = _int_option(options, "end_offset")
    if end is not None and start > end:
        raise ExportError(
            f"option start_offset='{start}': past end_offset='{end}'"
            " (the offsets read are [start_offset, end_offset))"
        )
    partitions = _set_option(options, "partitions")
    return Selection(start, end, partitions, required=partitions or frozenset())


def _task_bytes(options: Mapping[str, str]) -> int:
    return _int_option(options, "task_bytes") or TASK_BYTES_DEFAULT


def _min_tasks(options: Mapping[str, str], default: int) -> int:
    """Option `min_tasks` (at least 1), else `default` (the session's default parallelism)."""
    value = _int_option(options, "min_tasks")
    if value == 0:
        raise ExportError("option min_tasks='0': must be >= 1")
    return default if value is None else value


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
# The object ranges of one Spark task (option task_bytes): as spark.sql.files.maxPartitionBytes.
TASK_BYTES_DEFAULT = 128 * 1024 * 1024
