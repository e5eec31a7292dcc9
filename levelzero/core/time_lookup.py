"""ListOffsets by time (Kafka's `offsetsForTimes`), the pure part: which extents a lookup reads,
and its answer from the records of one.

Kafka answers a time T with the earliest offset whose record timestamp is >= T, and that
timestamp; (-1, -1) when no record is that recent. Timestamps are the producers' and need not
rise with offsets, which is why Kafka keeps the largest timestamp of each segment beside its
time index. levelzero keeps the largest timestamp of each extent: in its L0 placeholder and in
its L1 object's metastore row. Walking the extents in offset order, every extent before the
first whose largest timestamp is >= T holds only records older than T, so the answer is in that
extent and a lookup reads that one object range, whatever the log's length. (An extent that
begins below the start offset may hold its only match below it: then the walk goes on.) An
extent whose largest timestamp is unknown — written before it was kept — is read to find out.
"""

from __future__ import annotations

from collections.abc import Sequence

from .l0format import Record, max_timestamp

NOT_FOUND = (-1, -1)


def may_hold(max_timestamp_ms: int | None, timestamp_ms: int) -> bool:
    """Can an extent whose largest timestamp is `max_timestamp_ms` (None: unknown) hold a
    record at or after `timestamp_ms`? False means the lookup need not read it."""
    return max_timestamp_ms is None or max_timestamp_ms >= timestamp_ms


def first_at_or_after(
    records: Sequence[Record],
    base_offset: int,
    from_offset: int,
    timestamp_ms: int,
    max_timestamp_ms: int | None = None,
) -> tuple[int, int] | None:
    """(offset, timestamp) of the first of `records` (the first at `base_offset`) at or above
    `from_offset` whose timestamp is >= `timestamp_ms`; None if there is none.
    `max_timestamp_ms`: what the extent's placeholder or row says its largest is (None:
    unknown), which must be the records' own: a lookup trusting a wrong one would skip
    answers."""
    # Any target, as Kafka's log search takes one: below 0 (a ListOffsets timestamp no special
    # value names) every record matches, one without a timestamp (-1) too, so the first record
    # at or above `from_offset` is the answer.
    assert from_offset >= base_offset, (from_offset, base_offset)
    assert max_timestamp_ms is None or max_timestamp_ms == max_timestamp(records), (
        base_offset,
        max_timestamp_ms,
    )
    for i in range(from_offset - base_offset, len(records)):
        stamped = records[i].timestamp_ms
        if stamped >= timestamp_ms:
            return base_offset + i, stamped
    return None
