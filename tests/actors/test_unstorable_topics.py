"""A store holding a topic an older levelzero accepted and today's name rule refuses (`.`, `..`,
`.lz-tmp-x`): the node starts, says what to do, keeps the topic readable and refuses new
records to it, instead of failing its reconciliation forever without a word."""

from __future__ import annotations

import logging
import random

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.errors import InvalidInput
from levelzero.core.l0format import Record
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import L1Row, L1State
from levelzero.testing.virtual_time import in_virtual_time

CONFIG = NodeConfig(
    epoch_bump_interval_s=None,
    batcher=BatcherConfig(linger_ms=1),
    reconciler=ReconcilerConfig(enabled=False),
    housekeeper=HousekeeperConfig(enabled=False),
)


@pytest.mark.parametrize("legacy", [".", "..", ".lz-tmp-x"])
@in_virtual_time
async def test_a_stored_topic_with_a_refused_name_starts_read_only_and_says_what_to_do(
    legacy: str, caplog: pytest.LogCaptureFixture
) -> None:
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    await log_store.create_topic(legacy, 2, 1, 0.0)  # as an older levelzero let it
    caplog.set_level(logging.ERROR, logger="levelzero")
    node = Node(CONFIG, log_store, objects, rng=random.Random(3))
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            assert node.accepting
            assert set(node.unstorable_topics) == {legacy}
            advice = [r.getMessage() for r in caplog.records if legacy in r.getMessage()]
            assert len(advice) == 1, "said once per topic, not once per partition"
            assert "cannot be stored" in advice[0]
            assert f"levelzero partition abandon-unreconciled {legacy}/P --confirm" in advice[0]
            with pytest.raises(InvalidInput, match="takes no new records"):
                await node.produce(legacy, 0, [Record(None, b"v")])
            fetched = await node.fetch(legacy, 1, 0, 1024)
            assert fetched.records == []
            await node.create_topic("fine", 1)
            await node.produce("fine", 0, [Record(None, b"v")])  # the rest serves as usual
            await node.shutdown()


@in_virtual_time
async def test_an_l1_row_whose_key_no_store_can_hold_is_finished_without_asking_the_store() -> None:
    """An older levelzero recorded COPY_STARTED before the store refused the upload of
    `level_one/./0/...`; collecting that row must not fail on every retry."""
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    (row,) = await log_store.create_topic(".", 1, 1, 0.0)
    key = "level_one/./0/00000000000000000000-00000000000000000000/1-" + "d" * 32
    await log_store.l1_insert(L1Row(key, row.pid, 0, 0, 1, 1, 10, L1State.COPY_STARTED, 0.0, 0.0))
    node = Node(CONFIG, log_store, objects, rng=random.Random(3), wall_clock=lambda: 10_000.0)
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            deleted = await node.l1.collect(node.partition(".", 0), copy_deadline_s=60.0)
            assert deleted == 1
            assert [r.state for r in await log_store.l1_list(row.pid)] == [L1State.DELETE_FINISHED]
            await node.shutdown()
