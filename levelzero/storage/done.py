"""A write job's "its batch committed (or failed)": the one-shot flag both log stores' writers set
and a job's one caller awaits.

`anyio.Event` costs ~25 times as much to make (a backend lookup, then two asyncio events), and a
job is made per partition per append (it was 6% of the event loop's time per placeholder): this
waits on a bare future of the running loop, made only if the caller has to wait before the
answer. levelzero runs on asyncio or uvloop, through anyio; cancellation by anyio's cancel
scopes reaches the awaited future as it does any other."""

from __future__ import annotations

import asyncio


class Done:
    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():  # a cancelled waiter is done already
            waiter.set_result(None)

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        """Until set (at once if it is); one waiter at a time: the job's caller (a cancelled
        wait leaves the flag to wait on again)."""
        if self._set:
            return
        assert self._waiter is None, "a job has one waiter"
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
