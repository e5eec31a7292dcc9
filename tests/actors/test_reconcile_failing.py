"""One poisoned partition never silently stops the GC for everyone: a partition whose
reconciliation keeps failing (its L0 object lost) is named — since when, the last error — in
the reconciler's health, in `gc explain`; and the operator's escape hatch
(`abandon-unreconciled`) lets it move on, giving up exactly its unreconciled offsets."""

from __future__ import annotations

from dataclasses import replace

import logging

import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.entries import AbandonUnreconciled, Placeholder
from levelzero.core.errors import InvalidInput, OffsetOutOfRange, OffsetsAbandoned
from levelzero.core.l0format import Record
from levelzero.core.reconcile_health import RECONCILE_FAILING_RETRY_S, RECONCILE_FAILURES_BEFORE_FAILING
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.testing.nodes import running_node


class WallClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


CONFIG = NodeConfig(
    epoch_bump_interval_s=None,
    epoch_cache_ttl_s=0.0,
    batcher=BatcherConfig(linger_ms=1),
    reconciler=ReconcilerConfig(enabled=False, object_age_max_s=0.0),  # an object every pass
    housekeeper=HousekeeperConfig(enabled=False, idle_after_s=0.0),
)


async def produce(node: Node, topic: str, partition: int, value: bytes) -> int:
    return (await node.produce(topic, partition, [Record(None, value)])).base_offset


async def settle(node: Node) -> None:
    """Epochs advance, the housekeeper tends every partition, the reconciler runs a pass."""
    await node.epochs.advance()
    await node.housekeeper.run_round(force=True)
    await node.reconciler.run_round()
    await node.housekeeper.run_round(force=True)


async def test_a_lost_l0_object_is_a_named_condition_and_abandoning_lets_m_rise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(CONFIG, log_store, objects, wall_clock=wall, seed=5) as node:
        await node.create_topic("t", 2)
        for partition in (0, 1):
            await produce(node, "t", partition, b"kept")
        await node.reconciler.run_round()  # offset 0 of both partitions is in L1
        lost = await node.produce("t", 0, [Record(None, b"lost-1"), Record(None, b"lost-2")])
        objects._objects.pop(lost.object_key)  # a storage incident: gone for good
        await produce(node, "t", 1, b"healthy")

        for _ in range(RECONCILE_FAILURES_BEFORE_FAILING):
            await settle(node)
            wall.now += 1.0
        health = node.reconciler.health
        (failing,) = health.failing()
        assert failing.partition == "t/0"
        assert failing.since == 1_000_000.0 and failing.failures == RECONCILE_FAILURES_BEFORE_FAILING
        assert lost.object_key in failing.last_error
        t0, t1 = node.partition("t", 0), node.partition("t", 1)
        assert t1.state.lro == 1, "the other partitions keep reconciling"
        stuck_mp = t0.state.mp
        assert stuck_mp is not None and stuck_mp < t1.state.mp, "t/0 holds M back"
        explained = await node.gc.explain()
        (holder,) = [h for h in explained.holders if h.partition == "t/0"]
        assert "reconciliation failing since 1970-01-12T13:46:40Z (3 passes)" in holder.reason
        assert any("keeps failing" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)

        # Failing: retried every RECONCILE_FAILING_RETRY_S, not every pass.
        errors = node.reconciler.stats.errors
        await node.reconciler.run_round()
        assert node.reconciler.stats.errors == errors
        wall.now += RECONCILE_FAILING_RETRY_S
        await node.reconciler.run_round()
        assert node.reconciler.stats.errors == errors + 1

        # The escape hatch.
        with pytest.raises(InvalidInput, match="not failing"):
            await node.abandon_unreconciled("t", 1, operator="ops", reason="r")
        abandoned = await node.abandon_unreconciled("t", 0, operator="ops@host", reason="bucket incident 42")
        assert (abandoned.first_offset, abandoned.last_offset) == (1, 2)
        assert abandoned.last_error == failing.last_error
        assert health.failing() == []
        assert t0.state.lro == 2 and t0.state.abandoned == ((1, 2),)
        entries = [r.entry for r in log_store.logs[t0.row.pid] if isinstance(r.entry, AbandonUnreconciled)]
        assert [(e.upto, e.operator, e.reason, e.at) for e in entries] == [
            (2, "ops@host", "bucket incident 42", wall.now)
        ]
        audit = [r for r in caplog.records if "AUDIT abandon-unreconciled t/0" in r.getMessage()]
        assert len(audit) == 1 and "offsets 1..2" in audit[0].getMessage()

        # What it gives up: those offsets, with a clear error; nothing else.
        assert [r.value for r in (await node.fetch("t", 0, 0, 1024)).records] == [b"kept"]
        for offset in (1, 2):
            with pytest.raises(OffsetsAbandoned, match="abandoned .*next readable offset is 3") as err:
                await node.fetch("t", 0, offset, 1024)
            assert isinstance(err.value, OffsetOutOfRange) and err.value.code == "offset_out_of_range"
        after = await produce(node, "t", 0, b"after")
        assert after == 3
        await settle(node)
        assert t0.state.lro == 3 and health.failing() == []
        assert [r.value for r in (await node.fetch("t", 0, 3, 1024)).records] == [b"after"]
        assert t0.state.mp > stuck_mp, "M(p) moves again, and M with it"
        with pytest.raises(InvalidInput, match="not failing"):
            await node.abandon_unreconciled("t", 0, operator="ops", reason="again")

    # The log records it: a restart replays the same state.
    async with running_node(CONFIG, log_store, objects, wall_clock=wall, seed=5) as node:
        restarted = node.partition("t", 0)
        assert restarted.state.abandoned == ((1, 2),)
        with pytest.raises(OffsetsAbandoned):
            await node.fetch("t", 0, 2, 1024)


@pytest.mark.parametrize("age_max_s", [0.0, 30.0])
async def test_a_topic_no_store_can_hold_is_named_failing_at_once_without_reading_its_data(age_max_s) -> None:
    """At once: also when its data would otherwise wait for the L1 object's age bound."""
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    await log_store.create_topic("..", 1, 1, 0.0)  # as an older levelzero let it
    config = replace(CONFIG, reconciler=replace(CONFIG.reconciler, object_age_max_s=age_max_s))
    async with running_node(config, log_store, objects, wall_clock=wall, seed=5) as node:
        actor = node.partition("..", 0)
        # Data written before the rule changed (the batcher refuses the topic now); its object
        # is not even there: the reconciler must not read it to know it cannot succeed.
        await actor.write(Placeholder(1, "level_zero/data/000/000000000000000001/" + "a" * 32, 0, 10, 1, 0))
        await node.reconciler.run_round()
        (failing,) = node.reconciler.health.failing()
        assert failing.partition == "../0" and failing.failures == 1
        assert "cannot be stored" in failing.last_error and "not found" not in failing.last_error
        assert "levelzero partition abandon-unreconciled ../P --confirm" in failing.last_error
        abandoned = await node.abandon_unreconciled("..", 0, operator="ops", reason="renamed topic")
        assert (abandoned.first_offset, abandoned.last_offset) == (0, 0)
        await node.reconciler.run_round()
        assert node.reconciler.health.failing() == []


async def test_a_partition_that_reconciles_again_says_so_at_info_with_when_and_how_long(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(CONFIG, log_store, objects, wall_clock=wall, seed=5) as node:
        await node.create_topic("t", 1)
        produced = await node.produce("t", 0, [Record(None, b"back soon")])
        body = objects._objects.pop(produced.object_key)  # away for a while (a bucket incident)
        for _ in range(RECONCILE_FAILURES_BEFORE_FAILING):
            await settle(node)
            wall.now += 1.0
        assert [f.partition for f in node.reconciler.health.failing()] == ["t/0"]
        objects._objects[produced.object_key] = body
        wall.now += RECONCILE_FAILING_RETRY_S
        with caplog.at_level(logging.INFO, logger="levelzero.reconciler"):
            await node.reconciler.run_round()
        assert node.reconciler.health.failing() == []
    [record] = [r for r in caplog.records if "works again" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage() == (
        "reconciliation of t/0 works again: it had failed since 1970-01-12T13:46:40Z "
        f"(for {RECONCILE_FAILURES_BEFORE_FAILING + RECONCILE_FAILING_RETRY_S:.0f} s, "
        f"{RECONCILE_FAILURES_BEFORE_FAILING} passes)"
    )
