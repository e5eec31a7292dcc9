"""Item 3: fence throughput beside a bare anyio actor round trip (the floor).

- floor: N tasks, each reading a `Mailbox` of the partition mailbox's size (the partition's own
  mailbox and discipline) and answering every message
  through `levelzero.actors.mailbox.Reply`, doing no work;
- sut:   N PartitionActors answering `fence_probe(epoch)`: the fence decision, a read unit taken
  and released, a fence event noted and flushed to a log store that drops it.
`callers` tasks spread over the N actors call in a closed loop. Both are counted per CPU second
of this (single-threaded) process, so other load on the machine does not move the figures.
Target: fences/s >= 50% of bare round trips/s.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence

import anyio

from levelzero.actors.mailbox import Mailbox, Reply
from levelzero.actors.partition import MAILBOX_SIZE, PartitionActor
from levelzero.core.leader import WatermarkBoard
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.protocols import FenceEventRow

from .common import Figure, Settings, Target, closed_loop, figure, interleave

ITEM = "fence"
FENCE_EPOCH = 3
PARTITIONS = 64
CALLERS = 256
TARGET = Target(0.50)


class DroppingLogStore(MemoryLogStore):
    """Counts fence decisions instead of keeping their rows (a long run would hold many)."""

    def __init__(self) -> None:
        super().__init__()
        self.fence_events_seen = 0

    async def record_fence_events(self, rows: Sequence[FenceEventRow]) -> None:
        self.fence_events_seen += sum(row.decisions for row in rows)


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


async def fence_probes(
    partitions: int, callers: int, seconds: float, record_fence_events: bool = True
) -> float:
    """Fence probes per CPU second through `partitions` PartitionActors."""
    store = DroppingLogStore()
    rows = await store.create_topic("bench", partitions, 1, 0.0)
    board = WatermarkBoard()
    actors = [PartitionActor(row, store, board, record_fence_events=record_fence_events) for row in rows]
    async with anyio.create_task_group() as tg:
        for actor in actors:
            await tg.start(actor.run)
        for actor in actors:
            await actor.fence_probe(FENCE_EPOCH)  # the one slide: the window is [3, 3] after

        def probe(i: int) -> Awaitable[None]:  # the probe itself, not a coroutine around it
            return actors[i % partitions].fence_probe(FENCE_EPOCH)

        rate = await closed_loop(callers, seconds, probe)
        for actor in actors:
            assert actor.view().fence.window_slides == 1
            await actor.stop()
    return rate


async def fence_figure(
    item: str, partitions: int, callers: int, settings: Settings, *, target: Target | None
) -> Figure:
    seconds = settings.pick(settings.seconds, 0.2)
    pairs = await interleave(
        settings.pick(settings.rounds, 1),
        lambda _: fence_probes(partitions, callers, seconds),
        lambda _: bare_round_trips(partitions, callers, seconds),
    )
    return figure(
        item,
        f"fences/s vs bare actor round trips/s, {partitions} partitions, {callers} callers",
        "ops/CPU-s",
        pairs,
        target=target,
        sut_label="fences",
        floor_label="bare round trips",
        notes={"partitions": partitions, "callers": callers, "seconds": seconds},
    )


async def run(settings: Settings) -> list[Figure]:
    return [await fence_figure(ITEM, PARTITIONS, CALLERS, settings, target=TARGET)]
