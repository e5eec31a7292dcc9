"""A running `Node` for tests on stores they give (memory stores, mostly), a wait that steps
the event loop instead of sleeping (on memory stores every step is deterministic), and a write
handed to a partition actor without waiting for it."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.compactor import CompactorConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.mailbox import Reply
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.actors.partition import PartitionActor
from levelzero.core.entries import AdvanceEpoch, LogRecord, Placeholder
from levelzero.storage.protocols import LogStore, ObjectStore

STEPS_MAX = 10_000  # event-loop steps a condition may take before the test fails
RUNNING_NODE_TIMEOUT_S = 30.0  # a hung test fails instead of hanging the suite


def hand_run_config(**housekeeper: Any) -> NodeConfig:
    """A node whose reconciler, housekeeper and compactor run only when a test calls them (an
    L1 object on every reconciler pass, whatever its size or age), with no epoch bumps and the
    epoch read fresh every time; `housekeeper`: HousekeeperConfig fields to set."""
    return NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=0.0,
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False, copy_deadline_s=60.0, object_age_max_s=0.0),
        housekeeper=HousekeeperConfig(enabled=False, idle_after_s=0.0, copy_deadline_s=60.0, **housekeeper),
        compactor=CompactorConfig(enabled=False),
    )


@asynccontextmanager
async def running_node(
    config: NodeConfig,
    log_store: LogStore,
    object_store: ObjectStore,
    *,
    wall_clock: Callable[[], float] | None = None,
    seed: int = 7,
) -> AsyncIterator[Node]:
    """`Node.run` in a task group of its own; shut down on the way out (unless the test did)."""
    node = Node(config, log_store, object_store, rng=random.Random(seed), wall_clock=wall_clock)
    with anyio.fail_after(RUNNING_NODE_TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            try:
                yield node
            finally:
                if node.accepting:
                    await node.shutdown()


async def wait_until(condition: Callable[[], bool], what: str, steps_max: int = STEPS_MAX) -> None:
    """Step the event loop until `condition` holds (memory stores only: no threads)."""
    for _ in range(steps_max):
        if condition():
            return
        await anyio.lowlevel.checkpoint()
    raise AssertionError(f"never happened: {what}")


async def submit(actor: PartitionActor, entry: Placeholder | AdvanceEpoch) -> Reply[LogRecord]:
    """Hand a write to `actor` and return its reply without waiting for it (the batcher's way:
    writes to many partitions, or many to one, in flight at once)."""
    reply: Reply[LogRecord] = Reply()
    if not actor.post_write(entry, reply):
        await actor.send_write(entry, reply)
    return reply
