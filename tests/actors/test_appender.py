"""The node's appender: partitions' reserved records go to the log store many partitions per
call, each partition's in log order with one batch on its way at a time, and are applied when
the call returns."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
import pytest

from levelzero.actors import appender as appender_module
from levelzero.actors.appender import Appender
from levelzero.actors.partition import PartitionActor, WatermarkBoard
from levelzero.core.entries import LogRecord
from levelzero.core.errors import NotLeader, ShuttingDown, StorageError
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.protocols import Append, OnDurable
from levelzero.testing.entries import placeholder
from levelzero.testing.nodes import submit, wait_until
from levelzero.testing.virtual_time import in_virtual_time

EPOCH = 3


class RecordingStore(MemoryLogStore):
    """Keeps each append call's partitions; `hold` makes calls wait until `release`."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[tuple[int, list[int]]]] = []
        self.hold = False
        self._released = anyio.Event()
        self.fail_with: Exception | None = None

    async def append_many(
        self, appends: Sequence[Append], on_durable: OnDurable | None = None
    ) -> list[NotLeader | None]:
        self.calls.append([(a.pid, [r.log_offset for r in a.records]) for a in appends])
        if self.fail_with is not None:
            raise self.fail_with
        if self.hold:
            await self._released.wait()
        return await super().append_many(appends, on_durable)

    def release(self) -> None:
        self.hold = False
        self._released.set()
        self._released = anyio.Event()


@asynccontextmanager
async def partitions(store: MemoryLogStore, count: int) -> AsyncIterator[list[PartitionActor]]:
    rows = await store.create_topic("t", count, 1, 0.0)
    shared = Appender(store)
    actors = [PartitionActor(row, store, WatermarkBoard(), appender=shared) for row in rows]
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            await tg.start(shared.run)
            for actor in actors:
                await tg.start(actor.run)
            yield actors
            for actor in actors:
                await actor.stop()
            tg.cancel_scope.cancel()


@in_virtual_time
async def test_writes_to_many_partitions_are_one_call_and_answered_in_log_order() -> None:
    store = RecordingStore()
    async with partitions(store, 50) as actors:
        replies = [await submit(actor, placeholder(EPOCH, checksum=i)) for i, actor in enumerate(actors)]
        records: list[LogRecord] = [await reply.wait() for reply in replies]
        assert store.calls == [[(actor.row.pid, [1]) for actor in actors]]  # TermStart is 0
        assert [r.log_offset for r in records] == [1] * 50
        for actor in actors:
            assert actor.state.next_log_offset == 2
            assert actor.view().pending_records == 0


class TwoCommitStore(MemoryLogStore):
    """Commits a call's first half, tells its partitions (`on_durable`), and holds the second
    half until `release`: a store with two writers whose second batch commits later."""

    def __init__(self) -> None:
        super().__init__()
        self.released = anyio.Event()
        self.returned = 0

    async def append_many(
        self, appends: Sequence[Append], on_durable: OnDurable | None = None
    ) -> list[NotLeader | None]:
        half = len(appends) // 2

        def shifted(index: int, refusal: NotLeader | None) -> None:
            assert on_durable is not None
            on_durable(half + index, refusal)

        first = await super().append_many(appends[:half], on_durable)
        await self.released.wait()
        second = await super().append_many(appends[half:], shifted if on_durable else None)
        self.returned += 1
        return first + second


@in_virtual_time
async def test_partitions_are_answered_as_their_batch_commits_not_when_the_call_returns() -> None:
    # The node's appender hands every waiting partition to one `append_many`; PostgreSQL
    # commits it as two batches on its two writers. The first batch's writers are answered at
    # its COMMIT and write again while the second batch commits (they waited for the slower
    # commit, and the two writers' overlap was lost).
    store = TwoCommitStore()
    async with partitions(store, 4) as actors:
        replies = [await submit(actor, placeholder(EPOCH, checksum=i)) for i, actor in enumerate(actors)]
        await wait_until(lambda: replies[0].done and replies[1].done, "the first batch's writers answered")
        assert [reply.done for reply in replies] == [True, True, False, False]
        assert store.returned == 0
        again = await submit(actors[0], placeholder(EPOCH, checksum=9))  # while the second commits
        store.released.set()
        assert [(await reply.wait()).log_offset for reply in (*replies, again)] == [1, 1, 1, 1, 2]
        for actor in actors:
            assert actor.view().pending_records == 0


@in_virtual_time
async def test_a_partitions_writes_wait_for_its_batch_on_the_way_and_keep_their_order() -> None:
    store = RecordingStore()
    async with partitions(store, 2) as (a, b):
        store.hold = True
        first = await submit(a, placeholder(EPOCH, checksum=1))
        while not store.calls:
            await anyio.sleep(0)
        later = [await submit(a, placeholder(EPOCH, checksum=n)) for n in (2, 3)]
        other = await submit(b, placeholder(EPOCH, checksum=4))
        # a's next batch waits for its first; b goes in a call of its own meanwhile
        await wait_until(lambda: len(store.calls) == 2, "b's batch in a call of its own")
        assert store.calls == [[(a.row.pid, [1])], [(b.row.pid, [1])]]
        store.release()
        assert [(await r.wait()).log_offset for r in (first, *later, other)] == [1, 2, 3, 1]
        assert store.calls[2:] == [[(a.row.pid, [2, 3])]]
        assert [r.log_offset for r in store.logs[a.row.pid]] == [0, 1, 2, 3]


@in_virtual_time
async def test_calls_hold_at_most_their_partitions_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(appender_module, "PARTITIONS_PER_CALL_MAX", 16)
    store = RecordingStore()
    async with partitions(store, 40) as actors:
        store.hold = True
        replies = [await submit(actor, placeholder(EPOCH, checksum=i)) for i, actor in enumerate(actors)]
        while len(store.calls) < 3:
            await anyio.sleep(0)
        store.release()
        for reply in replies:
            await reply.wait()
        assert [len(call) for call in store.calls] == [16, 16, 8]
        assert sorted(pid for call in store.calls for pid, _ in call) == sorted(
            actor.row.pid for actor in actors
        )


@in_virtual_time
async def test_a_partition_refused_by_the_store_is_deposed_and_the_others_go_on() -> None:
    store = RecordingStore()
    async with partitions(store, 3) as actors:
        await store.begin_term(actors[1].row.pid, 1, 0)  # another leader's term
        replies = [await submit(actor, placeholder(EPOCH, checksum=i)) for i, actor in enumerate(actors)]
        assert (await replies[0].wait()).log_offset == 1
        assert (await replies[2].wait()).log_offset == 1
        with pytest.raises(NotLeader):
            await replies[1].wait()
        with pytest.raises(NotLeader):
            await actors[1].write(placeholder(EPOCH, checksum=9))
        assert (await actors[0].write(placeholder(EPOCH, checksum=10))).log_offset == 2


@in_virtual_time
async def test_a_failing_store_ends_the_appender_and_its_writers_are_answered() -> None:
    store = RecordingStore()
    rows = await store.create_topic("t", 2, 1, 0.0)
    shared = Appender(store)
    actors = [PartitionActor(row, store, WatermarkBoard(), appender=shared) for row in rows]
    answers: list[BaseException] = []

    async def write(actor: PartitionActor) -> None:
        try:
            await actor.write(placeholder(EPOCH, checksum=1))
        except ShuttingDown as error:
            answers.append(error)

    crashed: list[BaseExceptionGroup] = []
    running = anyio.Event()

    async def node() -> None:
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(shared.run)
                for actor in actors:
                    await tg.start(actor.run)
                running.set()
                await anyio.sleep_forever()
        except BaseExceptionGroup as group:
            crashed.append(group)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as outer:  # the writers are not the node's tasks
            outer.start_soon(node)
            await running.wait()
            store.fail_with = StorageError("disk gone")
            for actor in actors:
                outer.start_soon(write, actor)
    assert (
        crashed
        and crashed[0].subgroup(lambda e: isinstance(e, StorageError) and "disk gone" in str(e)) is not None
    )
    assert len(answers) == 2  # nobody is left waiting


class _NoWaiting:
    """A calls semaphore that may be taken without waiting only."""

    def __init__(self, inner: anyio.Semaphore) -> None:
        self._inner = inner
        self.taken = 0

    async def acquire(self) -> None:
        raise AssertionError("the appender waited for its calls semaphore")

    def acquire_nowait(self) -> None:
        self._inner.acquire_nowait()
        self.taken += 1

    def release(self) -> None:
        self._inner.release()


@in_virtual_time
async def test_a_partitions_own_appender_takes_no_turn_of_the_loop_per_call() -> None:
    # An actor without the node's appender has one call at a time, awaited inline: its
    # semaphore is always free, and waiting for it cost a cancel scope and a loop turn a call.
    store = MemoryLogStore()
    rows = await store.create_topic("t", 1, 1, 0.0)
    actor = PartitionActor(rows[0], store, WatermarkBoard())
    calls = _NoWaiting(actor._appender._calls)  # type: ignore[arg-type]
    actor._appender._calls = calls  # type: ignore[assignment]
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(actor.run)
            records = [await actor.write(placeholder(EPOCH, checksum=n)) for n in range(3)]
            await actor.stop()
    assert [r.log_offset for r in records] == [1, 2, 3]
    assert calls.taken == 3
    assert [r.log_offset for r in store.logs[rows[0].pid]] == [0, 1, 2, 3]
