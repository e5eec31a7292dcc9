"""Item 3: what the fence costs on the write path — fenced placeholder writes beside the same
writes without the fence (the floor).

- sut:   N PartitionActors taking placeholder writes (`PartitionActor.write`, the batcher's and
  housekeeper's path): the fence decision, a read unit taken, the log offset reserved, the record
  appended by the node's appender to an in-memory log store that drops it, applied, the read
  unit released, a fence event noted and flushed (dropped as well);
- floor: the same actors, appender and store doing the same write less the fence
  (`UnfencedActor`): the log offset reserved, the record appended and applied, the writer
  answered — no fence decision, no read unit, no fence event.
`callers` tasks spread over the N actors call in a closed loop. Both are counted per CPU second
of this (single-threaded) process, so other load on the machine does not move the figures.
Target: fenced writes/s >= 50% of unfenced writes/s (the fence at most doubles a write's CPU).

`bare_round_trips` (an actor round trip doing no work) stays the floor of the scale item's fence
rows and of `python -m levelzero.bench.sweep_actors`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

import anyio

from levelzero.actors.appender import Appender
from levelzero.actors.mailbox import Mailbox, Reply
from levelzero.actors.partition import MAILBOX_SIZE, PartitionActor, _Write
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import NotLeader
from levelzero.core.leader import WatermarkBoard
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.protocols import Append, FenceEventRow, OnDurable

from .common import Figure, Settings, Target, closed_loop, figure, interleave

ITEM = "fence"
FENCE_EPOCH = 3
PARTITIONS = 64
CALLERS = 256
TARGET = Target(0.50)


class UnfencedActor(PartitionActor):
    """A partition actor whose writes skip the fence: reserved, appended and applied as the
    fenced ones are, without the fence decision, its read unit and its event (the floor)."""

    def _on_write(self, msg: _Write) -> None:
        if self._refused(msg.reply):
            return
        self._reserve(msg.entry, msg.reply, holds_read_unit=False)


class DroppingLogStore(MemoryLogStore):
    """Counts appended records and fence decisions instead of keeping them (a long run would
    hold millions): the log keeps only each partition's last record, so offsets stay checked."""

    def __init__(self) -> None:
        super().__init__()
        self.records_seen = 0
        self.fence_events_seen = 0

    async def append_many(
        self, appends: Sequence[Append], on_durable: OnDurable | None = None
    ) -> list[NotLeader | None]:
        refused = await super().append_many(appends, on_durable)
        for append in appends:
            log = self.logs[append.pid]
            self.records_seen += len(append.records)
            del log[:-1]
        return refused

    async def record_fence_events(self, rows: Sequence[FenceEventRow]) -> None:
        self.fence_events_seen += sum(row.decisions for row in rows)


# One placeholder written over and over: the log store keeps nothing, the actor's state counts
# its records (what a write costs is the fence, the append and the apply, not the entry's making).
PLACEHOLDER = Placeholder(
    epoch=FENCE_EPOCH,
    object_key=f"level_zero/data/000/{FENCE_EPOCH:018}/bench",
    byte_offset=0,
    byte_length=4096,
    record_count=10,
    checksum=0,
)


async def bare_round_trips(partitions: int, callers: int, seconds: float) -> float:
    """Round trips per CPU second through `partitions` do-nothing actors."""

    async def bare_actor(mailbox: Mailbox[Reply[None]]) -> None:
        while True:  # the partition actor's own mailbox, replies and discipline
            try:
                reply = await mailbox.receive()
            except anyio.EndOfStream:
                return
            reply.set(None)

    mailboxes: list[Mailbox[Reply[None]]] = [Mailbox(MAILBOX_SIZE) for _ in range(partitions)]

    async def round_trip(i: int) -> None:
        reply: Reply[None] = Reply()
        mailbox = mailboxes[i % partitions]
        try:
            mailbox.send_nowait(reply)  # the partition's own hand-over: no coroutine with room
        except anyio.WouldBlock:
            await mailbox.send(reply)
        await reply.wait()

    async with anyio.create_task_group() as tg:
        for mailbox in mailboxes:
            tg.start_soon(bare_actor, mailbox)
        rate = await closed_loop(callers, seconds, round_trip)
        for mailbox in mailboxes:
            mailbox.close()
    return rate


async def fenced_writes(
    partitions: int,
    callers: int,
    seconds: float,
    record_fence_events: bool = True,
    *,
    fenced: bool = True,
    store: DroppingLogStore | None = None,
) -> float:
    """Placeholder writes per CPU second through `partitions` PartitionActors (`fenced`
    False: `UnfencedActor`s, the floor). `store`: to look at what was written (tests)."""
    store = DroppingLogStore() if store is None else store
    rows = await store.create_topic("bench", partitions, 1, 0.0)
    board = WatermarkBoard()
    appender = Appender(store)  # the node's: one for all its partitions
    kind = PartitionActor if fenced else UnfencedActor
    actors = [
        kind(row, store, board, record_fence_events=record_fence_events, appender=appender) for row in rows
    ]
    async with anyio.create_task_group() as tg:
        await tg.start(appender.run)
        for actor in actors:
            await tg.start(actor.run)
        for actor in actors:
            await actor.write(PLACEHOLDER)  # the one slide: the window is [3, 3] after

        def write(i: int) -> Awaitable[LogRecord]:  # the write itself, not a coroutine around it
            return actors[i % partitions].write(PLACEHOLDER)

        rate = await closed_loop(callers, seconds, write)
        for actor in actors:
            assert actor.view().fence.window_slides == (1 if fenced else 0)
            await actor.stop()
        assert store.fence_events_seen == 0 or fenced
        tg.cancel_scope.cancel()  # the appender
    return rate


async def fence_figure(
    item: str, partitions: int, callers: int, settings: Settings, *, target: Target | None
) -> Figure:
    seconds = settings.pick(settings.seconds, 0.2)
    pairs = await interleave(
        settings.pick(settings.rounds, 1),
        lambda _: fenced_writes(partitions, callers, seconds),
        lambda _: fenced_writes(partitions, callers, seconds, fenced=False),
    )
    return figure(
        item,
        f"fenced writes/s vs the same writes unfenced (reserve, append, apply), "
        f"{partitions} partitions, {callers} callers",
        "ops/CPU-s",
        pairs,
        target=target,
        sut_label="fenced",
        floor_label="unfenced",
        notes={"partitions": partitions, "callers": callers, "seconds": seconds},
    )


async def run(settings: Settings) -> list[Figure]:
    return [await fence_figure(ITEM, PARTITIONS, CALLERS, settings, target=TARGET)]
