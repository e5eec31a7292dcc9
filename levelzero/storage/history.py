"""The control plane's history tables and their pruning by age.

Fence decisions (`fence_events`), partition state samples (`state_samples`), GC rounds
(`gc_rounds`), the rows of L0 objects the GC has deleted (`l0_objects` with `deleted_at`) and
those of L1 objects whose delete is over (`l1_objects` DELETE_FINISHED: retention, DeleteRecords
and compaction leave one per object they remove) are kept for `levelzero export` and the
analysis; nothing else reads them (the housekeeper's listing leaves DELETE_FINISHED rows out; a
stray sweep takes such a key for one no row names). A compacted object's mark (`l1_compacted`)
goes once its object's row is gone. A daemon that runs
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

# table -> (its row order column per dialect, the time a row becomes prunable after, a condition,
# or one per dialect)
_TABLES: dict[str, tuple[dict[Dialect, str], str, str | dict[Dialect, str]]] = {
    # In key order (the primary key's: no index on the times), which is about time order:
    # the old rows come first, and a statement stops at its limit.
    "fence_events": ({"sqlite": "rowid", "postgres": "seq"}, "at", ""),
    "state_samples": ({"sqlite": "rowid", "postgres": "seq"}, "at", ""),
    # Only rows the GC marked deleted; a live object's row is the GC's catalog.
    "l0_objects": ({"sqlite": "rowid", "postgres": "seq"}, "deleted_at", "deleted_at IS NOT NULL AND "),
    "gc_rounds": ({"sqlite": "round_id", "postgres": "round_id"}, "finished_at", ""),
    # Only rows whose delete is over (their last transition's time); before l1_compacted.
    "l1_objects": ({"sqlite": "rowid", "postgres": "seq"}, "updated_at", "state = 'DELETE_FINISHED' AND "),
    "l1_compacted": (
        {"sqlite": "key", "postgres": "key"},
        "committed_at",
        {
            "sqlite": "NOT EXISTS (SELECT 1 FROM l1_objects o WHERE o.key = l1_compacted.key) AND ",
            # (l1_objects.key is COLLATE "C", l1_compacted.key the database's: named once)
            "postgres": (
                'NOT EXISTS (SELECT 1 FROM l1_objects o WHERE o.key = l1_compacted.key COLLATE "C") AND '
            ),
        },
    ),
}
HISTORY_TABLES = tuple(_TABLES)


def prune_statement(table: str, dialect: Dialect) -> str:
    """DELETE up to `limit` rows of `table` older than `before`, never its newest row."""
    order, at, conditions = _TABLES[table]
    key = order[dialect]
    condition = conditions if isinstance(conditions, str) else conditions[dialect]
    before, limit = ("?", "?") if dialect == "sqlite" else ("$1", "$2")
    return (
        f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} WHERE {condition}"  # noqa: S608 (constant names)
        f"{at} < {before} AND {key} < (SELECT MAX({key}) FROM {table}) ORDER BY {key} LIMIT {limit})"
    )
