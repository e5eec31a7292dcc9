"""The loop of the actors that work in rounds (`actors/wake_loop.py`): a round each interval,
one at once when woken, and a wake during a round kept for the next. Virtual time: the
intervals pass without waiting."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

from levelzero.actors.wake_loop import WakeLoop
from levelzero.testing.virtual_time import in_virtual_time

INTERVAL_S = 10.0


async def round_starts(
    drive: Callable[[WakeLoop, anyio.Event], Awaitable[None]], first_round_s: float = 0.0
) -> list[float]:
    """The (virtual) seconds after its start at which a loop of INTERVAL_S started its rounds
    while `drive` acted on it (given the loop and an event set when the first round starts;
    that round lasts `first_round_s`)."""
    loop = WakeLoop()
    started: list[float] = []
    in_first_round = anyio.Event()
    t0 = anyio.current_time()

    async def one_round() -> None:
        started.append(round(anyio.current_time() - t0, 6))
        if len(started) == 1:
            in_first_round.set()
            await anyio.sleep(first_round_s)

    async with anyio.create_task_group() as tg:
        tg.start_soon(loop.run, INTERVAL_S, one_round)
        await drive(loop, in_first_round)
        tg.cancel_scope.cancel()
    return started


@in_virtual_time
async def test_rounds_run_each_interval_without_a_wake():
    async def drive(loop: WakeLoop, in_first_round: anyio.Event) -> None:
        await anyio.sleep(35.0)

    assert await round_starts(drive) == [10.0, 20.0, 30.0]


@in_virtual_time
async def test_a_wake_starts_a_round_at_once_and_the_interval_again_from_its_end():
    async def drive(loop: WakeLoop, in_first_round: anyio.Event) -> None:
        await anyio.sleep(3.0)
        loop.wake()
        await anyio.sleep(15.0)

    assert await round_starts(drive) == [3.0, 13.0]


@in_virtual_time
async def test_a_wake_during_a_round_runs_the_next_round_right_after_it():
    async def drive(loop: WakeLoop, in_first_round: anyio.Event) -> None:
        loop.wake()
        await in_first_round.wait()
        loop.wake()  # during the first round, which lasts 2 s
        await anyio.sleep(5.0)

    assert await round_starts(drive, first_round_s=2.0) == [0.0, 2.0]
