"""The deterministic loop (levelzero/sim/loop.py): virtual time, a seeded order among ready
callbacks, and exact replay of an anyio program in fresh processes."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading
from typing import Any

import anyio
import pytest
import anyio.lowlevel as anyio_lowlevel
from anyio._backends import _asyncio as anyio_asyncio
from anyio._core import _eventloop as anyio_eventloop
from anyio._core import _synchronization as anyio_synchronization
from anyio._core import _tasks as anyio_tasks

from levelzero.sim import loop as loop_module
from levelzero.sim.loop import LIVELOCK_CALLBACKS, Deadlock, DeterministicLoop, Livelock, run_deterministic

# An anyio program with timers, events, a memory stream and a task group cancelled while eight
# tasks sleep (anyio cancels them in the order of a set of tasks). It prints its trace digest.
PROGRAM = """
import random, sys, zlib
import anyio
from levelzero.sim.loop import run_deterministic

trace = []

async def worker(i, ev, tx):
    for k in range(3):
        await anyio.sleep(0.1 * (i + k))
        trace.append(f"{anyio.current_time():.3f} w{i} {k}")
    await tx.send(i)
    await ev.wait()
    trace.append(f"w{i} saw the event")

async def sleeper(i):
    try:
        await anyio.sleep(1000)
    finally:
        trace.append(f"s{i} cancelled at {anyio.current_time()}")

async def main():
    ev = anyio.Event()
    tx, rx = anyio.create_memory_object_stream(0)
    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(worker, i, ev, tx)
        async with anyio.create_task_group() as inner:
            for i in range(8):
                inner.start_soon(sleeper, i)
            await anyio.sleep(0.5)
            inner.cancel_scope.cancel()
        for _ in range(5):
            trace.append(f"got {await rx.receive()}")
        await anyio.sleep(3600)
        ev.set()
    return anyio.current_time()

end = run_deterministic(main(), random.Random(int(sys.argv[1])))
print(end, zlib.crc32("\\n".join(trace).encode()))
"""


def run_fresh(seed: int) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(seed)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


def test_same_seed_same_trace_in_two_fresh_processes() -> None:
    first, second = run_fresh(7), run_fresh(7)
    assert first == second
    assert first.split()[0] == "3601.5"  # the last worker sends at 1.5 s, then an hour passes
    others = {run_fresh(seed) for seed in (8, 9, 10)}
    assert len(others | {first}) > 1, "different seeds should explore different orders"


def test_time_jumps_to_the_next_timer() -> None:
    async def main() -> tuple[float, float]:
        before = anyio.current_time()
        await anyio.sleep(86_400)
        with anyio.move_on_after(2.5):
            await anyio.sleep_forever()
        return before, anyio.current_time()

    assert run_deterministic(main(), random.Random(1)) == (0.0, 86_402.5)


def test_ready_callbacks_run_in_a_seeded_order() -> None:
    def order(seed: int) -> list[int]:
        seen: list[int] = []

        async def main() -> None:
            async def one(i: int) -> None:
                seen.append(i)

            async with anyio.create_task_group() as tg:
                for i in range(10):
                    tg.start_soon(one, i)

        run_deterministic(main(), random.Random(seed))
        return seen

    assert order(3) == order(3)
    assert sorted(order(3)) == list(range(10))
    assert len({tuple(order(seed)) for seed in range(6)}) > 1


def test_waiting_for_what_never_comes_is_a_deadlock() -> None:
    async def main() -> None:
        await anyio.Event().wait()

    with pytest.raises(Deadlock, match="nothing ready and no timer"):
        run_deterministic(main(), random.Random(1))


def test_a_task_started_in_a_group_whose_cancellation_was_delivered_is_a_livelock_not_a_hang() -> None:
    """anyio (4.16) cancels a task started in a cancelled task group only if the group's
    delivery is still under way. Here it ended (the group's one task is shielded), so the late
    task's first checkpoint yields at once, forever: time cannot move on to end the shielded
    task. The loop says so after LIVELOCK_CALLBACKS callbacks at one instant instead of
    spinning without end (a seed under a mutation did: `levelzero sim --mutate` never ended)."""
    ran_past: list[bool] = []

    async def main() -> None:
        groups: list[anyio.abc.TaskGroup] = []

        async def shielded() -> None:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(1)

        async def late() -> None:
            await anyio_lowlevel.checkpoint_if_cancelled()
            ran_past.append(True)

        async def outsider() -> None:  # a client starting a request on a node going down
            await anyio.sleep(0.2)
            groups[0].start_soon(late)

        async with anyio.create_task_group() as outer:
            outer.start_soon(outsider)
            async with anyio.create_task_group() as tg:  # the node's, ended by its host
                groups.append(tg)
                tg.start_soon(shielded)
                await anyio.sleep(0.1)
                tg.cancel_scope.cancel()

    loop = DeterministicLoop(random.Random(1))
    try:
        with pytest.raises(Livelock, match="without the clock moving on") as raised:
            loop.run_until_complete(main())
        assert isinstance(raised.value, Deadlock)
        assert loop.time() == pytest.approx(0.2)  # the shielded sleep never ended
        assert loop.callbacks_run > LIVELOCK_CALLBACKS
        assert not ran_past
    finally:
        loop.close()


def test_the_loop_counts_what_it_ran() -> None:
    loop = DeterministicLoop(random.Random(1))
    try:
        loop.run_until_complete(anyio.sleep(5))
        assert loop.time() == 5.0
        assert loop.callbacks_run >= 2
    finally:
        loop.close()


class ReferenceLoop(DeterministicLoop):
    """The deterministic loop scheduling through asyncio's own paths: BaseEventLoop's call_soon,
    call_at and call_later with asyncio's Handle and TimerHandle, and `randrange` for the pick."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng)
        self._randbelow = rng.randrange

    call_soon = asyncio.BaseEventLoop.call_soon  # type: ignore[assignment]
    call_at = asyncio.BaseEventLoop.call_at  # type: ignore[assignment]
    call_later = asyncio.BaseEventLoop.call_later  # type: ignore[assignment]

    def _call_soon(self, callback: Any, args: Any, context: Any) -> asyncio.Handle:
        handle = asyncio.Handle(callback, args, self, context)
        self._make_runnable(callback, handle)
        return handle


async def busy_world() -> list[str]:
    """Tasks that sleep, time out, lock, signal, stream and get cancelled, with the clock and
    the current task in every line."""
    trace: list[str] = []
    lock = anyio.Lock()
    ev = anyio.Event()
    tx, rx = anyio.create_memory_object_stream[int](2)

    def note(what: str) -> None:
        rank = getattr(asyncio.current_task(), "sim_rank", None)  # (names count across runs)
        trace.append(f"{anyio.current_time():.4f} task {rank} {what}")

    async def worker(i: int) -> None:
        for k in range(4):
            with anyio.move_on_after(0.07 * (i % 3 + 1)):
                await anyio.sleep(0.05 * ((i + k) % 4))
                note(f"w{i} slept {k}")
            async with lock:
                await anyio.sleep(0)
                note(f"w{i} locked {k}")
        await tx.send(i)
        await ev.wait()
        note(f"w{i} saw the event")

    async def sleeper(i: int) -> None:
        try:
            await anyio.sleep(100)
        finally:
            note(f"s{i} cancelled")

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(worker, i)
        async with anyio.create_task_group() as inner:
            for i in range(5):
                inner.start_soon(sleeper, i)
            await anyio.sleep(0.3)
            inner.cancel_scope.cancel()
        for _ in range(6):
            note(f"got {await rx.receive()}")
        ev.set()
    return trace


def test_the_lean_scheduling_paths_make_the_picks_asyncio_s_own_paths_make() -> None:
    timed_out = 0
    for seed in range(8):
        lean = DeterministicLoop(random.Random(seed))
        ours = run_deterministic(busy_world(), random.Random(seed), loop=lean)
        reference = ReferenceLoop(random.Random(seed))
        asyncio.set_event_loop(reference)
        try:
            with loop_module._cancel_scopes_hashed_by_creation():
                theirs = reference.run_until_complete(busy_world())
                reference.run_until_complete(reference.shutdown_asyncgens())  # as run_deterministic
        finally:
            asyncio.set_event_loop(None)
            reference.close()
        assert ours == theirs, f"seed {seed}"
        assert (lean.callbacks_run, lean.time()) == (reference.callbacks_run, reference.time())
        kinds = [line.split()[-2] if line.split()[-1].isdigit() else line.split()[-1] for line in ours]
        assert [kinds.count(k) for k in ("locked", "cancelled", "got", "event")] == [24, 5, 6, 6]
        timed_out += 24 - kinds.count("slept")
    assert timed_out > 0  # the timeouts fired too


def test_anyio_and_asyncio_answer_as_before_once_a_run_ends() -> None:
    library, current_task = anyio_eventloop.current_async_library, anyio_asyncio.current_task
    backend_users = (anyio_eventloop, anyio_tasks, anyio_synchronization, anyio_lowlevel)
    backend = anyio_eventloop.get_async_backend

    async def main() -> tuple[str | None, bool, bool]:
        return (
            anyio_eventloop.current_async_library(),
            anyio_asyncio.current_task() is asyncio.current_task(),
            all(m.get_async_backend() is anyio_asyncio.backend_class for m in backend_users),
        )

    assert run_deterministic(main(), random.Random(1)) == ("asyncio", True, True)
    assert anyio_eventloop.current_async_library is library
    assert anyio_asyncio.current_task is current_task
    assert all(m.get_async_backend is backend for m in backend_users)
    assert anyio_eventloop.current_async_library() is None  # no loop runs here


def test_another_thread_is_answered_for_its_own_loop_while_a_simulation_runs() -> None:
    answers: dict[str, object] = {}

    def in_a_thread() -> None:
        async def own_loop() -> None:
            answers["own task"] = anyio_asyncio.current_task() is asyncio.current_task()
            answers["own library"] = anyio_eventloop.current_async_library()

        asyncio.run(own_loop())
        answers["no loop"] = anyio_eventloop.current_async_library()
        try:
            anyio_eventloop.get_async_backend()
        except anyio.NoEventLoopError:
            answers["no backend"] = True

    async def main() -> None:
        thread = threading.Thread(target=in_a_thread)
        thread.start()
        thread.join()  # (the simulated world waits: nothing else runs meanwhile)

    run_deterministic(main(), random.Random(1))
    assert answers == {"own task": True, "own library": "asyncio", "no loop": None, "no backend": True}
