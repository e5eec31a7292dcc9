"""Checks every log store backend applies to its callers' arguments before touching its
database, with the same messages: one rule, whichever backend holds the log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from levelzero.core.compaction import cleaner_map_refusal
from levelzero.core.entries import ENTRY_KINDS, LogRecord, Placeholder, encode_entry
from levelzero.core.errors import InvalidInput, InvariantViolation
from levelzero.storage.protocols import CompactionCommit, L1State

TOPIC_PARTITIONS_MAX = 10_000


def check_call_records(records: int, bound: int) -> None:
    """One write call holds at most a group commit's records (`group_commit_max_records`)."""
    if records > bound:
        raise InvalidInput(f"{records} records in one call exceed group_commit_max_records ({bound})")


def check_create_topic(topic: str, partitions: int, creation_epoch: int) -> None:
    if not isinstance(topic, str) or not topic:
        raise InvalidInput(f"topic must be a non-empty string, not {topic!r}")
    if not (isinstance(partitions, int) and 1 <= partitions <= TOPIC_PARTITIONS_MAX):
        raise InvalidInput(f"partitions must be in [1, {TOPIC_PARTITIONS_MAX}], not {partitions!r}")
    if not (isinstance(creation_epoch, int) and creation_epoch >= 1):
        raise InvalidInput(f"creation_epoch must be >= 1, not {creation_epoch!r}")


def check_append_records(pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
    """Records of one append carry the append's term and consecutive log offsets."""
    for index, record in enumerate(records):
        if record.term != expected_term:
            raise InvariantViolation(
                f"partition id {pid}: record at log offset {record.log_offset} "
                f"carries term {record.term}, the append expects {expected_term}"
            )
        if record.log_offset != records[0].log_offset + index:
            raise InvariantViolation(
                f"partition id {pid}: records of one append must have consecutive log "
                f"offsets; {record.log_offset} follows {records[index - 1].log_offset}"
            )


def check_cluster_epoch(epoch: int) -> None:
    if not isinstance(epoch, int) or epoch < 1:
        raise InvariantViolation(f"cluster epoch must be an integer >= 1, not {epoch!r}")


def check_l1_state(state: str) -> None:
    if state not in L1State.ALL:
        raise InvalidInput(f"unknown L1 state {state!r}; expected one of {', '.join(L1State.ALL)}")


# The `log` table's columns in their order, in every backend: what `log_row` returns (SQLite
# inserts them by name; PostgreSQL sends each row as a value of the table's row type).
LOG_ROW_COLUMNS = (
    "pid",
    "log_offset",
    "term",
    "base_offset",
    "kind",
    "epoch",
    "record_count",
    "byte_length",
    "object_key",
    "entry",
    "appended_at",
)


def log_row(pid: int, record: LogRecord, now: float) -> tuple[Any, ...]:
    """(pid, log_offset, term, base_offset, kind, epoch, record_count, byte_length, object_key,
    entry, appended_at): a `log` row, in every backend: the columns plain SQL reads, plus the
    encoded entry. (One per appended record: a placeholder's columns are read without lookups.)"""
    entry = record.entry
    kind: str | None
    epoch: int | None
    if type(entry) is Placeholder:
        kind, epoch = _PLACEHOLDER, entry.epoch
        record_count, byte_length = entry.record_count, entry.byte_length
        object_key: str | None = entry.object_key
    else:
        kind = ENTRY_KINDS.get(type(entry))
        if kind is None:
            raise InvariantViolation(f"not a log entry: {entry!r}")
        epoch, record_count, byte_length, object_key = record.epoch, 0, 0, None
    return (
        pid,
        record.log_offset,
        record.term,
        record.base_offset,
        kind,
        epoch,
        record_count,
        byte_length,
        object_key,
        encode_entry(entry),
        now,
    )


_PLACEHOLDER = ENTRY_KINDS[Placeholder]


def compaction_commit_refusal(
    commit: CompactionCommit,
    current_term: int | None,
    accepted: Mapping[int, int],
    rows: Mapping[str, tuple[int, str]],
) -> str | None:
    """Why a store refuses `commit` (None: it applies), one rule for every backend: the
    partition is live, the cleaner-offset map lies within the term lineage, each new object is
    the partition's and COPY_STARTED, each superseded one the partition's and COPY_FINISHED.
    `rows` maps the keys the commit names to their (pid, state)."""
    if current_term is None:
        return f"partition {commit.pid} is deleted"
    lineage = cleaner_map_refusal(accepted, current_term, commit.writer_term, commit.cleaner_offsets)
    if lineage is not None:
        return lineage
    if not commit.new_keys or set(commit.new_keys) & set(commit.superseded_keys):
        return "a result names no new object, or one both new and superseded"
    for key, wanted in [(k, L1State.COPY_STARTED) for k in commit.new_keys] + [
        (k, L1State.COPY_FINISHED) for k in commit.superseded_keys
    ]:
        found = rows.get(key)
        if found != (commit.pid, wanted):
            return f"L1 object {key} is {found}, not ({commit.pid}, {wanted})"
    return None
