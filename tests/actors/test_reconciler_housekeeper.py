"""Reconciler, L1 lineage (zombie fencing), two-phase deletes, housekeeper and retention."""

from __future__ import annotations

import logging
from dataclasses import replace

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.gc import GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import NodeConfig
from levelzero.actors.reader import FETCH_RECORDS_MAX, PLACEHOLDERS_PER_READ
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.entries import Placeholder
from levelzero.core.errors import InvalidInput, OffsetOutOfRange
from levelzero.core.gc import compute_cluster_watermark
from levelzero.core.keys import L0_ROOT, L1_ROOT
from levelzero.core.l0format import Record
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import L1Row, L1State
from levelzero.testing.nodes import hand_run_config, running_node
from levelzero.testing.virtual_time import in_virtual_time


class WallClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def produce_values(node, topic, partition, values):
    offsets = []
    for v in values:
        r = await node.produce(topic, partition, [Record(None, v)])
        offsets.append(r.base_offset)
    return offsets


async def read_all(node, topic, partition, start=0):
    out, tiers = [], set()
    offset = start
    actor = node.partition(topic, partition)
    while offset < actor.state.high_watermark:
        result = await node.fetch(topic, partition, offset, 1 << 20)
        tiers.add(result.tier)
        out.extend(r.value for r in result.records)
        offset = result.next_offset
    return out, tiers


def l1_keys(store: MemoryObjectStore) -> set[str]:
    return {k for k in store._objects if k.startswith(L1_ROOT)}


@in_virtual_time
async def test_reads_below_lro_come_from_l1_and_above_from_l0_with_identical_bytes():
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        first = [f"a{i}".encode() * (i + 1) for i in range(12)]
        await produce_values(node, "t", 0, first)
        assert await node.reconciler.run_round() == 1
        actor = node.partition("t", 0)
        assert actor.state.lro == 11
        second = [f"b{i}".encode() for i in range(5)]
        await produce_values(node, "t", 0, second)

        below = await node.fetch("t", 0, 3, sum(map(len, first[3:])))  # L1's records just fit
        assert below.tier == "l1"
        assert [r.value for r in below.records] == first[3:]
        assert [r.offset for r in below.records] == list(range(3, 12))
        across = await node.fetch("t", 0, 3, 1 << 20)  # the budget goes on into L0
        assert across.tier == "l1+l0"
        assert [r.value for r in across.records] == first[3:] + second
        assert [r.offset for r in across.records] == list(range(3, 17))
        above = await node.fetch("t", 0, 12, 1 << 20)
        assert above.tier == "l0"
        assert [r.value for r in above.records] == second
        assert len(l1_keys(objects)) == 1


@in_virtual_time
async def test_mp_rises_after_catch_up_but_never_reaches_an_unreconciled_epoch():
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        actor = node.partition("t", 0)
        history = []
        for round_ in range(6):
            await produce_values(node, "t", 0, [f"r{round_}-{i}".encode() for i in range(3)])
            await node.epochs.advance()
            await node.reconciler.run_round()
            await produce_values(node, "t", 0, [f"tail{round_}".encode()])  # left unreconciled
            mp = actor.state.mp
            history.append(mp)
            unreconciled = [
                r.entry.epoch
                for r in await log_store.read_placeholders(actor.row.pid, actor.state.lro + 1, 1000)
            ]
            assert unreconciled and all(e > mp for e in unreconciled)
        assert history == sorted(history)
        assert history[-1] > history[0]


@pytest.mark.parametrize("zombie_reports_first", [False, True])
@in_virtual_time
async def test_zombie_reconciler_claim_is_rejected_in_either_arrival_order(zombie_reports_first):
    """Seed 004: the old leader uploads and reports late; its claim never enters the lineage
    and its object is deleted, whatever the order."""
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    gate = anyio.Event()
    uploaded = anyio.Event()

    class GatedStore(MemoryObjectStore):
        async def put(self, key, data):
            await super().put(key, data)
            if key.startswith(L1_ROOT) and not gate.is_set():
                uploaded.set()
                await gate.wait()

    gated = GatedStore()
    gated._objects = objects._objects  # one bucket, two clients

    async with running_node(hand_run_config(), log_store, gated) as old:
        await old.create_topic("t", 1)
        await produce_values(old, "t", 0, [b"x0", b"x1", b"x2"])
        gate.set()
        assert await old.reconciler.run_round() == 1  # term 1 reconciled 0..2
        gate = anyio.Event()
        uploaded = anyio.Event()
        await produce_values(old, "t", 0, [b"y3", b"y4"])
        old_actor = old.partition("t", 0)
        zombie_result = {}

        async def zombie():
            zombie_result["ok"] = await old.reconciler.reconcile_partition(old_actor)

        async with anyio.create_task_group() as tg:
            tg.start_soon(zombie)
            await uploaded.wait()  # the old leader's L1 object for 3..4 is uploaded, not reported
            async with running_node(hand_run_config(), log_store, objects) as new:  # new leader: term 2
                new_actor = new.partition("t", 0)
                assert new_actor.term > old_actor.term
                if zombie_reports_first:
                    gate.set()
                    await tg_wait(zombie_result)
                await produce_values(new, "t", 0, [b"z5"])
                assert await new.reconciler.run_round() == 1  # term 2 reconciles 3..5
                if not zombie_reports_first:
                    gate.set()
                    await tg_wait(zombie_result)
                assert zombie_result["ok"] is False
                assert old.reconciler.stats.catch_ups_rejected == 1
                # The lineage holds term 1 -> 2 and term 2 -> 5; the zombie's object is gone.
                assert new_actor.state.reconciled_by_term == {1: 2, 2: 5}
                await new.housekeeper.run_round()
                await new.l1.collect(new_actor, copy_deadline_s=60.0)
                rows = await log_store.l1_list(new_actor.row.pid)
                by_state = {}
                for row in rows:
                    by_state.setdefault(row.state, []).append((row.term, row.base_offset, row.last_offset))
                assert sorted(by_state[L1State.COPY_FINISHED]) == [(1, 0, 2), (2, 3, 5)]
                assert by_state[L1State.DELETE_FINISHED] == [(1, 3, 4)]
                assert len(l1_keys(objects)) == 2
                values, tiers = await read_all(new, "t", 0)
                assert values == [b"x0", b"x1", b"x2", b"y3", b"y4", b"z5"]
                assert tiers == {"l1"}


async def tg_wait(result: dict) -> None:
    with anyio.fail_after(5):
        while "ok" not in result:
            await anyio.sleep(0)


@in_virtual_time
async def test_a_zombie_cannot_delete_an_object_of_a_newer_term():
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects) as old:
        await old.create_topic("t", 1)
        old_actor = old.partition("t", 0)
        async with running_node(hand_run_config(), log_store, objects) as new:
            await produce_values(new, "t", 0, [b"a", b"b"])
            await new.reconciler.run_round()
            (row,) = await log_store.l1_list(new.partition("t", 0).row.pid)
            assert await old.l1.delete(old_actor, row, reason="zombie") is False
            assert old.l1.delete_refusals == 1
            assert row.key in objects._objects


@in_virtual_time
async def test_restart_resumes_an_unfinished_delete_and_collects_a_stale_copy():
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        pid = node.partition("t", 0).row.pid
        # Crash between DELETE_STARTED and the object-store delete:
        doomed = "level_one/t/0/00000000000000000100-00000000000000000101/1-" + "a" * 32
        await objects.put(doomed, b"old")
        await log_store.l1_insert(
            L1Row(doomed, pid, 100, 101, 5, 1, 3, L1State.DELETE_STARTED, wall.now, wall.now)
        )
        # Crash between the upload and COPY_FINISHED:
        stale = "level_one/t/0/00000000000000000000-00000000000000000001/1-" + "b" * 32
        await objects.put(stale, b"half")
        await log_store.l1_insert(L1Row(stale, pid, 0, 1, 2, 1, 4, L1State.COPY_STARTED, wall.now, wall.now))
    wall.now += 3600  # past copy_deadline_s
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.reconciler.run_round()  # its first pass per partition is recovery
        states = {r.key: r.state for r in await log_store.l1_list(pid)}
        assert states == {doomed: L1State.DELETE_FINISHED, stale: L1State.DELETE_FINISHED}
        assert doomed not in objects._objects and stale not in objects._objects


@in_virtual_time
async def test_a_delete_abandoned_while_the_node_runs_is_finished_once_past_the_copy_deadline():
    """DELETE_STARTED rows that appear after the term's start-up collection, their deleter gone
    (three-node seed 8695: a compaction's superseded object whose delete failed as its node
    stopped; its retry lived in that node's memory): the running reconciler's check of
    unfinished work finishes them once older than the copy deadline, not before; one this node
    is retrying keeps its own schedule."""
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        actor = node.partition("t", 0)
        pid = actor.row.pid
        await node.reconciler.run_round()  # the term's start-up collection: nothing yet

        async def delete_started(base: int, fill: str) -> str:
            key = f"level_one/t/0/{base:020d}-{base + 1:020d}/1-" + fill * 32
            await objects.put(key, b"old")
            await log_store.l1_insert(
                L1Row(key, pid, base, base + 1, 5, 1, 3, L1State.DELETE_STARTED, wall.now, wall.now)
            )
            return key

        async def states() -> dict[str, str]:
            return {r.key: r.state for r in await log_store.l1_list(pid)}

        abandoned = await delete_started(0, "a")
        retried = await delete_started(2, "b")
        node.l1.pending_deletes.note_failure(retried, actor.name, "InternalError: injected", wall.now)
        wall.now += 30  # within the 60 s deadline: its deleter may still be on its way
        assert await node.l1.collect_abandoned(actor, 60.0) == 0
        wall.now += 60
        assert await node.l1.collect_abandoned(actor, 60.0) == 1
        assert await states() == {abandoned: L1State.DELETE_FINISHED, retried: L1State.DELETE_STARTED}
        assert abandoned not in objects._objects and retried in objects._objects

        # The round runs the check (a quarter deadline after the last) and the due retries.
        later = await delete_started(4, "c")
        await node.reconciler.run_round()
        assert (await states())[later] == L1State.DELETE_STARTED  # not yet past the deadline
        wall.now += 90
        await node.reconciler.run_round()
        assert set((await states()).values()) == {L1State.DELETE_FINISHED}
        assert not l1_keys(objects)


@in_virtual_time
async def test_an_idle_partition_does_not_hold_m_back():
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects) as node:
        await node.create_topic("busy", 1)
        await node.create_topic("idle", 1)
        ms = []
        for i in range(5):
            await produce_values(node, "busy", 0, [f"v{i}".encode()])
            await node.epochs.advance()
            await node.reconciler.run_round()
            await node.housekeeper.run_round()
            decision = compute_cluster_watermark(node.epochs.current, node.board.snapshot())
            ms.append(decision.m)
        assert None not in ms
        assert ms == sorted(ms) and ms[-1] >= ms[0] + 3
        idle = node.partition("idle", 0)
        assert idle.state.high_watermark == 0 and idle.state.mp == ms[-1]


async def two_objects_a_retention_apart(node, wall, objects) -> str:
    """t/0 (created): offsets 0-1 reconciled into one L1 object, then, 500 s of wall clock
    later (past a 100 s retention), 2-3 into another; the first object's key."""
    await node.create_topic("t", 1)
    await produce_values(node, "t", 0, [b"old0", b"old1"])
    await node.reconciler.run_round()
    (old,) = l1_keys(objects)
    wall.now += 500
    await produce_values(node, "t", 0, [b"new2", b"new3"])
    await node.reconciler.run_round()
    return old


@in_virtual_time
async def test_retention_deletes_old_l1_objects_and_reads_below_start_are_refused(caplog):
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = hand_run_config(retention_s=100.0)
    async with running_node(config, log_store, objects, wall_clock=wall) as node:
        old = await two_objects_a_retention_apart(node, wall, objects)
        assert len(l1_keys(objects)) == 2
        with caplog.at_level(logging.INFO, logger="levelzero.l1"):
            await node.housekeeper.run_round()
        assert f"deleted L1 object {old} (below the start offset (moved by retention))" in [
            r.getMessage() for r in caplog.records
        ]
        actor = node.partition("t", 0)
        assert actor.state.start_offset == 2
        assert len(l1_keys(objects)) == 1
        with pytest.raises(OffsetOutOfRange) as err:
            await node.fetch("t", 0, 0, 1 << 20)
        assert "outside the readable range [2, 4)" in str(err.value)
        values, _ = await read_all(node, "t", 0, start=2)
        assert values == [b"new2", b"new3"]


@in_virtual_time
async def test_a_fetch_retention_overtakes_is_out_of_range_not_a_missing_object():
    """Retention moves the start offset and deletes the L1 object a fetch is reading: the fetch
    answers OffsetOutOfRange with the new start (as Kafka answers below the start offset; a
    Kafka client then resets its position), not the object's absence (KAFKA_STORAGE_ERROR).
    Found by the simulation's read_committed scans (single-node seeds 3312, 16966)."""
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = hand_run_config(retention_s=100.0)
    async with running_node(config, log_store, objects, wall_clock=wall) as node:
        old = await two_objects_a_retention_apart(node, wall, objects)
        get = objects.get
        overtaken = []

        async def get_after_retention(key, *args, **kwargs):
            if key == old and not overtaken:
                overtaken.append(key)
                await node.housekeeper.run_round()  # retention, while the GET is on its way
            return await get(key, *args, **kwargs)

        objects.get = get_after_retention  # type: ignore[method-assign]
        with pytest.raises(OffsetOutOfRange) as err:
            await node.fetch("t", 0, 0, 1 << 20)
        assert overtaken == [old] and old not in l1_keys(objects)
        assert (err.value.offset, err.value.start_offset, err.value.high_watermark) == (0, 2, 4)
        values, _ = await read_all(node, "t", 0, start=2)
        assert values == [b"new2", b"new3"]


@in_virtual_time
async def test_retention_collects_a_late_copy_below_the_start_offset_with_no_object_left_in_the_lineage():
    """Three-node simulation seed 8852: retention deleted the partition's only valid object; a
    copy of the same range finished later (a reconciler of an earlier term, late). The
    housekeeper skipped a partition with no valid object, so that copy stayed until a restart.
    Now it is collected at the next round, and a round reads the partition's rows once (a
    listing and the compacted keys: six reads before)."""
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = hand_run_config(retention_s=100.0)
    async with running_node(config, log_store, objects, wall_clock=wall) as node:
        await node.create_topic("t", 1)  # term 1, which reconciles nothing
    async with running_node(config, log_store, objects, wall_clock=wall) as node:
        await produce_values(node, "t", 0, [b"old0", b"old1"])
        await node.reconciler.run_round()  # term 2's object of 0..1
        wall.now += 500
        await node.housekeeper.run_round()
        actor = node.partition("t", 0)
        assert actor.term == 2 and actor.state.start_offset == 2 and l1_keys(objects) == set()
        # Term 1's copy of 0..1, finished late: outside the lineage, and below the start.
        late = "level_one/t/0/00000000000000000000-00000000000000000001/1-" + "c" * 32
        await objects.put(late, b"late")
        pid = actor.row.pid
        await log_store.l1_insert(L1Row(late, pid, 0, 1, 4, 1, 2, L1State.COPY_FINISHED, wall.now, wall.now))
        reads = []
        listed, compacted = log_store.l1_list, log_store.l1_compaction_state

        async def l1_list(*args, **kwargs):
            reads.append("l1_list")
            return await listed(*args, **kwargs)

        async def l1_compaction_state(*args, **kwargs):
            reads.append("l1_compaction_state")
            return await compacted(*args, **kwargs)

        log_store.l1_list, log_store.l1_compaction_state = l1_list, l1_compaction_state
        await node.housekeeper.run_round()
        assert reads == ["l1_list", "l1_compaction_state"]
        assert {r.key: r.state for r in await listed(pid)}[late] == L1State.DELETE_FINISHED
        assert late not in objects._objects


@in_virtual_time
async def test_retention_is_per_topic_and_a_topic_can_turn_the_nodes_off():
    """A topic's retention.ms applies to it alone; with the node's retention set, a topic with
    retention.ms = -1 keeps everything (Kafka: the topic config overrides log.retention.ms)."""
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(retention_s=1000.0), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("short", 1, {"retention.ms": "100000"})
        await node.create_topic("kept", 1, {"retention.ms": "-1"})
        await node.create_topic("node", 1)
        for topic in ("short", "kept", "node"):
            await produce_values(node, topic, 0, [b"old0", b"old1"])
        await node.reconciler.run_round()
        wall.now += 500
        for topic in ("short", "kept", "node"):
            await produce_values(node, topic, 0, [b"new2"])
        await node.reconciler.run_round()
        await node.housekeeper.run_round()
        starts = {t: node.partition(t, 0).state.start_offset for t in ("short", "kept", "node")}
        assert starts == {"short": 2, "kept": 0, "node": 0}
        await node.topic_configs.replace("node", [("retention.ms", "400000")])
        assert await log_store.topic_configs("node") == {"node": {"retention.ms": "400000"}}
        await node.housekeeper.run_round()
        assert node.partition("node", 0).state.start_offset == 2
        assert node.partition("kept", 0).state.start_offset == 0


@in_virtual_time
async def test_placeholders_carry_object_epochs_at_or_above_creation_epoch():
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects) as node:
        for _ in range(3):
            await node.epochs.advance()
        await node.create_topic("late", 1)
        actor = node.partition("late", 0)
        assert actor.row.creation_epoch == 4
        await produce_values(node, "late", 0, [b"v"])
        (record,) = await log_store.read_placeholders(actor.row.pid, 0, 10)
        assert isinstance(record.entry, Placeholder) and record.entry.epoch >= 4


@in_virtual_time
async def test_after_the_workload_stops_every_l0_object_is_collected_and_data_stays_readable():
    """Liveness end to end: orphans from stale-epoch rejections and reconciled objects alike are
    deleted once the reconciler, housekeeper and GC catch up; every acknowledged record stays
    readable (now from L1)."""

    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=3600.0,  # a stale cache on purpose: rejections make orphans
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False, object_age_max_s=0.0),
        housekeeper=HousekeeperConfig(enabled=False, idle_after_s=0.0),
        gc=GcConfig(enabled=False, grace_s=0.0),
    )
    async with running_node(config, log_store, objects) as node:
        await node.create_topic("t", 3)
        expected = {p: [] for p in range(3)}
        for step in range(12):
            for p in range(3):
                value = f"p{p}-s{step}".encode()
                result = await node.produce("t", p, [Record(None, value)])
                assert result.base_offset == len(expected[p])
                expected[p].append(value)
            if step % 4 == 3:
                await node.epochs.advance()  # the cache stays behind until a rejection
                await node.reconciler.run_round()
                await node.housekeeper.run_round(force=True)
        assert node.batcher.stats.stale_rejections > 0  # orphans exist
        l0_before = [k for k in objects._objects if k.startswith(L0_ROOT)]
        assert len(l0_before) > node.batcher.stats.stale_rejections
        rounds = 0
        while any(k.startswith(L0_ROOT) for k in objects._objects):
            rounds += 1
            assert rounds <= 10, "L0 objects leaked"
            await node.epochs.advance()
            await node.reconciler.run_round()
            await node.housekeeper.run_round(force=True)
            report = await node.gc.run_round()
            assert report.delete_errors == 0 and report.list_errors == 0
        for p in range(3):
            values, tiers = await read_all(node, "t", p)
            assert values == expected[p]
            assert tiers == {"l1"}
        deleted = [r for r in log_store.l0_objects.values() if r.deleted_at is not None]
        assert len(deleted) == len(log_store.l0_objects) == len(l0_before)
        assert rounds >= 1


@in_virtual_time
async def test_a_copy_collected_as_stale_during_a_slow_upload_is_abandoned_not_reported():
    """The stale-copy deadline fired while the upload hung: the late upload must neither advance
    LRO over a deleted object nor leave the object behind."""
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    gate, uploading = anyio.Event(), anyio.Event()

    class SlowL1Store(MemoryObjectStore):
        async def put(self, key, data):
            if key.startswith(L1_ROOT) and not gate.is_set():
                uploading.set()
                await gate.wait()
            await super().put(key, data)

    slow = SlowL1Store()
    slow._objects = objects._objects
    async with running_node(hand_run_config(), log_store, slow, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        actor = node.partition("t", 0)
        await produce_values(node, "t", 0, [b"a", b"b"])
        outcome = {}

        async def reconcile():
            outcome["ok"] = await node.reconciler.reconcile_partition(actor)

        async with anyio.create_task_group() as tg:
            tg.start_soon(reconcile)
            await uploading.wait()
            wall.now += 3600
            await node.l1.collect(actor, copy_deadline_s=60.0)
            gate.set()
        assert outcome["ok"] is False
        assert actor.state.lro == -1
        assert l1_keys(objects) == set()
        (row,) = await log_store.l1_list(actor.row.pid)
        assert row.state == L1State.DELETE_FINISHED
        assert await node.reconciler.run_round() == 1  # the next attempt reconciles for real
        assert actor.state.lro == 1 and len(l1_keys(objects)) == 1


@in_virtual_time
async def test_l1_and_l0_fetches_share_one_record_bound():
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        count = FETCH_RECORDS_MAX + 5
        await node.produce("t", 0, [Record(None, b"x")] * count)
        from_l0 = await node.fetch("t", 0, 0, 1 << 24)
        await node.reconciler.run_round()
        from_l1 = await node.fetch("t", 0, 0, 1 << 24)
        assert (from_l0.tier, from_l1.tier) == ("l0", "l1")
        assert len(from_l0.records) == len(from_l1.records) == FETCH_RECORDS_MAX
        assert from_l1.next_offset == FETCH_RECORDS_MAX
        rest = await node.fetch("t", 0, from_l1.next_offset, 1 << 24)
        assert [r.offset for r in rest.records] == list(range(FETCH_RECORDS_MAX, count))


@in_virtual_time
async def test_l1_keys_take_their_randomness_from_the_injected_rng():
    """A seeded node writes the same L1 keys every time (a simulation's failing seed must
    replay its object keys too), and they come from the rng, not from an unseeded uuid4."""

    async def l1_keys_of_one_run() -> list[str]:
        objects = MemoryObjectStore()
        async with running_node(hand_run_config(), MemoryLogStore(), objects) as node:
            await node.create_topic("t", 2)
            for partition in (0, 1):
                await produce_values(node, "t", partition, [b"x" * 10, b"y" * 20])
                await node.reconciler.reconcile_partition(node.partition("t", partition))
        return sorted(l1_keys(objects))

    first, second = await l1_keys_of_one_run(), await l1_keys_of_one_run()
    assert len(first) == 2
    assert first == second


@in_virtual_time
async def test_a_copy_abandoned_by_a_crash_is_collected_while_running_once_past_the_deadline():
    """A copy killed mid-reconcile stays COPY_STARTED; the running reconciler collects it once
    it is older than `copy_deadline_s` (60 s here) — at most a quarter deadline late — without
    waiting for a restart."""
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        pid = node.partition("t", 0).row.pid
        await node.reconciler.run_round()  # the start-up recovery pass is behind us
        abandoned = "level_one/t/0/00000000000000000000-00000000000000000001/1-" + "c" * 32
        await objects.put(abandoned, b"half")
        await log_store.l1_insert(
            L1Row(abandoned, pid, 0, 1, 2, 1, 4, L1State.COPY_STARTED, wall.now, wall.now)
        )
        wall.now += 59.0  # younger than the deadline: its copy may still be under way
        await node.reconciler.run_round()
        assert {r.key: r.state for r in await log_store.l1_list(pid)} == {abandoned: L1State.COPY_STARTED}
        wall.now += 2.0  # past the deadline, but checked 2 s ago: a check is due every 15 s
        await node.reconciler.run_round()
        assert {r.key: r.state for r in await log_store.l1_list(pid)} == {abandoned: L1State.COPY_STARTED}
        wall.now += 13.0
        await node.reconciler.run_round()
        assert {r.key: r.state for r in await log_store.l1_list(pid)} == {abandoned: L1State.DELETE_FINISHED}
        assert abandoned not in objects._objects


@in_virtual_time
async def test_a_fetch_fills_its_budget_across_l1_objects_and_on_into_l0():
    """10 single-record produces reconciled into L1 objects of 2 records each, 3 more left in
    L0: one fetch returns all 13 (it returned the 2 of one object). The budget's boundary
    (key and value bytes) falls inside an object, and across the tiers."""

    config = hand_run_config()
    config = replace(config, reconciler=replace(config.reconciler, placeholders_per_object_max=2))
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(config, log_store, objects) as node:
        await node.create_topic("t", 1)
        values = [b"%09d!" % i for i in range(13)]  # 10 bytes each
        await produce_values(node, "t", 0, values[:10])
        assert await node.reconciler.run_round() == 5
        assert len(l1_keys(objects)) == 5
        await produce_values(node, "t", 0, values[10:])
        actor = node.partition("t", 0)
        assert (actor.state.lro, actor.state.high_watermark) == (9, 13)

        l1_only = await node.fetch("t", 0, 0, 100)  # exactly the 10 reconciled records
        assert ([r.value for r in l1_only.records], l1_only.next_offset, l1_only.tier) == (
            values[:10],
            10,
            "l1",
        )
        everything = await node.fetch("t", 0, 0, 1 << 20)
        assert [r.offset for r in everything.records] == list(range(13))
        assert [r.value for r in everything.records] == values
        assert (everything.next_offset, everything.tier) == (13, "l1+l0")
        # The boundary: 50 bytes is 5 records (the third object cut after its first), 49 is 4.
        at = await node.fetch("t", 0, 0, 50)
        assert ([r.offset for r in at.records], at.next_offset) == ([0, 1, 2, 3, 4], 5)
        below = await node.fetch("t", 0, 0, 49)
        assert ([r.offset for r in below.records], below.next_offset) == ([0, 1, 2, 3], 4)
        across = await node.fetch("t", 0, 7, 40)  # 7..9 from L1, 10 from L0
        assert ([r.value for r in across.records], across.next_offset, across.tier) == (
            values[7:11],
            11,
            "l1+l0",
        )
        from_l0 = await node.fetch("t", 0, 11, 1 << 20)
        assert ([r.value for r in from_l0.records], from_l0.tier) == (values[11:], "l0")


@in_virtual_time
async def test_an_l0_fetch_reads_past_one_page_of_placeholders():
    """More single-record extents than one read of placeholders (64): the fetch goes on to the
    next page while its budget lasts."""

    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects) as node:
        await node.create_topic("t", 1)
        count = PLACEHOLDERS_PER_READ * 2 + 3
        values = [b"v%d" % i for i in range(count)]
        await produce_values(node, "t", 0, values)
        result = await node.fetch("t", 0, 0, 1 << 20)
        assert ([r.value for r in result.records], result.next_offset, result.tier) == (values, count, "l0")
        budget = sum(map(len, values[: PLACEHOLDERS_PER_READ + 1]))
        cut = await node.fetch("t", 0, 0, budget)
        assert cut.next_offset == PLACEHOLDERS_PER_READ + 1


@in_virtual_time
async def test_a_failed_clean_up_delete_is_retried_with_backoff_while_running():
    """An abandoned copy whose clean-up delete fails 3 times: it stays DELETE_STARTED with its
    object in the bucket only until its retries (1, 2, 4 s apart) get through, in the running
    node, not until a restart; the pending count shows it meanwhile."""

    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = hand_run_config()
    config = replace(
        config, reconciler=replace(config.reconciler, delete_retry_first_s=1.0, delete_retry_max_s=300.0)
    )
    async with running_node(config, log_store, objects, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        pid = node.partition("t", 0).row.pid
        await node.reconciler.run_round()  # the start-up recovery pass is behind us
        abandoned = "level_one/t/0/00000000000000000000-00000000000000000001/1-" + "d" * 32
        await objects.put(abandoned, b"half")
        await log_store.l1_insert(
            L1Row(abandoned, pid, 0, 1, 2, 1, 4, L1State.COPY_STARTED, wall.now, wall.now)
        )
        objects.faults.fail_deletes([abandoned], "SlowDown", count=3)

        async def state() -> tuple[str, bool, int, int]:
            (row,) = await log_store.l1_list(pid)
            pending = node.l1.pending_deletes
            failures = pending.get(abandoned).failures if len(pending) else 0
            return row.state, abandoned in objects._objects, len(pending), failures

        wall.now += 61.0  # past the copy deadline: the clean-up starts, and its delete fails
        await node.reconciler.run_round()
        assert await state() == (L1State.DELETE_STARTED, True, 1, 1)
        assert node.l1.pending_deletes.get(abandoned).last_error.startswith("storage_error: ")
        await node.reconciler.run_round()  # not due yet: no try
        assert await state() == (L1State.DELETE_STARTED, True, 1, 1)
        wall.now += 1.0
        await node.reconciler.run_round()
        assert await state() == (L1State.DELETE_STARTED, True, 1, 2)
        wall.now += 1.0  # the next try is 2 s after the last
        await node.reconciler.run_round()
        assert await state() == (L1State.DELETE_STARTED, True, 1, 2)
        wall.now += 1.0
        await node.reconciler.run_round()
        assert await state() == (L1State.DELETE_STARTED, True, 1, 3)
        wall.now += 4.0
        await node.reconciler.run_round()
        assert await state() == (L1State.DELETE_FINISHED, False, 0, 0)
        assert (node.l1.delete_failures, node.l1.delete_retries, node.l1.deleted) == (3, 3, 1)


# ------------------------------------------------------------------ L1 objects grow to a bound


def growing_config(bytes_min: int, age_max_s: float) -> NodeConfig:
    config = hand_run_config()
    return replace(
        config,
        reconciler=replace(config.reconciler, object_bytes_min=bytes_min, object_age_max_s=age_max_s),
    )


@in_virtual_time
async def test_reconciler_waits_until_the_age_bound_then_writes_one_object():
    """Ten single-record produces become one L1 object of ten records, written once the data
    waited `object_age_max_s` (from the pass that first saw it), not one per pass."""
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = growing_config(bytes_min=1 << 20, age_max_s=30.0)
    async with running_node(config, log_store, objects, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        actor = node.partition("t", 0)
        values = []
        for i in range(10):
            values += [f"v{i}".encode()]
            await produce_values(node, "t", 0, values[-1:])
            assert await node.reconciler.run_round() == 0
            wall.now += 2.9  # 29 s in all: one step short of the bound
        assert actor.state.lro == -1 and not l1_keys(objects)
        assert actor.state.mp is None or actor.state.mp < node.epochs.current
        wall.now += 1.0
        assert await node.reconciler.run_round() == 1
        assert actor.state.lro == 9
        (row,) = await log_store.l1_list(actor.row.pid)
        assert (row.base_offset, row.last_offset) == (0, 9)
        got, tiers = await read_all(node, "t", 0)
        assert got == values and tiers == {"l1"}
        # Nothing waiting: the next data starts a new wait.
        await produce_values(node, "t", 0, [b"next"])
        assert await node.reconciler.run_round() == 0
        wall.now += 30.0
        assert await node.reconciler.run_round() == 1


@in_virtual_time
async def test_reconciler_writes_as_soon_as_the_size_bound_is_reached():
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = growing_config(bytes_min=4096, age_max_s=3600.0)
    async with running_node(config, log_store, objects, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        actor = node.partition("t", 0)
        await produce_values(node, "t", 0, [b"a" * 1000])
        assert await node.reconciler.run_round() == 0  # first seen: 1,000 bytes wait
        for i in range(3):
            await produce_values(node, "t", 0, [bytes([65 + i]) * 1000])
            assert await node.reconciler.run_round() == 0
        assert actor.state.lro == -1
        await produce_values(node, "t", 0, [b"z" * 1200])  # 4,200+ bytes appended since first seen
        assert await node.reconciler.run_round() == 1
        assert actor.state.lro == 4
        assert len(l1_keys(objects)) == 1


@in_virtual_time
async def test_a_crash_with_data_waiting_for_its_l1_object_loses_nothing():
    """The node dies while its partition's data waits for the bound: the L0 object stays (M(p)
    has not passed it, so the GC keeps it), the next node reads it from L0, waits again, and
    reconciles it; every record is read back from L1."""
    wall = WallClock()
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = growing_config(bytes_min=1 << 20, age_max_s=30.0)
    config = replace(config, gc=GcConfig(enabled=False, grace_s=0.0))
    values = [f"w{i}".encode() for i in range(6)]
    async with running_node(config, log_store, objects, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        await produce_values(node, "t", 0, values)
        assert await node.reconciler.run_round() == 0
        wall.now += 20.0
        await node.epochs.advance()
        await node.housekeeper.run_round(force=True)
        report = await node.gc.run_round()
        assert report.deleted == 0
        l0 = {k for k in objects._objects if k.startswith(L0_ROOT)}
        assert l0
        # The crash: the node stops without reconciling (shutdown does not reconcile).
    async with running_node(config, log_store, objects, wall_clock=wall) as node:
        assert l0 <= set(objects._objects)
        got, tiers = await read_all(node, "t", 0)
        assert got == values and tiers == {"l0"}
        await node.epochs.advance()
        await node.housekeeper.run_round(force=True)
        assert (await node.gc.run_round()).deleted == 0  # still unreconciled: still kept
        assert l0 <= set(objects._objects)
        assert await node.reconciler.run_round() == 0  # the wait starts again on this node
        wall.now += 30.0
        assert await node.reconciler.run_round() == 1
        got, tiers = await read_all(node, "t", 0)
        assert got == values and tiers == {"l1"}
        for _ in range(3):  # M(p) passes the objects once the reconciled log passes the window
            await node.epochs.advance()
            await node.housekeeper.run_round(force=True)
            await node.reconciler.run_round()
            await node.gc.run_round()
        assert not l0 & set(objects._objects)


def test_reconciler_bounds_are_checked():
    with pytest.raises(InvalidInput, match="object_bytes_min must be in 0..object_bytes_max"):
        ReconcilerConfig(object_bytes_min=9 * 1024 * 1024)
    with pytest.raises(InvalidInput, match="object_age_max_s must be in 0..3600"):
        ReconcilerConfig(object_age_max_s=-1.0)


class CountingLogStore(MemoryLogStore):
    """Counts the log-store calls that append (each one commit on a durable store)."""

    def __init__(self) -> None:
        super().__init__()
        self.append_calls = 0

    async def append_many(self, appends, on_durable=None):
        self.append_calls += 1
        return await super().append_many(appends, on_durable)


@in_virtual_time
async def test_a_housekeeper_round_over_many_new_partitions_shares_commits():
    """A round over 256 new partitions (no M(p) yet) appends an AdvanceEpoch and a catch-up to
    each; tended together, their appends meet in the node's appender: a few commits, not one
    or two per partition that every producer's placeholder would queue behind."""
    log_store, objects = CountingLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, objects) as node:
        await node.create_topic("many", 256)
        assert all(node.partition("many", p).state.mp is None for p in range(256))
        before = log_store.append_calls
        await node.housekeeper.run_round()
        assert node.housekeeper.stats.epochs_advanced == 256
        assert node.housekeeper.stats.catch_ups == 256
        assert {node.partition("many", p).state.mp for p in range(256)} == {node.epochs.current - 1}
        assert log_store.append_calls - before <= 32, log_store.append_calls - before  # was 512
