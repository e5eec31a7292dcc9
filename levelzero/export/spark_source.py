"""A PySpark Python Data Source, "levelzero": a topic's records read straight from the store.

    register(spark)
    spark.read.format("levelzero").option("data_dir", "/var/lib/levelzero").load("orders")
    spark.read.format("levelzero").option("config", "/etc/levelzero/levelzero.toml").load("orders")

Columns: topic, partition, offset, timestamp (ms since the epoch, null when the record has
none), key, value, headers (array of (key, value) structs).

Where the store is: `data_dir` (a daemon's data directory on embedded defaults: `levelzero.db`
and the local object store under `objects/`), or `config` (the daemon's TOML file, read as the
daemon reads it, LEVELZERO_* environment variables and `*_file` secrets included): its object
store (local or S3/MinIO, with the key prefix) and its control plane (SQLite or PostgreSQL).

Offsets: `start_offset` (inclusive) and `end_offset` (exclusive) options, and filters on the
`offset` column (`=`, `<`, `<=`, `>`, `>=`, `IN`, `BETWEEN`) pushed down where this pyspark
offers `pushFilters` (its `spark.sql.python.filterPushdown.enabled` on): either way only the
objects holding those offsets are planned and read.

Planning (driver) reads the control plane in one read-only snapshot (SQLite read transaction,
PostgreSQL REPEATABLE READ) and replays each partition's snapshot plus log with the pure state
machine: that gives the readable range (start offset to high watermark), the LRO and the term
lineage. Offsets up to the LRO come from valid L1 objects (the L1 metastore), the unreconciled
tail from the L0 extents the placeholders point at. Each object range becomes one Spark
partition; executors read the objects themselves, through the daemon's own object-store code.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from levelzero.core.entries import LogRecord, Placeholder, decode_entry
from levelzero.core.l0format import NO_TIMESTAMP, decode_extent, read_header
from levelzero.core.state import PartitionState

from levelzero.core.errors import LevelZeroError

from .errors import ExportError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import Filter
    from pyspark.sql.types import StructType

    from levelzero.config import Config

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


def store_config(data_dir: str | None = None, config_path: str | None = None) -> Config:
    """The daemon configuration naming the store: a data directory on embedded defaults, or
    the daemon's TOML file (with its environment, as the daemon reads it)."""
    from levelzero.config import ConfigError, load_config

    if (data_dir is None) == (config_path is None):
        raise ExportError(
            'the levelzero data source needs option("data_dir", ...) or option("config", ...), one of them'
        )
    try:
        if config_path is not None:
            return load_config(config_path)
        return load_config(None, environ={}, overrides={("storage", "data_dir"): data_dir})
    except ConfigError as error:
        raise ExportError(str(error)) from None


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
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        db.execute("BEGIN")  # one read transaction: a consistent snapshot in WAL mode
        yield db
    finally:
        db.close()


def plan(
    source: str | Config, topic: str, start_offset: int = 0, end_offset: int | None = None
) -> list[ObjectRange]:
    """The object ranges holding `topic`'s readable records in `[start_offset, end_offset)`.
    `source`: a data directory (embedded defaults) or the daemon's configuration."""
    config = store_config(source) if isinstance(source, str) else source
    with _catalog(config) as db:
        parts = db.execute(
            "SELECT pid, partition, creation_epoch FROM partitions WHERE topic = ? ORDER BY partition",
            (topic,),
        ).fetchall()
        if not parts:
            raise ExportError(f"topic {topic!r} not found in {_where(config)}")
        ranges: list[ObjectRange] = []
        for pid, partition, creation_epoch in parts:
            state = _replay(db, pid, creation_epoch)
            low = max(state.start_offset, start_offset)
            end = state.high_watermark if end_offset is None else min(state.high_watermark, end_offset)
            high = end - 1
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
                ranges.append(
                    ObjectRange(
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
                    )
                )
        return ranges


def _where(config: Config) -> str:
    if config.control.kind == "postgres":
        from levelzero.storage.postgres.store import redacted

        return redacted(config.control.dsn)
    return config.storage.db_path


# key and value: None for a null key or value (a tombstone's value), b"" for an empty one.
Row = tuple[str, int, int, int | None, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def read_range(source: str | Config, r: ObjectRange) -> Iterator[Row]:
    """The records of one object range, as rows of the data source's schema."""
    config = store_config(source) if isinstance(source, str) else source
    where = f"{r.tier.upper()} object {r.object_key}"
    if r.tier == "l0":
        raw = _get(config, r.object_key, r.byte_offset, r.byte_length)
        records = decode_extent(raw, r.checksum, r.record_count, where)
    else:
        data = _get(config, r.object_key)
        (extent,) = read_header(data, where).extents
        raw = data[extent.byte_offset : extent.byte_offset + extent.byte_length]
        records = decode_extent(raw, extent.checksum, extent.record_count, where)
    for i in range(r.first - r.base_offset, r.last - r.base_offset + 1):
        rec = records[i]
        ts = None if rec.timestamp_ms == NO_TIMESTAMP else rec.timestamp_ms
        headers = list(rec.headers)
        yield (r.topic, r.partition, r.base_offset + i, ts, rec.key, rec.value, headers)


def read_batch(source: str | Config, r: ObjectRange) -> Any:
    """The records of one object range as one Arrow record batch of the data source's schema
    (Spark takes it without converting row by row)."""
    import pyarrow as pa

    from .schemas import RECORDS_SCHEMA as SCHEMA

    rows = list(read_range(source, r))
    count = len(rows)
    _, _, offsets, timestamps, keys, values, headers = zip(*rows, strict=True) if rows else ((),) * 7
    return pa.RecordBatch.from_arrays(
        [
            pa.array([r.topic] * count, pa.string()),
            pa.array([r.partition] * count, pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array(timestamps, pa.int64()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([[{"key": k, "value": v} for k, v in h] for h in headers], SCHEMA.field("headers").type),
        ],
        schema=SCHEMA,
    )


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
            raise ExportError(
                f"object {key} is not in {config.storage.objects_dir} (collected since planning?)"
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
    except LevelZeroError as error:
        raise ExportError(f"object {key}: {error}") from None


def _int_option(options: Mapping[str, str], name: str) -> int | None:
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
    def __init__(self, r: ObjectRange) -> None:
        self.range = r


@dataclass(slots=True)
class OffsetBounds:
    """`[start, end)` on the offset column, narrowed by the filters a query pushes down."""

    start: int = 0
    end: int | None = None

    def below(self, end: int) -> None:
        self.end = end if self.end is None else min(self.end, end)

    def above(self, start: int) -> None:
        self.start = max(self.start, start)

    def push(self, f: Any) -> bool:
        """Narrow by `f`; True when the planned ranges make `f` hold exactly (Spark need not
        check it again), False when Spark must still evaluate it."""
        if getattr(f, "attribute", None) != ("offset",):
            return False
        if isinstance(f, IsNotNull):
            return True  # every record has an offset
        value = getattr(f, "value", None)
        if isinstance(f, In):
            if not (value and all(type(v) is int for v in value)):
                return False
            self.above(min(value))
            self.below(max(value) + 1)
            return len(value) == 1  # a superset of several values: Spark picks among them
        if type(value) is not int:
            return False
        if isinstance(f, EqualTo):
            self.above(value)
            self.below(value + 1)
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


class LevelZeroReader(DataSourceReader):
    def __init__(self, config: Config, topic: str, start: int, end: int | None) -> None:
        self.config, self.topic = config, topic
        self.bounds = OffsetBounds(start, end)

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:  # noqa: N802 - Spark's name
        for f in filters:
            if not self.bounds.push(f):
                yield f

    def partitions(self) -> Sequence[InputPartition]:
        bounds = self.bounds
        if bounds.end is not None and bounds.end <= bounds.start:
            return []
        return [_Partition(r) for r in plan(self.config, self.topic, bounds.start, bounds.end)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Partition), partition
        yield read_batch(self.config, partition.range)


class LevelZeroDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:  # noqa: ARG002 - Spark's signature
        options = self.options
        topic = options.get("path")
        if not topic:
            raise ExportError('the levelzero data source needs a topic: load("topic")')
        config = store_config(options.get("data_dir") or None, options.get("config") or None)
        start = _int_option(options, "start_offset") or 0
        end = _int_option(options, "end_offset")
        return LevelZeroReader(config, topic, start, end)


PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession) -> None:
    """Make `spark.read.format("levelzero")` available in this session, with filter pushdown
    for Python data sources on (the reader takes offset filters; Spark refuses a reader that
    takes filters while the setting is off)."""
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(LevelZeroDataSource)
