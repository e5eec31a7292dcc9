"""Periodic work grows with the partitions that move, not with all partitions (issue 24)."""

from __future__ import annotations

import random

import anyio

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.housekeeper import STATE_SAMPLES_PER_CALL_MAX, HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.activity import ActivityBoard
from levelzero.core.l0format import Record
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore

PARTITIONS = 200


def test_activity_board_gives_each_consumer_its_own_names() -> None:
    board = ActivityBoard(("a", "b"))
    board.touch("t/0")
    board.touch("t/1")
    board.touch("t/0")
    assert board.take("a") == {"t/0", "t/1"}
    assert board.take("a") == set()
    board.touch("t/2")
    assert board.take("b") == {"t/0", "t/1", "t/2"}
    assert board.take("a") == {"t/2"}
    assert board.pending("b") == 0


def make_config() -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=0.0,
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False, object_age_max_s=0.0),  # an object every pass
        housekeeper=HousekeeperConfig(enabled=False, idle_after_s=0.0),
    )


async def test_rounds_visit_only_partitions_that_moved() -> None:
    node = Node(make_config(), MemoryLogStore(), MemoryObjectStore(), rng=random.Random(1))
    hk, rec = node.housekeeper, node.reconciler
    async with anyio.create_task_group() as tg:
        await tg.start(node.run)
        try:
            await node.create_topic("t", PARTITIONS)
            # First rounds: every partition (start-up collection; first epoch for each).
            await rec.run_round()
            assert rec.stats.partitions_visited == PARTITIONS
            await hk.run_round()
            assert hk.stats.partitions_tended == PARTITIONS
            assert hk.stats.epochs_advanced == PARTITIONS
            # Their appends moved them: the next round tends them once more, finds them settled.
            await hk.run_round()
            assert hk.stats.partitions_tended == 2 * PARTITIONS
            await hk.run_round()
            assert hk.stats.partitions_tended == 2 * PARTITIONS  # nothing moved: no visit
            await rec.run_round()  # the housekeeper's appends moved every partition
            assert rec.stats.partitions_visited == 2 * PARTITIONS
            await rec.run_round()
            assert rec.stats.partitions_visited == 2 * PARTITIONS  # nothing moved: no visit
            # One partition takes writes: only it is tended and reconciled.
            await node.produce("t", 7, [Record(None, b"x")])
            await rec.run_round()
            assert rec.stats.partitions_visited == 2 * PARTITIONS + 1
            assert node.partition("t", 7).state.lro == 0
            tended = hk.stats.partitions_tended
            await hk.run_round()
            await hk.run_round()
            assert 1 <= hk.stats.partitions_tended - tended <= 2
            assert node.partition("t", 7).view().mp == node.epochs.current - 1
            # A new cluster epoch: every partition needs an AdvanceEpoch, so a full round.
            await node.epochs.advance()
            advanced = hk.stats.epochs_advanced
            await hk.run_round()
            assert hk.stats.epochs_advanced - advanced == PARTITIONS
        finally:
            await node.shutdown()


async def test_state_samples_are_written_in_bounded_calls() -> None:
    store = MemoryLogStore()
    calls: list[int] = []
    record = store.record_state_samples

    async def counting(rows):
        calls.append(len(rows))
        await record(rows)

    store.record_state_samples = counting  # type: ignore[method-assign]
    node = Node(make_config(), store, MemoryObjectStore(), rng=random.Random(1))
    partitions = STATE_SAMPLES_PER_CALL_MAX * 2 + 5
    async with anyio.create_task_group() as tg:
        await tg.start(node.run)
        try:
            await node.create_topic("a", partitions // 2)
            await node.create_topic("b", partitions - partitions // 2)
            assert await node.housekeeper.sample_states() == partitions
            assert calls == [STATE_SAMPLES_PER_CALL_MAX, STATE_SAMPLES_PER_CALL_MAX, 5]
            assert await node.housekeeper.sample_states() == 0  # nothing moved
            await node.produce("a", 3, [Record(None, b"y")])
            assert await node.housekeeper.sample_states() == 1
        finally:
            await node.shutdown()
