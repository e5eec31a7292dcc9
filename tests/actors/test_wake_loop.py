"""The loop of the actors that work in rounds (`actors/wake_loop.py`): a round each interval,
one at once when woken, and a wake during a round kept for the next. Virtual time: the
intervals pass without waiting."""

from __future__ import annotations

import anyio

from levelzero.actors.wake_loop import WakeLoop
from levelzero.testing.virtual_time import in_virtual_time


@in_virtual_time
async def test_rounds_run_each_interval_without_a_wake():
    loop = WakeLoop()
    started: list[float] = []

    async def one_round() -> None:
        started.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        tg.start_soon(loop.run, 10.0, one_round)
        await anyio.sleep(35.0)
        tg.cancel_scope.cancel()
    assert [round(t - t0, 6) for t in started] == [10.0, 20.0, 30.0]


@in_virtual_time
async def test_a_wake_starts_a_round_at_once_and_the_interval_again_from_its_end():
    loop = WakeLoop()
    started: list[float] = []

    async def one_round() -> None:
        started.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        tg.start_soon(loop.run, 10.0, one_round)
        await anyio.sleep(3.0)
        loop.wake()
        await anyio.sleep(15.0)
        tg.cancel_scope.cancel()
    assert [round(t - t0, 6) for t in started] == [3.0, 13.0]


@in_virtual_time
async def test_a_wake_during_a_round_runs_the_next_round_right_after_it():
    loop = WakeLoop()
    started: list[float] = []
    in_round = anyio.Event()

    async def one_round() -> None:
        started.append(anyio.current_time())
        if len(started) == 1:
            in_round.set()
            await anyio.sleep(2.0)  # a round that takes a while; woken meanwhile

    async with anyio.create_task_group() as tg:
        t0 = anyio.current_time()
        tg.start_soon(loop.run, 10.0, one_round)
        loop.wake()
        await in_round.wait()
        loop.wake()
        await anyio.sleep(5.0)
        tg.cancel_scope.cancel()
    assert [round(t - t0, 6) for t in started] == [0.0, 2.0]
