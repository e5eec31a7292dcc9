"""The batcher's wait for an object's extents: every extent's answer settles its producers as it
comes, and the batcher goes on only once all are answered."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from levelzero.actors.batcher import Batcher, ProduceResult, _Extent, _Fencing, _Request
from levelzero.actors.epochs import EpochCache
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import NotLeader, StaleClusterEpoch
from levelzero.core.l0format import ExtentHeader, Record, encode_extent
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.testing.virtual_time import in_virtual_time

KEY = "level_zero/data/000/000000000000000003/k"


async def epoch() -> int:
    return 3


def batcher() -> Batcher:
    return Batcher(MemoryObjectStore(), MemoryLogStore(), EpochCache(epoch, 60.0))


def extent(fencing: _Fencing, pid: int, records: int) -> tuple[_Extent, asyncio.Future[ProduceResult]]:
    """An extent of one request, and the future its producer waits on."""
    waiter: asyncio.Future[ProduceResult] = asyncio.get_running_loop().create_future()
    kept = (Record(None, b"v"),) * records
    request = _Request(None, kept, len(encode_extent(kept)), waiter, 1)  # type: ignore[arg-type]
    fencing.left += 1
    return _Extent(fencing, ExtentHeader(pid, 0, 10, records, 0), [request]), waiter


def durable(base_offset: int) -> LogRecord:
    return LogRecord(1, 1, base_offset, Placeholder(3, KEY, 0, 10, 1, 0))


@in_virtual_time
async def test_the_wait_lasts_for_every_extent_even_when_the_first_was_answered_at_once() -> None:
    """The count reaches zero between two extents when one is answered before the next is
    handed over; the wait must still last until the later ones are answered (the batcher once
    went on with an extent unanswered, and a stale retry it settled later was lost: simulation
    seed 187)."""
    fencing = _Fencing(batcher(), KEY)
    first, first_reply = extent(fencing, 1, 2)
    first.set(durable(10))  # answered at once: settled now
    second, second_reply = extent(fencing, 2, 1)
    second.fail(StaleClusterEpoch(5, 6, 7))  # kept for a retry; the count is back at zero
    third, third_reply = extent(fencing, 3, 1)
    done = False

    async def waiter() -> None:
        nonlocal done
        await fencing.wait()
        done = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        assert not done
        assert await first_reply == ProduceResult(10, 11, 1, KEY)
        assert [r.waiter for r in fencing.retry] == [second_reply] and not second_reply.done()
        third.fail(NotLeader("t/3", 1, 2))
        third.set(durable(0))  # a second answer (the partition failing later) is ignored
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        assert done and fencing.left == 0 and fencing.appended == 1
    with pytest.raises(NotLeader) as refused:  # the refused extent's producer is failed
        await third_reply
    assert refused.value.partition == "t/3"


@in_virtual_time
async def test_with_every_extent_answered_there_is_no_wait() -> None:
    fencing = _Fencing(batcher(), KEY)
    only, reply = extent(fencing, 1, 3)
    only.set(durable(4))
    with anyio.fail_after(1):
        await fencing.wait()
    assert await reply == ProduceResult(4, 6, 1, KEY)
