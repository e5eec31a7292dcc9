"""The loop of an actor that works in rounds: a round every `interval_s`, or sooner when woken.

The reconciler and the compactor run this way. A wake during a round is kept for the next one
(the event is replaced before the round starts), so work that arrived while a round ran is not
left for a whole interval. The housekeeper (a plain sleep, no wake) and the GC (paced by
`GcPacer`, paused and resumed, with an injected sleep) wait differently and keep their own loops.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import NoReturn

import anyio


class WakeLoop:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = anyio.Event()

    def wake(self) -> None:
        """The next round starts now, or as soon as the one running ends."""
        self._event.set()

    async def run(self, interval_s: float, round: Callable[[], Awaitable[object]]) -> NoReturn:
        """`round` after each wait of at most `interval_s`, forever; cancel to stop."""
        assert interval_s > 0, interval_s
        while True:
            with anyio.move_on_after(interval_s):
                await self._event.wait()
            self._event = anyio.Event()
            await round()
