"""Pure group-commit staging: the writer's in-memory view of each partition (term, next log
offset) and the rows a batch of write jobs adds, checked and coalesced without any I/O.

A batch stages every job on the cursors the batches before it left; a refusal (`NotLeader`, an
offset that does not continue the log) is that caller's alone, and its batch mates commit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiosqlite
import msgspec

from levelzero.core.errors import InvariantViolation, LevelZeroError
from levelzero.storage.done import Done


class Cursor(msgspec.Struct, frozen=True):
    """What the writer knows of a partition without asking SQLite. (A msgspec struct: one is
    made per partition per append.)"""

    name: str  # "topic/partition", for error messages
    term: int
    next_log_offset: int
    deleted: bool = False  # its topic was deleted: every write to it is refused


class Batch:
    """The writer's view while executing one batch: committed cursors plus this batch's changes,
    and the rows staged for the batch's shared `executemany` calls."""

    __slots__ = ("committed", "cursors", "pending", "log_records")

    def __init__(self, committed: dict[int, Cursor]) -> None:
        self.committed = committed
        self.cursors: dict[int, Cursor] = {}
        self.pending: dict[str, list[tuple[Any, ...]]] = {}
        self.log_records = 0  # log rows flushed so far

    def cursor(self, pid: int) -> Cursor:
        cursor = self.cursors.get(pid) or self.committed.get(pid)
        if cursor is None:
            raise InvariantViolation(f"unknown partition id {pid}")
        return cursor

    def stage(self, sql: str, rows: Sequence[tuple[Any, ...]]) -> None:
        """Queue rows for one shared executemany. Statements run in the order each was first
        staged in the batch, so only for statements whose relative order does not matter
        (distinct tables, one statement whose rows keep their order), or whose order is fixed
        by staging the earlier one first (empty rows are allowed for that)."""
        self.pending.setdefault(sql, []).extend(rows)

    def statements(self) -> list[tuple[str, list[tuple[Any, ...]]]]:
        """The staged statements to run, in order: those with rows (an empty one only fixed
        the order)."""
        return [(sql, rows) for sql, rows in self.pending.items() if rows]


class Job:
    """One write waiting for the writer. Exactly one of `stage` (checked in memory, its rows
    coalesced with the batch's) or `run` (own statements, inside a savepoint, in batch order)
    is set. Either one updates `Batch.cursors` only as its last step, after nothing can fail."""

    __slots__ = ("weight", "appends", "stage", "run", "done", "result", "error")

    def __init__(
        self,
        *,
        weight: int = 1,
        appends: int = 0,
        stage: Callable[[Batch], Any] | None = None,
        run: Callable[[aiosqlite.Connection, Batch], Awaitable[Any]] | None = None,
    ) -> None:
        assert (stage is None) != (run is None)
        self.weight = max(1, weight)
        # Partitions' appends in the job (its result: a refusal or None for each), for the
        # store's statistics; 0 for other writes.
        self.appends = appends
        self.stage = stage
        self.run = run
        self.done = Done()
        self.result: Any = None
        self.error: BaseException | None = None


def stage_job(job: Job, batch: Batch) -> None:
    """Check a staged job against the batch's cursors and queue its rows; a refusal is that
    caller's alone (its batch mates commit)."""
    assert job.stage is not None
    try:
        job.result = job.stage(batch)
    except (LevelZeroError, AssertionError) as error:
        job.error = error
