"""A PySpark Python Data Source, "levelzero": a topic's records read straight from the store.

    register(spark)
    spark.read.format("levelzero").option("data_dir", "/var/lib/levelzero").load("orders")

Columns: topic, partition, offset, timestamp (ms since the epoch, null when the record has
none), key, value, headers (array of (key, value) structs). Options: `data_dir` (required: the
daemon's data directory, with `levelzero.db` and the local object store under `objects/`),
`start_offset` (first offset, inclusive) and `end_offset` (exclusive): offset-range filters
applied when planning, so only the objects holding them are read.

Planning (driver) opens the SQLite log store read-only and replays each partition's snapshot
plus log with the pure state machine: that gives the readable range (start offset to high
watermark), the LRO and the term lineage. Offsets up to the LRO come from valid L1 objects
(the L1 metastore), the unreconciled tail from the L0 extents the placeholders point at. Each
object range becomes one Spark partition; executors read the object files themselves.
Only the local object store and the SQLite control plane are supported here.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass

from levelzero.core.entries import LogRecord, decode_entry
from levelzero.core.l0format import NO_TIMESTAMP, decode_extent, read_header
from levelzero.core.state import PartitionState

from .errors import ExportError

FORMAT_NAME = "levelzero"
DB_FILE_NAME = "levelzero.db"
OBJECTS_DIR = "objects"
SCHEMA_DDL = (
    "topic string, partition int, offset long, timestamp long, key binary, value binary,"
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


def plan(data_dir: str, topic: str, start_offset: int = 0, end_offset: int | None = None) -> list[ObjectRange]:
    """The object ranges holding `topic`'s readable records in `[start_offset, end_offset)`."""
    db_path = os.path.join(data_dir, DB_FILE_NAME)
    if not os.path.isfile(db_path):
        raise ExportError(f"data_dir {data_dir}: no {DB_FILE_NAME} (not a levelzero data directory)")
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        db.execute("BEGIN")  # one read transaction: a consistent snapshot in WAL mode
        parts = db.execute(
            "SELECT pid, partition, creation_epoch FROM partitions WHERE topic = ? ORDER BY partition",
            (topic,),
        ).fetchall()
        if not parts:
            raise ExportError(f"topic {topic!r} not found in {db_path}")
        ranges: list[ObjectRange] = []
        for pid, partition, creation_epoch in parts:
            state = _replay(db, pid, creation_epoch)
            low = max(state.start_offset, start_offset)
            high = state.high_watermark - 1 if end_offset is None else min(state.high_watermark, end_offset) - 1
            l1_high = min(state.lro, high)
            if low <= l1_high:
                rows = db.execute(
                    "SELECT key, base_offset, last_offset, term FROM l1_objects"
                    " WHERE pid = ? AND state = ? ORDER BY base_offset",
                    (pid, _COPY_FINISHED),
                ).fetchall()
                for key, base, last, term in rows:
                    if not state.l1_range_valid(term, base, last):
                        continue
                    first, stop = max(base, low), min(last, l1_high)
                    if first <= stop:
                        ranges.append(ObjectRange(topic, partition, "l1", key, base, first, stop))
            placeholders = [
                (base, decode_entry(blob))
                for base, blob in db.execute(
                    "SELECT base_offset, entry FROM log WHERE pid = ? AND kind = 'placeholder'"
                    " AND base_offset + record_count > ? ORDER BY log_offset",
                    (pid, max(low, state.lro + 1)),
                )
            ]
            for base, p in placeholders:
                first = max(base, low, state.lro + 1)
                stop = min(base + p.record_count - 1, high)
                if first > stop:
                    continue
                if state.abandoned_range(first) is not None:
                    continue  # given up by an operator: unreadable
                ranges.append(ObjectRange(
                    topic, partition, "l0", p.object_key, base, first, stop,
                    p.byte_offset, p.byte_length, p.record_count, p.checksum,
                ))
        return ranges
    finally:
        db.close()


Row = tuple[str, int, int, int | None, bytes | None, bytes, list[tuple[str, bytes | None]]]


def read_range(data_dir: str, r: ObjectRange) -> Iterator[Row]:
    """The records of one object range, as rows of the data source's schema."""
    path = os.path.join(data_dir, OBJECTS_DIR, r.object_key)
    where = f"{r.tier.upper()} object {r.object_key}"
    with open(path, "rb") as f:
        if r.tier == "l0":
            f.seek(r.byte_offset)
            raw = f.read(r.byte_length)
            records = decode_extent(raw, r.checksum, r.record_count, where)
        else:
            data = f.read()
            (extent,) = read_header(data, where).extents
            raw = data[extent.byte_offset : extent.byte_offset + extent.byte_length]
            records = decode_extent(raw, extent.checksum, extent.record_count, where)
    for i in range(r.first - r.base_offset, r.last - r.base_offset + 1):
        rec = records[i]
        ts = None if rec.timestamp_ms == NO_TIMESTAMP else rec.timestamp_ms
        yield (r.topic, r.partition, r.base_offset + i, ts, rec.key, rec.value, [tuple(h) for h in rec.headers])


def _int_option(options: dict, name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        parsed = int(value)
    except ValueError:
        raise ExportError(f"option {name}={value!r}: not an integer") from None
    if parsed < 0:
        raise ExportError(f"option {name}={value!r}: must be >= 0")
    return parsed


try:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover - pyspark is in the analysis extra
    DataSource = DataSourceReader = InputPartition = object  # type: ignore[misc,assignment]


class _Partition(InputPartition):  # type: ignore[misc,valid-type]
    def __init__(self, r: ObjectRange) -> None:
        self.range = r


class LevelZeroReader(DataSourceReader):  # type: ignore[misc,valid-type]
    def __init__(self, data_dir: str, topic: str, start: int, end: int | None) -> None:
        self.data_dir, self.topic, self.start, self.end = data_dir, topic, start, end

    def partitions(self):  # noqa: ANN201
        return [_Partition(r) for r in plan(self.data_dir, self.topic, self.start, self.end)]

    def read(self, partition):  # noqa: ANN001, ANN201
        yield from read_range(self.data_dir, partition.range)


class LevelZeroDataSource(DataSource):  # type: ignore[misc,valid-type]
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema):  # noqa: ANN001, ANN201
        options = self.options
        data_dir = options.get("data_dir")
        topic = options.get("path")
        if not data_dir:
            raise ExportError('the levelzero data source needs option("data_dir", ...)')
        if not topic:
            raise ExportError('the levelzero data source needs a topic: load("topic")')
        start = _int_option(options, "start_offset") or 0
        end = _int_option(options, "end_offset")
        return LevelZeroReader(data_dir, topic, start, end)


def register(spark) -> None:  # noqa: ANN001
    """Make `spark.read.format("levelzero")` available in this session."""
    spark.dataSource.register(LevelZeroDataSource)
