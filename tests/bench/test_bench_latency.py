"""The latency item's floor: the log commits it counts. No timing is asserted."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any, cast

from levelzero.bench.latency import CollectionTimer, TimedLogStore
from levelzero.core.entries import AdvanceEpoch, LogRecord, Placeholder
from levelzero.storage.protocols import Append
from levelzero.storage.sqlite import SqliteLogStore


class DroppingStore:
    """Takes every append and keeps the calls."""

    def __init__(self) -> None:
        self.calls: list[Sequence[Append]] = []

    async def append_many(self, appends: Sequence[Append], on_durable: Any = None) -> list[Any]:
        self.calls.append(appends)
        return [None] * len(appends)


def record(entry: Any) -> LogRecord:
    return LogRecord(log_offset=0, term=1, base_offset=0, entry=entry)


async def test_the_floor_times_only_commits_that_carry_placeholders() -> None:
    inner = DroppingStore()
    timed = TimedLogStore(cast(SqliteLogStore, inner))
    placeholder = Placeholder(1, "k", byte_offset=0, byte_length=1, record_count=1, checksum=0)
    await timed.append_many([Append(1, 1, [record(AdvanceEpoch(1))])])  # the housekeeper's
    await timed.append_many([Append(1, 1, [record(AdvanceEpoch(2))]), Append(2, 1, [record(placeholder)])])
    await timed.append_many([Append(3, 1, [record(AdvanceEpoch(3))])])
    assert len(inner.calls) == 3  # every call reaches the store
    assert len(timed.commit_s) == 1  # one of them is a produce's commit


def test_the_collection_timer_sees_a_collection() -> None:
    with CollectionTimer() as timer:
        gc.collect()
    assert timer.longest_s > 0
    assert timer not in gc.callbacks
