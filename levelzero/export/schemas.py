"""The exported tables: one pyarrow schema per table, every column documented.

This module is the one source of truth for the export format. The exporter writes exactly these
schemas, the analysis validates every Parquet file against them before it starts Spark, and
`SCHEMAS.md` is rendered from them (`render_markdown()`; a test keeps the file in sync).

Layout of an export directory (hive-style date partitions, UTC dates of `time_column`):

    OUT/_levelzero_export.json                     manifest: watermarks, export history
    OUT/<table>/date=YYYY-MM-DD/part-<export_id>[-<n>].parquet

Every time is a Parquet TIMESTAMP (microseconds, UTC) of what the store recorded as unix seconds;
integers are int64. No column is named with a word common SQL engines reserve (`at` was). An
export adds only rows it has not exported before (see `TableSpec.incremental`), so one
export directory never holds a row twice; several directories given to the analysis may overlap
and are deduplicated on `TableSpec.key`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# Of the manifest and of these schemas together (2: fence_events.decisions; 3: times are
# TIMESTAMP columns, state_samples.at -> sampled_at, fence_events.at -> decided_at).
FORMAT_VERSION = 3
TIME_TYPE = pa.timestamp("us", tz="UTC")


def _column(name: str, type_: pa.DataType, doc: str, *, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable, metadata={"doc": doc})


_TOPIC = _column("topic", pa.string(), "topic name")
_PARTITION = _column("partition", pa.int64(), "partition number within the topic")


@dataclass(frozen=True, slots=True)
class TableSpec:
    name: str
    doc: str
    schema: pa.Schema
    time_column: str  # the date partition is the UTC date of this column
    key: tuple[str, ...]  # identifies a row across overlapping export directories
    incremental: str  # how an export picks only new rows (documentation)


TABLES: dict[str, TableSpec] = {
    spec.name: spec
    for spec in (
        TableSpec(
            name="log_entries",
            doc="Every partition log entry (placeholders and control entries), without the "
            "encoded entry blob.",
            schema=pa.schema(
                [
                    _TOPIC,
                    _PARTITION,
                    _column("log_offset", pa.int64(), "position in the partition log"),
                    _column("term", pa.int64(), "leadership term the entry was appended under"),
                    _column(
                        "kind",
                        pa.string(),
                        "placeholder | advance_epoch | advance_reconciled_offset | "
                        "set_start_offset | term_start | abandon_unreconciled",
                    ),
                    _column(
                        "epoch",
                        pa.int64(),
                        "cluster epoch of a placeholder or advance_epoch; null otherwise",
                        nullable=True,
                    ),
                    _column(
                        "object_key",
                        pa.string(),
                        "L0 object holding a placeholder's extent; null otherwise",
                        nullable=True,
                    ),
                    _column(
                        "base_offset",
                        pa.int64(),
                        "first data offset the entry covers (the high watermark before it)",
                    ),
                    _column("record_count", pa.int64(), "records of a placeholder; 0 otherwise"),
                    _column("byte_length", pa.int64(), "extent bytes of a placeholder; 0 otherwise"),
                    _column("appended_at", TIME_TYPE, "when the store appended it"),
                ]
            ),
            time_column="appended_at",
            # With the time: a topic deleted and made again numbers its log from the start
            # again, and its entries are not copies of the first life's (which another
            # directory may hold).
            key=("topic", "partition", "log_offset", "appended_at"),
            incremental="per partition: log offsets above the last exported one (entries "
            "truncated away before an export are reported as a warning, not exported)",
        ),
        TableSpec(
            name="state_samples",
            doc="Partition state over time: the housekeeper samples each partition's "
            "watermarks when they change.",
            schema=pa.schema(
                [
                    _column("seq", pa.int64(), "sample's sequence number in the store (rowid)"),
                    _column("sampled_at", TIME_TYPE, "when the sample was taken"),
                    _TOPIC,
                    _PARTITION,
                    _column("term", pa.int64(), "the partition's term"),
                    _column(
                        "previous_applied_epoch",
                        pa.int64(),
                        "lower edge of the applied epoch window",
                        nullable=True,
                    ),
                    _column(
                        "max_applied_epoch",
                        pa.int64(),
                        "upper edge of the applied epoch window",
                        nullable=True,
                    ),
                    _column(
                        "min_epoch_lower_bound",
                        pa.int64(),
                        "oldest epoch the partition may still need",
                        nullable=True,
                    ),
                    _column(
                        "mp",
                        pa.int64(),
                        "published safe-to-GC watermark M(p); null before the first epoch",
                        nullable=True,
                    ),
                    _column("lro", pa.int64(), "last reconciled data offset (-1: none)"),
                    _column("high_watermark", pa.int64(), "next data offset"),
                    _column("start_offset", pa.int64(), "first readable data offset"),
                ]
            ),
            time_column="sampled_at",
            key=("seq",),
            incremental="rowid above the last exported one (the table is append-only)",
        ),
        TableSpec(
            name="fence_events",
            doc="Outcomes of the epoch fences a partition leader ran, counted per row.",
            schema=pa.schema(
                [
                    _column("seq", pa.int64(), "event's sequence number in the store (rowid)"),
                    _column("decided_at", TIME_TYPE, "when the fence decided"),
                    _TOPIC,
                    _PARTITION,
                    _column("term", pa.int64(), "the leader's term"),
                    _column("epoch", pa.int64(), "epoch the write carried"),
                    _column("outcome", pa.string(), "admitted | admitted_new_epoch | rejected"),
                    _column(
                        "window_min",
                        pa.int64(),
                        "window lower edge: after admission, or the one that rejected",
                        nullable=True,
                    ),
                    _column("window_max", pa.int64(), "window upper edge", nullable=True),
                    _column(
                        "decisions",
                        pa.int64(),
                        "fence decisions this row stands for (same term, epoch, outcome and "
                        "window, between two flushes; `decided_at` is the first)",
                    ),
                ]
            ),
            time_column="decided_at",
            key=("seq",),
            incremental="rowid above the last exported one (the table is append-only)",
        ),
        TableSpec(
            name="l0_objects",
            doc="Creation of every L0 object the batcher uploaded (one row per object). "
            "Deletions are in l0_deletions; join on key.",
            schema=pa.schema(
                [
                    _column("key", pa.string(), "object key"),
                    _column("epoch", pa.int64(), "epoch the object was stamped with"),
                    _column("size", pa.int64(), "object bytes"),
                    _column("created_at", TIME_TYPE, "when the upload finished"),
                    _column("extents", pa.int64(), "partition extents inside"),
                ]
            ),
            time_column="created_at",
            key=("key",),
            incremental="rowid above the last exported one",
        ),
        TableSpec(
            name="l0_deletions",
            doc="Deletion of an L0 object by the GC (one row per deleted object).",
            schema=pa.schema(
                [
                    _column("key", pa.string(), "object key (see l0_objects)"),
                    _column("deleted_at", TIME_TYPE, "when the GC recorded the delete"),
                    _column("deleted_at_m", pa.int64(), "the GC watermark M of that delete"),
                ]
            ),
            time_column="deleted_at",
            key=("key",),
            incremental="l0_objects rows are updated in place when deleted; the manifest keeps "
            "the rowid ranges of objects still live at the last export and an export re-reads "
            "only those (and new rows), so a delete is exported exactly once whatever its "
            "timestamp or commit order",
        ),
        TableSpec(
            name="gc_rounds",
            doc="One row per GC round (dry runs included: they compute M the same way).",
            schema=pa.schema(
                [
                    _column(
                        "round_id",
                        pa.int64(),
                        "the round's id: the Unix time in milliseconds its node's GC started at, "
                        "plus the rounds it ran before (unique across restarts: the log store keys "
                        "its rounds by it); in a cluster, from the node's registration, "
                        "2**44 + incarnation * 2**32 + the rounds since (unique across nodes)",
                    ),
                    _column("started_at", TIME_TYPE, "round start: when M was computed"),
                    _column("finished_at", TIME_TYPE, "round end"),
                    _column("cluster_epoch", pa.int64(), "cluster epoch E the round saw"),
                    _column(
                        "m",
                        pa.int64(),
                        "cluster watermark M; null when blocked (a partition without M(p))",
                        nullable=True,
                    ),
                    _column("dry_run", pa.bool_(), "listed what it would delete, deleted nothing"),
                    _column("listed", pa.int64(), "L0 objects listed"),
                    _column("deleted", pa.int64(), "L0 objects deleted"),
                    _column("deleted_bytes", pa.int64(), "bytes deleted"),
                    _column("too_young", pa.int64(), "objects skipped: inside the grace period"),
                    _column("above_m", pa.int64(), "prefixes that stopped at an epoch above M"),
                    _column("errors", pa.int64(), "list and delete errors"),
                    _column("blocked_by", pa.string(), "why nothing could be deleted", nullable=True),
                ]
            ),
            time_column="started_at",
            key=("round_id", "started_at"),
            incremental="rounds finished after the last exported round (finished_at, and the "
            "round ids at exactly that time): rows are written once, when a round ends",
        ),
        TableSpec(
            name="l1_objects",
            doc="L1 object lifecycle: one row per (object, state) an export observed. The "
            "store keeps only an object's latest state, so a state entered and left between "
            "two exports is not seen; the latest state of a key is the highest one "
            "(COPY_STARTED < COPY_FINISHED < DELETE_STARTED < DELETE_FINISHED).",
            schema=pa.schema(
                [
                    _column("key", pa.string(), "object key"),
                    _TOPIC,
                    _PARTITION,
                    _column("base_offset", pa.int64(), "first data offset inside"),
                    _column("last_offset", pa.int64(), "last data offset inside"),
                    _column("last_log_offset", pa.int64(), "LRLO the object reconciles up to"),
                    _column("term", pa.int64(), "term of the reconciler that wrote it"),
                    _column("size", pa.int64(), "object bytes"),
                    _column(
                        "state",
                        pa.string(),
                        "COPY_STARTED | COPY_FINISHED | DELETE_STARTED | DELETE_FINISHED",
                    ),
                    _column("created_at", TIME_TYPE, "when COPY_STARTED was recorded"),
                    _column("updated_at", TIME_TYPE, "when this state was entered"),
                ]
            ),
            time_column="updated_at",
            key=("key", "state"),
            incremental="new rows by rowid; rows not yet DELETE_FINISHED are remembered in the "
            "manifest (rowid ranges with their exported state) and re-read, and a row is "
            "exported again whenever its state moved on",
        ),
    )
}

SCHEMAS: dict[str, pa.Schema] = {name: spec.schema for name, spec in TABLES.items()}

L1_STATE_RANK = {"COPY_STARTED": 0, "COPY_FINISHED": 1, "DELETE_STARTED": 2, "DELETE_FINISHED": 3}
L1_TERMINAL_RANK = L1_STATE_RANK["DELETE_FINISHED"]


def schema_mismatch(table: str, actual: pa.Schema) -> str | None:
    """Why `actual` is not the schema of `table` (names and types; order and nullability are
    free), or None when it is."""
    expected = SCHEMAS[table]
    want = {field.name: field.type for field in expected}
    have = {field.name: field.type for field in actual}
    problems = []
    missing = [name for name in want if name not in have]
    if missing:
        problems.append(f"missing column(s) {', '.join(missing)}")
    extra = [name for name in have if name not in want]
    if extra:
        problems.append(f"unexpected column(s) {', '.join(extra)}")
    for name, type_ in want.items():
        if name in have and have[name] != type_:
            problems.append(f"column {name} is {have[name]}, expected {type_}")
    return "; ".join(problems) or None


def render_markdown() -> str:
    """SCHEMAS.md: the tables and their columns, from the schemas above."""
    lines = [
        "# levelzero export schemas",
        "",
        "Generated from `levelzero/export/schemas.py` (`render_markdown()`); edit that file, not this one.",
        "",
        f"Format version {FORMAT_VERSION}. Layout: `OUT/<table>/date=YYYY-MM-DD/"
        "part-<export_id>[-<n>].parquet` (UTC date of the table's time column) plus the "
        "manifest `OUT/_levelzero_export.json`. Times are TIMESTAMP (microseconds, UTC); integers "
        "are int64. One export directory never holds a row twice; overlapping directories are "
        "deduplicated on each table's key.",
        "",
    ]
    for spec in TABLES.values():
        lines += [
            f"## {spec.name}",
            "",
            spec.doc,
            "",
            f"- date partition: `{spec.time_column}`",
            f"- key: `({', '.join(spec.key)})`",
            f"- incremental: {spec.incremental}",
            "",
            "| column | type | null | meaning |",
            "|---|---|---|---|",
        ]
        for field in spec.schema:
            doc = (field.metadata or {}).get(b"doc", b"").decode().replace("|", "\\|")
            lines.append(f"| {field.name} | {field.type} | {'yes' if field.nullable else 'no'} | {doc} |")
        lines.append("")
    return "\n".join(lines)


# The rows of `levelzero export --records` and of the Spark data source's Arrow batches.
RECORDS_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        (
            "timestamp",
            pa.timestamp("us", tz="UTC"),
        ),  # the record's milliseconds; null: none or beyond year 294247
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)
