"""`work` on each of a round's items by a few workers taking them in turn.

The housekeeper's and the reconciler's rounds visit the partitions that moved: most rounds one
or a few. A worker beyond the items would find none left (a task, its cancel scope and two turns
of the event loop for nothing); one item needs no task at all.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

T = TypeVar("T")


async def for_each(items: Sequence[T], work: Callable[[T], Awaitable[None]], workers_max: int) -> None:
    """`work(item)` for each of `items`, at most `workers_max` at once, taken in order. One item,
    or one worker, runs on the caller's task, one after another (no task group)."""
    assert workers_max >= 1, workers_max
    if len(items) <= 1 or workers_max == 1:
        for item in items:
            await work(item)
        return
    todo = iter(items)

    async def worker() -> None:
        for item in todo:
            await work(item)

    async with anyio.create_task_group() as tg:
        for _ in range(min(workers_max, len(items))):
            tg.start_soon(worker)
