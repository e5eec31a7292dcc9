"""The log stores' job flag (`Done`, SQLite and PostgreSQL): what a caller waiting for its
write's batch sees."""

from __future__ import annotations

import anyio

from levelzero.storage.done import Done


async def test_a_job_flag_set_before_the_wait_returns_at_once() -> None:
    done = Done()
    done.set()
    with anyio.fail_after(1):  # a bound only
        await done.wait()
    assert done.is_set()


async def test_a_job_flag_wakes_its_waiter_and_survives_a_cancelled_wait() -> None:
    done = Done()
    woke: list[str] = []
    async with anyio.create_task_group() as tg:  # the caller is cancelled while it waits
        tg.start_soon(done.wait)
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert not done.is_set()  # ... and the flag is unharmed: the next waiter is woken

    async def waiter() -> None:
        await done.wait()
        woke.append("woke")

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert woke == []
        done.set()
    assert woke == ["woke"]
