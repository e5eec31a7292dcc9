"""The compactor over a running node: the latest record per key at its offset, gaps read as
Kafka reads them, tombstones until delete.retention.ms, the lag and the reconciled offset
respected, superseded objects deleted only after the result is accepted, a zombie's result
refused and its object collected, reads in flight never failing."""

from __future__ import annotations

import anyio
import pytest

from levelzero.actors.intake import ProduceIntake
from levelzero.core.errors import KeylessRecord, StorageError
from levelzero.core.keys import L1_ROOT, parse_l1_key
from levelzero.core.l0format import Record
from levelzero.storage.counting_store import CountingObjectStore
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import L1State
from levelzero.testing.faulty_store import FaultSpec, FaultyObjectStore
from levelzero.testing.nodes import hand_run_config, running_node


class WallClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


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
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
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
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
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
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
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
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
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
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
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
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        await produce(node, [(b"a", b"1"), (b"a", b"2"), (b"b", b"1")], wall)
        assert await node.reconciler.run_round() == 1
        actor = node.partition("c", 0)
        stale = list(node.l1._valid[actor.row.pid])
        assert await node.compactor.run_round() == 1
        node.l1._valid[actor.row.pid] = stale  # a reader that took the lineage before the commit
        assert await read_all(node) == [(1, b"a", b"2"), (2, b"b", b"1")]


async def test_a_read_whose_fresh_lineage_loses_its_object_before_the_get_reads_the_new_one() -> None:
    # Found by the simulation (seed 56): a fetch read the lineage afresh, its GET went out slowly,
    # and meanwhile a compaction committed and deleted the object it named.
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        await produce(node, [(b"a", b"1"), (b"a", b"2"), (b"b", b"1")], wall)
        assert await node.reconciler.run_round() == 1
        actor = node.partition("c", 0)
        (old,) = l1_keys(objects)
        get = objects.get
        compacted: list[int] = []
        reads: list[str] = []

        async def slow_get(key: str, *args: object, **kwargs: object) -> bytes:
            reads.append(key)
            if reads == [old]:  # the fetch's GET lands after the compaction's delete
                compacted.append(await node.compactor.run_round())
            return await get(key, *args, **kwargs)  # type: ignore[arg-type]

        objects.get = slow_get  # type: ignore[method-assign]
        node.l1._valid.pop(actor.row.pid, None)  # the fetch reads the lineage itself
        assert await read_all(node) == [(1, b"a", b"2"), (2, b"b", b"1")]
        assert compacted == [1] and old not in l1_keys(objects)


async def test_a_record_without_a_key_is_refused_on_a_compacted_topic() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        intake = ProduceIntake(node)
        with pytest.raises(KeylessRecord):
            await intake.produce("c", 0, [Record(None, b"x")])
        with anyio.fail_after(5):
            assert (await intake.produce("c", 0, [Record(b"k", b"x")])).base_offset == 0


async def test_a_crash_between_the_accepted_result_and_the_deletes_resumes_them() -> None:
    log_store, objects, wall = MemoryLogStore(), MemoryObjectStore(), WallClock()
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        await produce(node, [(b"a", b"1"), (b"a", b"2")], wall)
        assert await node.reconciler.run_round() == 1
        superseded = l1_keys(objects)

        async def crash(_keys: list[str], _partition: str) -> dict[str, str]:
            return {}  # the process died after the commit, before any store delete

        node.l1.finish_superseded = crash  # type: ignore[method-assign]
        assert await node.compactor.run_round() == 1
        assert superseded <= l1_keys(objects)  # still stored, no longer read
        assert await read_all(node) == [(1, b"a", b"2")]
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.reconciler.run_round()  # start-up collection resumes DELETE_STARTED rows
        assert not (superseded & l1_keys(objects))
        assert await read_all(node) == [(1, b"a", b"2")]
        assert sorted(r.state for r in await log_store.l1_list()) == [
            L1State.COPY_FINISHED,
            L1State.DELETE_FINISHED,
        ]


async def test_a_pass_deletes_its_superseded_objects_in_one_request_and_keeps_its_newest_timestamp() -> None:
    log_store, objects, wall = MemoryLogStore(), CountingObjectStore(MemoryObjectStore()), WallClock()
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        for value in (b"1", b"2", b"3"):
            await produce(node, [(b"a", value), (b"b", value)], wall)
            wall.now += 1
            assert await node.reconciler.run_round() == 1
        superseded = {r.key for r in await log_store.l1_list()}
        before = objects.snapshot()
        assert await node.compactor.run_round() == 1
        spent = objects.snapshot() - before
        assert (spent.delete_requests, spent.deleted_keys, spent.l1_gets) == (1, 3, 3)
        rows = {r.key: r for r in await log_store.l1_list()}
        assert {k for k, r in rows.items() if r.state == L1State.DELETE_FINISHED} == superseded
        (new,) = [r for r in rows.values() if r.state == L1State.COPY_FINISHED]
        # The kept records are the last two, written at the last produce's time.
        assert new.max_timestamp_ms == round((wall.now - 1) * 1000)
        assert await read_all(node) == [(4, b"a", b"3"), (5, b"b", b"3")]


async def test_a_failed_delete_of_a_superseded_object_is_retried_alone() -> None:
    log_store, wall = MemoryLogStore(), WallClock()
    objects = FaultyObjectStore(MemoryObjectStore(), FaultSpec())
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        for value in (b"1", b"2"):
            await produce(node, [(b"a", value)], wall)
            assert await node.reconciler.run_round() == 1
        first, second = sorted(
            (r.key for r in await log_store.l1_list()), key=lambda k: parse_l1_key(k).base_offset
        )
        objects.fail_deletes(first, times=1)
        assert await node.compactor.run_round() == 1
        states = {r.key: r.state for r in await log_store.l1_list()}
        assert (states[first], states[second]) == (L1State.DELETE_STARTED, L1State.DELETE_FINISHED)
        pending = node.l1.pending_deletes.get(first)
        assert pending is not None and pending.last_error.startswith("storage_error: deleting")
        wall.now += 3600
        assert await node.l1.retry_deletes() == 1
        assert {r.key: r.state for r in await log_store.l1_list()}[first] == L1State.DELETE_FINISHED
        assert await read_all(node) == [(1, b"a", b"2")]


class FailingGets(MemoryObjectStore):
    """GETs of the keys in `failing` fail, as a store's outage would."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[str] = set()

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        if key in self.failing:
            raise StorageError(f"injected: reading {key} failed")
        return await super().get(key, offset, length)


async def test_a_read_failing_mid_pass_fails_only_that_pass() -> None:
    log_store, objects, wall = MemoryLogStore(), FailingGets(), WallClock()
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, COMPACT)
        for value in (b"1", b"2", b"3"):
            await produce(node, [(b"a", value)], wall)
            assert await node.reconciler.run_round() == 1
        keys = sorted((r.key for r in await log_store.l1_list()), key=lambda k: parse_l1_key(k).base_offset)
        objects.failing = {keys[1]}  # the second object, read while the first is scanned
        assert await node.compactor.run_round() == 0
        status = node.compactor.partitions["c/0"]
        assert node.compactor.stats.errors == 1 and "injected: reading" in (status.not_compacted or "")
        assert {r.key for r in await log_store.l1_list()} == set(keys)  # nothing recorded
        objects.failing = set()
        assert await node.compactor.run_round() == 1
        assert await read_all(node) == [(2, b"a", b"3")]
