"""The GC's catalog rounds: objects this node uploaded (rows in `l0_objects`) are deleted without
listing; every `sweep_interval_s` (and the first round, and every dry run) a round lists the
prefixes instead, which is what finds strays (objects without a row). Same rule both ways: the
key's own epoch <= M, and old enough."""

from __future__ import annotations

import sqlite3

import anyio
import pytest
from test_gc_actor import (
    HookedStore,
    WallClock,
    board_of,
    epoch_of,
    l0_key,
    l0_keys,
    make_gc,
    node_config,
    node_gc,
    produce,
    put_l0,
    settle,
)

from levelzero.actors.gc import GcConfig
from levelzero.core.errors import InvalidInput, StorageError
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import FaultPlan, MemoryObjectStore
from levelzero.storage.protocols import L0ObjectRow
from levelzero.storage.sqlite import SqliteLogStore
from levelzero.testing.nodes import running_node

SWEEP_S = 600.0


async def test_catalog_rounds_delete_recorded_objects_without_listing_and_sweeps_find_strays() -> None:
    wall = WallClock()
    inner, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    store = HookedStore(inner)
    gc = make_gc(store, log_store, board_of({"t/0": 1}), clock=wall, sweep_interval_s=SWEEP_S)

    first = await gc.run_round()  # the first round always lists
    assert first.swept and first.list_requests > 0 and first.catalog_read == 0

    recorded = [l0_key(p, e, p * 10 + e) for p in (4, 600) for e in (1, 2, 3)]
    stray = l0_key(9, 1, 999)
    await put_l0(inner, log_store, recorded)
    await put_l0(inner, None, [stray])  # uploaded, but its row never landed
    board = board_of({"t/0": 2})
    gc._board = board  # the same actor, a higher M

    wall.now += 1
    report = await gc.run_round()
    assert not report.swept
    assert (report.list_requests, report.listed) == (0, 0)
    assert report.catalog_read == 4  # the rows with epoch <= 2
    assert (report.deleted, report.eligible, report.backlog, report.m) == (4, 4, 0, 2)
    assert sorted(l0_keys(inner)) == sorted([stray] + [k for k in recorded if epoch_of(k) == 3])
    assert store.delete_batches == [  # in the catalog's (epoch, key) order
        sorted((k for k in recorded if epoch_of(k) <= 2), key=lambda k: (epoch_of(k), k))
    ]
    marked = {row.key: row.deleted_at_m for row in log_store.l0_objects.values() if row.deleted_at}
    assert marked == {k: 2 for k in recorded if epoch_of(k) <= 2}

    wall.now += 1
    again = await gc.run_round()  # nothing recorded is left at or below M: no requests at all
    assert (again.catalog_read, again.delete_requests, again.list_requests) == (0, 0, 0)
    assert stray in l0_keys(inner)

    wall.now += SWEEP_S
    sweep = await gc.run_round()
    assert sweep.swept and sweep.list_requests > 0
    assert sweep.deleted == 1 and stray not in l0_keys(inner)
    stats = gc.statistics()
    assert (stats.sweeps, stats.totals.catalog_eligible, stats.totals.deleted) == (2, 4, 5)


async def test_dry_runs_always_list_and_delete_nothing() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    gc = make_gc(store, log_store, board_of({"t/0": 5}), clock=wall, sweep_interval_s=SWEEP_S)
    await gc.run_round()
    keys = [l0_key(1, e, e) for e in (1, 2, 9)]
    await put_l0(store, log_store, keys)
    report = await gc.run_round(dry_run=True)
    assert report.swept and report.list_requests > 0
    assert sorted(report.would_delete) == sorted(keys[:2]) and report.deleted == 0
    assert sorted(l0_keys(store)) == sorted(keys)
    assert not (await gc.run_round()).swept  # the sweep was the first round: now the catalog
    assert sorted(l0_keys(store)) == [keys[2]]


async def test_young_recorded_objects_wait_out_the_grace_period() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    gc = make_gc(store, log_store, board_of({"t/0": 5}), clock=wall, grace_s=30.0, sweep_interval_s=SWEEP_S)
    await gc.run_round()
    old, young = l0_key(1, 1, 1), l0_key(2, 1, 2)
    await put_l0(store, log_store, [old])
    wall.now += 100
    await put_l0(store, log_store, [young])
    wall.now += 10

    report = await gc.run_round()
    assert not report.swept
    assert (report.deleted, report.too_young, report.oldest_young_at) == (1, 1, wall.now - 10)
    assert l0_keys(store) == [young]

    wall.now += 20
    report = await gc.run_round()
    assert (report.deleted, report.too_young, report.swept) == (1, 0, False)
    assert l0_keys(store) == []


async def test_a_row_whose_epoch_disagrees_with_its_key_is_not_trusted() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    gc = make_gc(store, log_store, board_of({"t/0": 5}), clock=wall, sweep_interval_s=SWEEP_S)
    await gc.run_round()
    live = l0_key(1, 9, 1)  # epoch 9 > M = 5
    await store.put(live, b"x")
    await log_store.record_l0_object(L0ObjectRow(live, 1, 1, wall.now, 1))  # a row that lies

    report = await gc.run_round()

    assert (report.catalog_read, report.deleted, report.malformed) == (1, 0, 1)
    assert live in store.keys()
    assert "says epoch 1" in report.error_samples[0]


async def test_failed_catalog_deletes_stay_in_the_catalog_for_the_next_round() -> None:
    wall = WallClock()
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(clock=wall, faults=faults), MemoryLogStore()
    gc = make_gc(store, log_store, board_of({"t/0": 1}), clock=wall, sweep_interval_s=SWEEP_S)
    await gc.run_round()
    keys = [l0_key(1, 1, i) for i in range(10)]
    await put_l0(store, log_store, keys)
    faults.fail_deletes(keys[:3], "InternalError: We encountered an internal error", count=1)
    faults.fail_next("delete_many", StorageError("connection reset"))

    first = await gc.run_round()
    assert (first.deleted, first.delete_errors, first.backlog, first.swept) == (0, 10, 10, False)
    second = await gc.run_round()
    assert (second.deleted, second.delete_errors, second.backlog) == (7, 3, 3)
    third = await gc.run_round()
    assert (third.deleted, third.catalog_read, third.list_requests) == (3, 3, 0)
    assert l0_keys(store) == []


async def test_catalog_pages_of_one_batch_each_over_2500_objects() -> None:
    wall = WallClock()
    inner, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    store = HookedStore(inner)
    gc = make_gc(store, log_store, board_of({"t/0": 3}), clock=wall, sweep_interval_s=SWEEP_S)
    await gc.run_round()
    keys = [l0_key(i % 1000, 1 + i % 3, i) for i in range(2500)]
    await put_l0(inner, log_store, keys)

    report = await gc.run_round()

    assert (report.deleted, report.delete_requests, report.list_requests) == (2500, 3, 0)
    assert sorted(len(b) for b in store.delete_batches) == [500, 1000, 1000]
    assert l0_keys(inner) == []


async def test_a_sweep_whose_listing_failed_is_repeated_next_round() -> None:
    wall = WallClock()
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(clock=wall, faults=faults), MemoryLogStore()
    gc = make_gc(store, log_store, board_of({"t/0": 1}), clock=wall, sweep_interval_s=SWEEP_S)
    faults.fail_next("list", StorageError("connection reset"))
    first = await gc.run_round()
    assert first.swept and first.list_errors == 1
    wall.now += 1
    second = await gc.run_round()
    assert second.swept and second.list_errors == 0
    wall.now += 1
    assert not (await gc.run_round()).swept


def test_sweep_interval_must_not_be_negative() -> None:
    with pytest.raises(InvalidInput, match="sweep_interval_s must be >= 0"):
        GcConfig(sweep_interval_s=-1.0)
    with pytest.raises(InvalidInput, match="sweep_interval_s must be a finite number"):
        GcConfig(sweep_interval_s=float("nan"))


async def test_a_node_s_uploads_are_collected_from_its_catalog() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    async with running_node(node_config(), log_store, store, wall_clock=wall) as node:
        await node.create_topic("t", 2)
        actors = [node.partition("t", p) for p in range(2)]
        gc = node_gc(node, wall, sweep_interval_s=SWEEP_S)
        await produce(node, "t", 0, b"before")
        await settle(node, actors)
        assert (await gc.run_round()).swept  # the first round lists
        keys = [await produce(node, "t", p, b"v%d" % p) for p in range(2)]
        await settle(node, actors)
        # (A row is written once its object's placeholders are durable, after its producers
        # were answered: settled by now.)
        assert set(keys) <= set(log_store.l0_objects)
        report = await gc.run_round()
        assert not report.swept and report.list_requests == 0
        assert report.deleted >= len(set(keys))
        assert not set(keys) & set(store.keys())


# ------------------------------------------------------------------------------ the SQLite catalog


async def test_sqlite_catalog_reads_live_rows_in_epoch_key_order(tmp_path) -> None:
    keys = [l0_key(p, e, p * 10 + e) for p in (7, 3, 900) for e in (4, 1, 2)]
    async with await SqliteLogStore.open(tmp_path / "log.db") as log_store:
        for n, key in enumerate(keys):
            await log_store.record_l0_object(L0ObjectRow(key, epoch_of(key), n, 100.0 + n, 1))
        await log_store.mark_l0_deleted([l0_key(3, 1, 31)], at=200.0, m=1)

        rows = await log_store.l0_live_objects(2)
        expected = sorted(((epoch_of(k), k) for k in keys if epoch_of(k) <= 2 and k != l0_key(3, 1, 31)))
        assert [(r.epoch, r.key) for r in rows] == expected
        assert rows[0].size == keys.index(rows[0].key) and rows[0].created_at == 100.0 + rows[0].size

        page = await log_store.l0_live_objects(4, after=expected[1], limit=2)
        assert [(r.epoch, r.key) for r in page] == expected[2:4]
        assert await log_store.l0_live_objects(0) == []
        memory = MemoryLogStore()
        for key in keys:
            await memory.record_l0_object(L0ObjectRow(key, epoch_of(key), 0, 0.0, 1))
        await memory.mark_l0_deleted([l0_key(3, 1, 31)], at=200.0, m=1)
        assert [
            (r.epoch, r.key) for r in await memory.l0_live_objects(4, after=expected[1], limit=2)
        ] == expected[2:4]


async def test_a_file_made_before_the_catalog_index_gets_it_on_open(tmp_path) -> None:
    path = tmp_path / "log.db"
    async with await SqliteLogStore.open(path):
        pass
    with sqlite3.connect(path) as connection:
        connection.execute("DROP INDEX l0_objects_live")
        connection.execute("PRAGMA user_version = 1")  # files without the index are of schema 1
    async with await SqliteLogStore.open(path) as log_store:
        await log_store.record_l0_object(L0ObjectRow(l0_key(1, 1, 1), 1, 1, 1.0, 1))
        assert len(await log_store.l0_live_objects(1)) == 1
    with sqlite3.connect(path) as connection:
        plan = connection.execute(
            "EXPLAIN QUERY PLAN SELECT key FROM l0_objects WHERE deleted_at IS NULL AND epoch <= 3"
            " ORDER BY epoch, key"
        ).fetchall()
    assert any("l0_objects_live" in str(step) for step in plan), plan


class SlowMarks(MemoryLogStore):
    """A catalog whose marks wait until `release` is set; counts the marks waiting and records
    each mark's keys."""

    def __init__(self) -> None:
        super().__init__()
        self.release = anyio.Event()
        self.waiting = 0
        self.most_waiting = 0
        self.marks: list[int] = []  # keys per mark call

    async def mark_l0_deleted(self, keys, at, m) -> None:
        self.waiting += 1
        self.most_waiting = max(self.most_waiting, self.waiting)
        try:
            await self.release.wait()
            self.marks.append(len(keys))
            await super().mark_l0_deleted(keys, at, m)
        finally:
            self.waiting -= 1


async def test_deletes_go_on_while_a_mark_commits_and_the_next_mark_takes_every_key_gathered() -> None:
    wall = WallClock()
    inner, log_store = MemoryObjectStore(clock=wall), SlowMarks()
    store = HookedStore(inner)
    gc = make_gc(
        store,
        log_store,
        board_of({"t/0": 3}),
        clock=wall,
        sweep_interval_s=SWEEP_S,
        deletes_in_flight_max=2,
    )
    await gc.run_round()
    keys = [l0_key(i % 1000, 1 + i % 3, i) for i in range(7500)]  # eight batches
    await put_l0(inner, log_store, keys)

    reports = []

    async def round_() -> None:
        reports.append(await gc.run_round())

    async with anyio.create_task_group() as tg:
        tg.start_soon(round_)
        with anyio.fail_after(5):
            # The first mark (batch 1) waits; deletes go on: batches 2 and 3 fill the unmarked
            # keys' bound (2 x 1,000), batches 4 and 5 are deleted and wait for room.
            while len(store.delete_batches) < 5 or log_store.waiting < 1:
                await anyio.sleep(0.001)
        for _ in range(100):  # and no further
            await anyio.sleep(0)
        assert len(store.delete_batches) == 5
        assert log_store.waiting == 1  # one mark at a time
        assert not reports  # the round waits for its marks
        log_store.release.set()
    (report,) = reports
    assert (report.deleted, report.delete_requests) == (7500, 8)
    assert l0_keys(inner) == []
    assert await log_store.l0_live_objects(3) == []  # every deleted key is marked
    assert log_store.most_waiting == 1
    # The first batch alone, then every key gathered meanwhile in one mark: fewer marks than
    # deletes, each within the bound plus a batch.
    assert log_store.marks[:2] == [1000, 2000]
    assert sum(log_store.marks) == 7500
    assert len(log_store.marks) < 8
    assert max(log_store.marks) < 3000


async def test_a_mark_staged_before_a_record_in_one_batch_still_finds_its_row(tmp_path) -> None:
    """Marks are staged rows like the records they stamp. In one batch, a mark of a key
    recorded earlier in that batch must run after the insert, whichever statement the batch
    met first."""
    old, new = l0_key(1, 1, 1), l0_key(2, 1, 2)
    async with await SqliteLogStore.open(tmp_path / "log.db") as log_store:
        await log_store.record_l0_object(L0ObjectRow(old, 1, 1, 100.0, 1))
        commits = log_store.statistics().commits
        async with anyio.create_task_group() as tg:  # queued in this order, before any runs
            tg.start_soon(log_store.mark_l0_deleted, [old], 200.0, 1)
            tg.start_soon(log_store.record_l0_object, L0ObjectRow(new, 1, 1, 100.0, 1))
            tg.start_soon(log_store.mark_l0_deleted, [new], 200.0, 1)
        assert log_store.statistics().commits == commits + 1  # one batch
        assert await log_store.l0_live_objects(1) == []
    with sqlite3.connect(tmp_path / "log.db") as connection:
        marked = connection.execute(
            "SELECT key, deleted_at, deleted_at_m FROM l0_objects ORDER BY key"
        ).fetchall()
    assert marked == [(old, 200.0, 1), (new, 200.0, 1)]


class FailingMarks(MemoryLogStore):
    """Every mark fails (a failed commit of the log store)."""

    async def mark_l0_deleted(self, keys, at, m) -> None:
        await anyio.sleep(0)
        raise StorageError("log store: disk I/O error (test)")


async def test_a_failing_mark_fails_the_round_with_the_storage_error() -> None:
    wall = WallClock()
    inner, log_store = MemoryObjectStore(clock=wall), FailingMarks()
    gc = make_gc(
        inner,
        log_store,
        board_of({"t/0": 3}),
        clock=wall,
        sweep_interval_s=SWEEP_S,
        deletes_in_flight_max=2,
    )
    await gc.run_round()
    await put_l0(inner, log_store, [l0_key(i % 1000, 1, i) for i in range(2000)])

    with pytest.raises(StorageError, match="disk I/O error"):  # one error, not a group
        await gc.run_round()
    assert gc.statistics().failed_rounds == 1


class RowsLost(MemoryLogStore):
    """A log store whose catalog writes fail: the node stopped (or the write failed) after its
    objects' placeholders committed and before their rows did."""

    async def record_l0_object(self, row: L0ObjectRow) -> None:
        raise StorageError("injected: the catalog row never lands")


async def test_an_upload_whose_row_never_landed_is_a_stray_the_sweep_deletes() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), RowsLost()
    async with running_node(node_config(), log_store, store, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        actors = [node.partition("t", 0)]
        gc = node_gc(node, wall, sweep_interval_s=SWEEP_S)
        first = await produce(node, "t", 0, b"before")
        await settle(node, actors)
        assert (await gc.run_round()).swept  # the first round lists (and deletes `first`)
        assert first not in store.keys()
        key = await produce(node, "t", 0, b"v")  # acknowledged: its placeholder is durable
        await settle(node, actors)
        assert log_store.l0_objects == {} and key in store.keys()
        report = await gc.run_round()  # a catalog round: the object is no row of it
        assert not report.swept and report.deleted == 0 and key in store.keys()
        wall.now += SWEEP_S
        report = await gc.run_round()  # the sweep lists the prefixes and finds it
        assert report.swept and report.deleted == 1 and key not in store.keys()
