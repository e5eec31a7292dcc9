"""Run an async test on the simulation's deterministic loop, where time is virtual.

A test whose code under test reads only the loop's clock (anyio.current_time, asyncio's
`loop.time()`) and does no real I/O can let time pass without waiting for it: every
`anyio.sleep`, `fail_after` and lease deadline runs on virtual seconds, so a wait of a
lease TTL takes no wall time and a busy machine cannot make it late. Threads and sockets do
not belong there: the loop has no selector, and it ends a run in which nothing can ever become
ready with `Deadlock`.

    @in_virtual_time
    async def test_x() -> None: ...

is an ordinary (synchronous) test to pytest, so the asyncio plugin leaves it alone; fixtures
are passed through unchanged.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

from levelzero.sim.loop import run_deterministic

P = ParamSpec("P")

# The order among callbacks ready at the same virtual instant is drawn from this seed: fixed,
# so that a failure replays identically.
SEED = 0


def in_virtual_time(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        run_deterministic(test(*args, **kwargs), random.Random(SEED))

    return run
