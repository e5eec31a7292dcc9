"""When a partition's fence events reach the log store.

Fence events are for export and analysis. A flush per append was a second store job beside
every append (half the group commit's room), so the appender writes every partition's buffered
events in one call every `FENCE_EVENTS_FLUSH_INTERVAL_S`, at once when `FENCE_EVENTS_FLUSH_AT`
gathered or a write was rejected; a partition that stops writes its own; an idle partition's
last events follow within the interval.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from levelzero.actors import appender
from levelzero.actors.partition import PartitionActor, WatermarkBoard
from levelzero.core.errors import StaleClusterEpoch
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.testing.entries import placeholder
from levelzero.testing.nodes import wait_until
from levelzero.testing.virtual_time import in_virtual_time

N = 5


@asynccontextmanager
async def running(store: MemoryLogStore) -> AsyncIterator[PartitionActor]:
    (row,) = await store.create_topic("t", 1, 1, 0.0)
    actor = PartitionActor(row, store, WatermarkBoard())
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            yield actor
            await actor.stop()


def outcomes(store: MemoryLogStore) -> list[tuple[int, str]]:
    """Every fence decision, in order of each row's first one."""
    return [(e.epoch, e.outcome) for e in store.fence_events for _ in range(e.decisions)]


@in_virtual_time
async def test_fence_events_wait_for_the_interval_and_are_all_flushed_at_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(appender, "FENCE_EVENTS_FLUSH_INTERVAL_S", 3600.0)
    store = MemoryLogStore()
    async with running(store) as actor:
        for _ in range(3):
            await actor.write(placeholder(N))
        assert len(store.logs[actor.row.pid]) == 4  # TermStart + the three placeholders
        assert store.fence_events == [], "no flush per append"
    assert outcomes(store) == [(N, "admitted_new_epoch"), (N, "admitted"), (N, "admitted")]


@in_virtual_time
async def test_a_rejection_flushes_fence_events_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(appender, "FENCE_EVENTS_FLUSH_INTERVAL_S", 3600.0)
    store = MemoryLogStore()
    async with running(store) as actor:
        await actor.write(placeholder(N))
        await actor.write(placeholder(N + 1))
        with pytest.raises(StaleClusterEpoch):
            await actor.write(placeholder(N - 1))
        await wait_until(lambda: len(outcomes(store)) == 3, "the rejection's flush")
        assert outcomes(store) == [
            (N, "admitted_new_epoch"),
            (N + 1, "admitted_new_epoch"),
            (N - 1, "rejected"),
        ]


@in_virtual_time
async def test_an_idle_partitions_fence_events_follow_within_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(appender, "FENCE_EVENTS_FLUSH_INTERVAL_S", 0.05)
    store = MemoryLogStore()
    async with running(store) as actor:
        await actor.write(placeholder(N))
        await actor.write(placeholder(N))
        with anyio.fail_after(5):  # the flush is due 0.05 s after the previous one
            while len(outcomes(store)) < 2:
                await anyio.sleep(0.01)
        assert outcomes(store) == [(N, "admitted_new_epoch"), (N, "admitted")]
        assert actor.view().pending_records == 0


@in_virtual_time
async def test_decisions_alike_are_one_row_with_their_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row per decision was a second SQLite row per placeholder: decisions with the same term,
    epoch, outcome and window between two flushes are one row, `decisions` counting them, `at`
    the first one's time; a new window or outcome starts a row of its own."""
    monkeypatch.setattr(appender, "FENCE_EVENTS_FLUSH_INTERVAL_S", 3600.0)
    store = MemoryLogStore()
    async with running(store) as actor:
        for _ in range(50):
            await actor.write(placeholder(N))
        await actor.write(placeholder(N + 1))
        for _ in range(7):
            await actor.write(placeholder(N + 1))
        term = actor.term
    rows = [(e.term, e.epoch, e.outcome, e.window_min, e.window_max, e.decisions) for e in store.fence_events]
    assert rows == [
        (term, N, "admitted_new_epoch", N, N, 1),
        (term, N, "admitted", N, N, 49),
        (term, N + 1, "admitted_new_epoch", N, N + 1, 1),
        (term, N + 1, "admitted", N, N + 1, 7),
    ]
    assert sum(e.decisions for e in store.fence_events) == 58
    assert [e.at for e in store.fence_events] == sorted(e.at for e in store.fence_events)


class CountingStore(MemoryLogStore):
    def __init__(self) -> None:
        super().__init__()
        self.fence_event_calls = 0

    async def record_fence_events(self, rows):  # type: ignore[no-untyped-def]
        self.fence_event_calls += 1
        await super().record_fence_events(rows)


@in_virtual_time
async def test_one_call_writes_the_fence_events_of_every_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node's partitions share an appender: their events due at one flush are one call
    (a call per partition per interval was 10,000 store jobs a second at 10,000 partitions)."""
    monkeypatch.setattr(appender, "FENCE_EVENTS_FLUSH_INTERVAL_S", 0.05)
    store = CountingStore()
    rows = await store.create_topic("t", 8, 1, 0.0)
    shared = appender.Appender(store)
    actors = [PartitionActor(row, store, WatermarkBoard(), appender=shared) for row in rows]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(shared.run)
            for actor in actors:
                await tg.start(actor.run)
            async with anyio.create_task_group() as writers:
                for actor in actors:
                    writers.start_soon(actor.write, placeholder(N))
            assert store.fence_event_calls == 0
            while len(store.fence_events) < len(actors):
                await anyio.sleep(0.01)
            assert store.fence_event_calls == 1
            assert sorted(e.pid for e in store.fence_events) == sorted(r.pid for r in rows)
            for actor in actors:
                await actor.stop()
            tg.cancel_scope.cancel()
