"""The node's log appender: writes what its partitions reserved, many partitions per log-store
call, and applies it once durable.

A partition actor reserves log offsets and queues its records (`PartitionActor._to_append`);
when it has some and none on their way, it asks the appender (`request`). The appender takes
every partition that asked, up to `records_per_call_max` records, and appends them all with one
`LogStore.append_many` (one partition: `append`), at most `calls_max` calls at once. When a
partition's records are durable, it is told (`PartitionActor.appended`, from `append_many`'s
`on_durable`, which a store that commits the call as several batches calls at each batch's
COMMIT, before the whole call returns): it applies its records in log order and answers their
writers. A partition has at most one batch on its way, so its records reach the log in the order
reserved; it asks again for what queued meanwhile.

An object of the batcher carries an extent for each of its partitions; all their placeholders
are reserved on the batcher's task, one after another, and then appended in one call: a call
and a wake-up per object, where a call, a task wake-up and a commit wait per partition made the
cost of produce grow with the number of partitions (issue 24).

Fence events (`PartitionActor.take_fence_events`) are written here too: every partition with
some buffered, in one call per `FENCE_EVENTS_FLUSH_INTERVAL_S`, or at once when a partition asks
(a rejected write, or many rows buffered).

A failure of the log store (anything but a partition's `NotLeader`) is not survivable: it is
raised out of `run`, and the node's task group ends (a restart replays), as it did when each
actor appended for itself.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import anyio
import anyio.abc

from levelzero.core.entries import LogRecord
from levelzero.core.errors import NotLeader
from levelzero.storage.protocols import Append, FenceEventRow, LogStore, PartitionRow

from .mailbox import Wakeup

APPEND_CALLS_MAX = 4  # log-store calls on their way at once
RECORDS_PER_CALL_MAX = 4_096  # the stores' group-commit bound (GROUP_COMMIT_MAX_RECORDS)
PARTITIONS_PER_CALL_MAX = 256
FENCE_EVENTS_FLUSH_INTERVAL_S = 1.0  # buffered fence events are written at most this late
FENCE_EVENT_ROWS_PER_CALL_MAX = 4_096


class PartitionActor(Protocol):
    """What the appender asks of a partition actor (`partition.PartitionActor`), named here so
    that the appender does not import the partition that imports it."""

    row: PartitionRow

    def take_append_batch(self, room: int) -> list[LogRecord]: ...

    def appended(self, upto: int, refused: NotLeader | None) -> None: ...

    def take_fence_events(self) -> list[FenceEventRow]: ...


class Appender:
    def __init__(
        self,
        log_store: LogStore,
        *,
        calls_max: int = APPEND_CALLS_MAX,
        records_per_call_max: int = RECORDS_PER_CALL_MAX,
    ) -> None:
        assert 1 <= calls_max <= 64 and 1 <= records_per_call_max <= 1_000_000
        self._store = log_store
        self._records_max = records_per_call_max
        self._calls_max = calls_max
        self._calls = anyio.Semaphore(calls_max)
        # Partitions that asked (each at most once until it is taken: see `request`).
        self._waiting: deque[PartitionActor] = deque()
        self._wakeup = Wakeup()
        # Partitions with fence events buffered since the last flush (a dict: ordered, once).
        self._with_events: dict[PartitionActor, None] = {}
        self._events_wakeup = Wakeup()
        self._events_now = False
        self.calls = 0  # statistics: log-store calls made, partitions' batches appended
        self.batches = 0

    # ------------------------------------------------------------------ partitions (any task)

    def request(self, actor: PartitionActor) -> None:
        """`actor` has records to append and none on their way (the actor asks once)."""
        self._waiting.append(actor)
        self._wakeup.set()

    def note_events(self, actor: PartitionActor, *, now: bool = False) -> None:
        """`actor` buffered fence events; `now`: write them without waiting for the interval."""
        self._with_events[actor] = None
        if now:
            self._events_now = True
        self._events_wakeup.set()

    # ------------------------------------------------------------------ the tasks

    async def run(self, *, task_status: anyio.abc.TaskStatus = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._write_fence_events)
            task_status.started()
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._waiting:
                    if self._calls_max == 1:
                        # The last call was awaited inline, so the semaphore is free: waiting for
                        # it was a cancel scope and a turn of the event loop per call, ~10% of
                        # the CPU of a placeholder in `levelzero bench --only control`.
                        self._calls.acquire_nowait()
                    else:
                        await self._calls.acquire()  # what asks meanwhile joins the next call
                    appends = self._take()
                    if not appends:
                        self._calls.release()
                        break
                    if self._calls_max == 1:
                        await self._append(appends)  # one at a time: no task per call
                    else:
                        # A task per call, not a worker per slot: the calls then reach the
                        # store one after another and commit apart, and their producers come
                        # back apart, so the next objects are cut apart; workers sent them
                        # together, into one commit, and produce at 1,024 partitions fell
                        # into lock-step (one object a round trip: 368k records/s, not 458k).
                        tg.start_soon(self._append, appends)

    def _take(self) -> list[tuple[PartitionActor, list[LogRecord]]]:
        """The waiting partitions' batches, up to `records_per_call_max` records in all."""
        taken: list[tuple[PartitionActor, list[LogRecord]]] = []
        room = self._records_max
        while self._waiting and room > 0 and len(taken) < PARTITIONS_PER_CALL_MAX:
            actor = self._waiting.popleft()
            batch = actor.take_append_batch(room)
            if batch:
                taken.append((actor, batch))
                room -= len(batch)
        return taken

    async def _append(self, appends: list[tuple[PartitionActor, list[LogRecord]]]) -> None:
        def tell(index: int, refusal: NotLeader | None) -> None:
            actor, batch = appends[index]
            actor.appended(batch[-1].log_offset, refusal)

        try:
            if len(appends) == 1:
                actor, batch = appends[0]
                try:
                    await self._store.append(actor.row.pid, batch[0].term, batch)
                    refusal = None
                except NotLeader as error:
                    refusal = error
                tell(0, refusal)
            else:
                # Each partition is told as its records become durable: a store that commits
                # the call as several transactions (PostgreSQL's two writers) answers the
                # first's partitions at its COMMIT, and their writers write again while the
                # second commits, instead of every partition waiting for the slower commit.
                await self._store.append_many(
                    [Append(actor.row.pid, batch[0].term, batch) for actor, batch in appends], tell
                )
        finally:
            self._calls.release()
        self.calls += 1
        self.batches += len(appends)

    async def _write_fence_events(self) -> None:
        """Every partition's buffered fence events, one call per interval (or sooner if asked)."""
        while True:
            while not self._with_events:
                await self._events_wakeup.wait()
                self._events_wakeup.clear()
            with anyio.move_on_after(FENCE_EVENTS_FLUSH_INTERVAL_S):
                while not self._events_now:
                    await self._events_wakeup.wait()
                    self._events_wakeup.clear()
            self._events_now = False
            actors, self._with_events = self._with_events, {}
            rows: list[FenceEventRow] = []
            for actor in actors:
                rows.extend(actor.take_fence_events())
            for start in range(0, len(rows), FENCE_EVENT_ROWS_PER_CALL_MAX):
                await self._store.record_fence_events(rows[start : start + FENCE_EVENT_ROWS_PER_CALL_MAX])
