"""The compactor over a running node: the latest record per key at its offset, gaps read as
Kafka reads them, tombstones until delete.retention.ms, the lag and the reconciled offset
respected, superseded objects deleted only after the result is accepted, a zombie's result
refused and its object collected, reads in flight never failing."""

from __future__ import annotations

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.compactor import CompactorConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.intake import ProduceIntake
from levelzero.actors.node import NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.errors import KeylessRecord
from levelzero.core.keys import L1_ROOT
from levelzero.core.l0format import Record
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import L1State
from levelzero.testing.nodes import running_node


class WallClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make_config() -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=0.0,
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False, copy_deadline_s=60.0, object_age_max_s=0.0),
        housekeeper=HousekeeperConfig(enabled=False, idle_after_s=0.0, copy_deadline_s=60.0),
        compactor=CompactorConfig(enabled=False),
    )


COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "60000"}


async def produce(node, pairs, wall: WallClock) -> list[int]:
    offsets = []
    for key, value in pairs:
        r = await node.produce("c", 0, [Record(key, value, timestamp_ms=round(wall.now * 1000))])
        offsets.append(r.base_offset)
    return offsets


async def read_all(node, start: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    offset = start
    actor = node.partition("c", 0)
    for _ in range(1000):
        if offset >= actor.state.high_watermark:
            break
        result = await node.fetch("c", 0, offset, 1 << 20)
        out.extend((r.offset, r.key, r.value) for r in result.records)
        assert result.next_offset > offset
        offset = result.next_offset
    return out


def l1_keys(store: MemoryObjectStore) -> set[str]:
    return {k for k in store._objects if k.startswith(L1_ROOT)}


async def test_compaction_keeps_the_latest_record_per_key_at_its_offset() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(make_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        await produce(node, [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1")], wall)
        assert await node.reconciler.run_round() == 1
        await produce(node, [(b"b", b"2"), (b"a", b"3")], wall)
        assert await node.reconciler.run_round() == 1
        before = l1_keys(objects)
        assert len(before) == 2
        await produce(node, [(b"a", b"4")], wall)  # above the reconciled offset: untouched, in L0
        assert await node.compactor.run_round() == 1
        assert await read_all(node) == [(3, b"c", b"1"), (4, b"b", b"2"), (5, b"a", b"3"), (6, b"a", b"4")]
        # A fetch at a removed offset returns the next record present.
        first = await node.fetch("c", 0, 1, 1 << 20)
        assert [r.offset for r in first.records][:1] == [3]
        after = l1_keys(objects)
        assert len(after) == 1 and not (after & before)  # superseded objects deleted
        states = {r.key: r.state for r in await log_store.l1_list()}
        assert sorted(states.values()) == [
            L1State.COPY_FINISHED,
            L1State.DELETE_FINISHED,
            L1State.DELETE_FINISHED,
        ]
        status = node.compactor.partitions["c/0"]
        assert status.passes == 1 and status.records_removed == 3 and status.bytes_reclaimed > 0
        assert status.cleaner_offsets == {node.partition("c", 0).term: 5}
        # Nothing new above the cleaner offset: no pass.
        assert await node.compactor.run_round() == 0
        assert node.compactor.partitions["c/0"].not_compacted == "no reconciled data above the cleaner offset"


async def test_tombstones_stay_until_delete_retention_then_go() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(make_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        await produce(node, [(b"a", b"1"), (b"a", None), (b"b", b"1")], wall)
        assert await node.reconciler.run_round() == 1
        assert await node.compactor.run_round() == 1
        assert await read_all(node) == [(1, b"a", None), (2, b"b", b"1")]
        wall.now += 61
        await produce(node, [(b"b", b"2")], wall)
        assert await node.reconciler.run_round() == 1
        assert await node.compactor.run_round() == 1
        assert await read_all(node) == [(3, b"b", b"2")]  # the tombstone went, and no "a" came back
        assert node.compactor.partitions["c/0"].tombstones_dropped == 1


async def test_min_compaction_lag_holds_young_records() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(make_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, {**COMPACT, "min.compaction.lag.ms": "10000"})
        await produce(node, [(b"a", b"1"), (b"a", b"2")], wall)
        assert await node.reconciler.run_round() == 1
        assert await node.compactor.run_round() == 0
        assert "min.compaction.lag.ms" in (node.compactor.partitions["c/0"].not_compacted or "")
        wall.now += 11
        assert await node.compactor.run_round() == 1
        assert await read_all(node) == [(1, b"a", b"2")]


async def test_max_compaction_lag_compacts_old_dirty_data_whatever_the_dirty_ratio() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(make_config(), log_store, objects, wall_clock=wall) as node:
        config = {**COMPACT, "min.cleanable.dirty.ratio": "0.9", "max.compaction.lag.ms": "30000"}
        await node.create_topic("c", 1, config)
        await produce(node, [(k, b"v" * 100) for k in (b"a", b"b", b"c", b"d", b"e", b"f")], wall)
        assert await node.reconciler.run_round() == 1
        assert await node.compactor.run_round() == 1  # all of it dirty: ratio 1.0
        await produce(node, [(b"a", b"w")], wall)
        assert await node.reconciler.run_round() == 1
        status = node.compactor.partitions["c/0"]
        assert await node.compactor.run_round() == 0
        assert 0 < status.dirty_ratio < 0.9
        assert "max.compaction.lag.ms" in (status.not_compacted or "")
        wall.now += 29
        assert await node.compactor.run_round() == 0  # 29 s old: still within the lag
        wall.now += 2
        assert await node.compactor.run_round() == 1  # 31 s old: compacted whatever the ratio
        assert status.not_compacted is None and status.passes == 2
        assert [(o, k) for o, k, _ in await read_all(node)] == [
            (1, b"b"),
            (2, b"c"),
            (3, b"d"),
            (4, b"e"),
            (5, b"f"),
            (6, b"a"),
        ]


async def test_a_zombie_leaders_result_is_refused_and_its_object_collected() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(make_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        await produce(node, [(b"a", b"1"), (b"a", b"2")], wall)
        assert await node.reconciler.run_round() == 1
        before = l1_keys(objects)
        actor = node.partition("c", 0)
        await log_store.begin_term(actor.row.pid, actor.state.next_log_offset, actor.state.high_watermark)
        assert not await node.compactor.compact_partition(actor)  # its term is no longer current
        status = node.compactor.partitions["c/0"]
        assert status.refused == 1 and "zombie" in (status.not_compacted or "")
        assert l1_keys(objects) == before  # what the current leader reads stays; its own went
        assert await log_store.l1_compaction_state(actor.row.pid) == type(
            await log_store.l1_compaction_state(actor.row.pid)
        )({}, frozenset())


async def test_a_read_holding_the_old_lineage_reads_the_new_object() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(make_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        await produce(node, [(b"a", b"1"), (b"a", b"2"), (b"b", b"1")], wall)
        assert await node.reconciler.run_round() == 1
        actor = node.partition("c", 0)
        stale = list(node.l1._valid[actor.row.pid])
        assert await node.compactor.run_round() == 1
        node.l1._valid[actor.row.pid] = stale  # a reader that took the lineage before the commit
        assert await read_all(node) == [(1, b"a", b"2"), (2, b"b", b"1")]


async def test_a_record_without_a_key_is_refused_on_a_compacted_topic() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(make_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        intake = ProduceIntake(node)
        with pytest.raises(KeylessRecord):
            await intake.produce("c", 0, [Record(None, b"x")])
        with anyio.fail_after(5):
            assert (await intake.produce("c", 0, [Record(b"k", b"x")])).base_offset == 0


async def test_a_crash_between_the_accepted_result_and_the_deletes_resumes_them() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(make_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        await produce(node, [(b"a", b"1"), (b"a", b"2")], wall)
        assert await node.reconciler.run_round() == 1
        superseded = l1_keys(objects)

        async def crash(_key: str, _partition: str) -> None:
            return None  # the process died after the commit, before any store delete

        node.l1.finish_superseded = crash  # type: ignore[method-assign]
        assert await node.compactor.run_round() == 1
        assert superseded <= l1_keys(objects)  # still stored, no longer read
        assert await read_all(node) == [(1, b"a", b"2")]
    async with running_node(make_config(), log_store, objects, wall_clock=wall) as node:
        await node.reconciler.run_round()  # start-up collection resumes DELETE_STARTED rows
        assert not (superseded & l1_keys(objects))
        assert await read_all(node) == [(1, b"a", b"2")]
        assert sorted(r.state for r in await log_store.l1_list()) == [
            L1State.COPY_FINISHED,
            L1State.DELETE_FINISHED,
        ]
