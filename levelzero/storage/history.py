"""The control plane's history tables and their pruning by age.

Fence decisions (`fence_events`), partition state samples (`state_samples`), GC rounds
(`gc_rounds`) and the rows of L0 objects the GC has deleted (`l0_objects` with `deleted_at`)
are kept for `levelzero export` and the analysis; nothing else reads them. A daemon that runs
for years would keep every one (a soak test: ~85 KB a minute under a steady load): rows older
than `control.history_retention_s` are deleted, a bounded batch per table at a time, oldest
first. The newest row of each table is always kept: an export's watermark refers to it (a
SQLite table emptied would number its next rows from 1 again, below what was exported).

One statement per table and dialect, here, for both stores: `(before, limit)` are its
parameters, the rows deleted its row count.
"""

from __future__ import annotations

from typing import Literal

HISTORY_PRUNE_BATCH = 2_000  # rows per table and statement: the group commit it joins stays short

Dialect = Literal["sqlite", "postgres"]

# table -> (its row order column per dialect, the time a row becomes prunable after, a condition)
_TABLES: dict[str, tuple[dict[Dialect, str], str, str]] = {
    # In key order (the primary key's: no index on the times), which is about time order:
    # the old rows come first, and a statement stops at its limit.
    "fence_events": ({"sqlite": "rowid", "postgres": "seq"}, "at", ""),
    "state_samples": ({"sqlite": "rowid", "postgres": "seq"}, "at", ""),
    # Only rows the GC marked deleted; a live object's row is the GC's catalog.
    "l0_objects": ({"sqlite": "rowid", "postgres": "seq"}, "deleted_at", "deleted_at IS NOT NULL AND "),
    "gc_rounds": ({"sqlite": "round_id", "postgres": "round_id"}, "finished_at", ""),
}
HISTORY_TABLES = tuple(_TABLES)


def prune_statement(table: str, dialect: Dialect) -> str:
    """DELETE up to `limit` rows of `table` older than `before`, never its newest row."""
    order, at, condition = _TABLES[table]
    key = order[dialect]
    before, limit = ("?", "?") if dialect == "sqlite" else ("$1", "$2")
    return (
        f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {condition}"  # noqa: S608 (constant names)
        f"{at} < {before} AND {key} < (SELECT MAX({key}) FROM {table}) ORDER BY {key} LIMIT {limit})"
    )
