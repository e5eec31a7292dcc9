"""A round's partitions by a few workers (`actors.fan_out`): as many tasks as items up to the
bound, and none for one item; the housekeeper's and the reconciler's rounds use it."""

from __future__ import annotations

import random

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.fan_out import for_each
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.l0format import Record
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore


def make_config() -> NodeConfig:  # the rounds are run by the test
    return NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=0.0,
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False, object_age_max_s=0.0),
        housekeeper=HousekeeperConfig(enabled=False, idle_after_s=0.0),
    )


async def _run(items: list[int], workers_max: int) -> tuple[list[int], set[int], int]:
    """`for_each` over `items`: the order taken, the tasks that ran them, and the most tasks
    alive beside the caller's while they ran."""
    caller = anyio.get_current_task().id
    before = len(anyio.get_running_tasks())
    taken: list[int] = []
    tasks: set[int] = set()
    alive = 0

    async def work(item: int) -> None:
        nonlocal alive
        taken.append(item)
        tasks.add(anyio.get_current_task().id)
        alive = max(alive, len(anyio.get_running_tasks()) - before)
        await anyio.lowlevel.checkpoint()

    await for_each(items, work, workers_max)
    tasks.discard(caller)
    return taken, tasks, alive


async def test_one_item_runs_on_the_callers_task() -> None:
    assert await _run([7], 64) == ([7], set(), 0)
    assert await _run([], 64) == ([], set(), 0)


async def test_one_worker_takes_the_items_in_order_on_the_callers_task() -> None:
    assert await _run([1, 2, 3], 1) == ([1, 2, 3], set(), 0)


@pytest.mark.parametrize(("items", "workers_max", "workers"), [(3, 64, 3), (5, 2, 2), (64, 64, 64)])
async def test_as_many_workers_as_items_up_to_the_bound(items: int, workers_max: int, workers: int) -> None:
    taken, tasks, alive = await _run(list(range(items)), workers_max)
    assert taken == list(range(items))  # each item once, taken in order
    assert len(tasks) == workers
    assert alive == workers  # no worker spawned to find nothing left


async def test_a_housekeeper_round_of_one_partition_tends_it_on_the_rounds_task() -> None:
    node = Node(make_config(), MemoryLogStore(), MemoryObjectStore(), rng=random.Random(1))
    hk = node.housekeeper
    tended_on: list[int] = []
    tend = hk.tend

    async def watched(actor, *, force=False):  # type: ignore[no-untyped-def]
        tended_on.append(anyio.get_current_task().id)
        await tend(actor, force=force)

    hk.tend = watched  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        await tg.start(node.run)
        try:
            await node.create_topic("t", 3)
            await hk.run_round()  # every partition (its first epoch), a worker each
            await hk.run_round()  # their appends moved them all
            assert len(tended_on) == 6 and anyio.get_current_task().id not in tended_on
            await node.produce("t", 1, [Record(None, b"x")])
            tended_on.clear()
            await hk.run_round()
            assert tended_on == [anyio.get_current_task().id]  # one partition moved: no task
        finally:
            await node.shutdown()
