"""The GC actor against the memory stores: what a round deletes and keeps, the safety argument
under attack (lower-edge writes, partitions created mid-round, L0 readers), failures and
throttling, liveness (orphans, idle partitions), explain, dry runs and the loop's controls.

Rounds are driven with `run_round()`; the loop is driven with `run_now()` and an injected
`sleep` that records what it was asked to wait and never returns, so no test sleeps or times.
Reconciliation is done by hand: `catch_up(hwm - 1, last applied log offset)`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.gc import THROTTLE_RETRIES_MAX, GcActor, GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.partition import PartitionActor, WatermarkBoard
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.cluster import prefix_share
from levelzero.core.entries import AdvanceEpoch, Placeholder
from levelzero.core.errors import InvalidInput, InvariantViolation, StorageError
from levelzero.core.gc import BLOCKED_WARNING_ROUNDS, BLOCKED_WARNING_S, CAP_HOLDER, ExplainVerdict
from levelzero.core.keys import L0_ROOT, format_l0_key, new_uuid, parse_l0_key
from levelzero.core.l0format import Record
from levelzero.storage.memory_cluster import MemoryClusterControl
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import FaultPlan, MemoryObjectStore
from levelzero.storage.protocols import DeleteResult, L0ObjectRow, ListPage, ObjectStore
from levelzero.testing.nodes import running_node

HOUR_S = 3600.0
SLOW_DOWN = (
    "S3 delete_objects of bucket b at moto failed: SlowDown (HTTP 503) Please reduce your request rate."
)


class WallClock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


class Sleeps:
    """An injected sleep: records each wait; returns at once, or never (`block=True`)."""

    def __init__(self, *, block: bool = False) -> None:
        self.delays: list[float] = []
        self.block = block

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.block:
            await anyio.sleep_forever()
        await anyio.lowlevel.checkpoint()


def l0_key(prefix: int, epoch: int, n: int) -> str:
    return format_l0_key(prefix, epoch, new_uuid(n))


async def put_l0(
    store: MemoryObjectStore, log_store: MemoryLogStore | None, keys: Sequence[str], size: int = 10
) -> None:
    for key in keys:
        await store.put(key, b"x" * size)
        if log_store is not None:
            row = L0ObjectRow(key, parse_l0_key(key).epoch, size, store.clock(), 1)
            await log_store.record_l0_object(row)


def l0_keys(store: MemoryObjectStore) -> list[str]:
    return [k for k in store.keys() if k.startswith(L0_ROOT)]


def epoch_of(key: str) -> int:
    return parse_l0_key(key).epoch


def make_gc(
    store: ObjectStore,
    log_store: MemoryLogStore,
    board: WatermarkBoard,
    *,
    epoch: int | Callable[[], int] = 100,
    clock: WallClock | None = None,
    sleep: Sleeps | None = None,
    views: Callable[[], list] = list,
    **config: object,
) -> GcActor:
    # Every round lists unless a test says otherwise: most tests here are about the listing;
    # the catalog's rounds have their own tests (sweep_interval_s > 0).
    settings: dict[str, object] = {"grace_s": 0.0, "sweep_interval_s": 0.0}
    settings.update(config)
    return GcActor(
        GcConfig(**settings),  # type: ignore[arg-type]
        store,
        log_store,
        cluster_epoch=epoch if callable(epoch) else (lambda: epoch),
        board=board,
        views=views,
        clock=clock or time.time,  # the memory store's default clock
        rng=random.Random(5),
        sleep=sleep or Sleeps(),
    )


def board_of(mps: dict[str, int | None]) -> WatermarkBoard:
    board = WatermarkBoard()
    for name, mp in mps.items():
        board.register(name)
        board.publish(name, mp)
    return board


class HookedStore:
    """Delegates to a memory store; runs `on_list` (once) before the first list request and
    records every delete batch."""

    def __init__(self, inner: MemoryObjectStore, on_list: Callable[[], Awaitable[None]] | None = None):
        self.inner = inner
        self.on_list = on_list
        self.delete_batches: list[list[str]] = []

    async def put(self, key: str, data: bytes | bytearray) -> None:
        await self.inner.put(key, data)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return await self.inner.get(key, offset, length)

    async def head(self, key: str):
        return await self.inner.head(key)

    async def list_page(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> ListPage:
        if self.on_list is not None:
            hook, self.on_list = self.on_list, None
            await hook()
        return await self.inner.list_page(prefix, start_after, limit)

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        self.delete_batches.append(list(keys))
        return await self.inner.delete_many(keys)

    async def aclose(self) -> None:
        await self.inner.aclose()


# ------------------------------------------------------------------------------ a Node


def node_config(epoch_cache_ttl_s: float = 0.0) -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=epoch_cache_ttl_s,
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
    )


def node_gc(node: Node, wall: WallClock, **config: object) -> GcActor:
    # Every round lists unless a test says otherwise: most tests here are about the listing;
    # the catalog's rounds have their own tests (sweep_interval_s > 0).
    settings: dict[str, object] = {"grace_s": 0.0, "sweep_interval_s": 0.0}
    settings.update(config)
    return GcActor(
        GcConfig(**settings),  # type: ignore[arg-type]
        node.object_store,
        node.log_store,
        cluster_epoch=lambda: node.epochs.current,
        board=node.board,
        views=node.views,
        clock=wall,
        rng=random.Random(3),
        sleep=Sleeps(),
    )


async def produce(node: Node, topic: str, partition: int, *values: bytes) -> str:
    key = ""
    for value in values:
        key = (await node.produce(topic, partition, [Record(None, value)])).object_key
    return key


async def catch_up(actor: PartitionActor) -> None:
    """Reconcile by hand: everything written so far is "in L1"."""
    await actor.catch_up(actor.state.high_watermark - 1, actor.state.last_applied_log_offset)


async def advance_epoch(node: Node, actors: Sequence[PartitionActor]) -> int:
    """Advance the cluster epoch and write it into each partition (the housekeeper's job)."""
    epoch = await node.epochs.advance()
    node.epoch_cache.invalidate()
    for actor in actors:
        await actor.write(AdvanceEpoch(epoch))
    return epoch


async def settle(node: Node, actors: Sequence[PartitionActor], rounds: int = 2) -> None:
    """Catch every partition up and slide its window `rounds` times, so that M passes every
    epoch written before."""
    for actor in actors:
        await catch_up(actor)
    for _ in range(rounds):
        await advance_epoch(node, actors)
        for actor in actors:
            await catch_up(actor)


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("interval_s", 0.0, "interval_s must be > 0"),
        ("interval_s", float("nan"), "interval_s must be a finite number"),
        ("idle_backoff_max_s", 1.0, "idle_backoff_max_s .* must be >= interval_s"),
        ("grace_s", -1.0, "grace_s must be >= 0"),
        ("delete_batch_keys_max", 1001, r"delete_batch_keys_max must be in 1..1000"),
        ("delete_batch_keys_max", 0, r"delete_batch_keys_max must be in 1..1000"),
        ("deletes_in_flight_max", 0, "deletes_in_flight_max must be in"),
        ("list_concurrency_max", 0, "list_concurrency_max must be in"),
        ("worker_count", 0, "worker_count must be in"),
        ("worker_index", 1, r"worker_index must be in 0..0"),
        ("jitter_fraction", 1.0, r"jitter_fraction must be in \[0, 1\)"),
        ("throttle_backoff_s", -0.5, "throttle_backoff_s must be >= 0"),
        ("dry_run_keys_max", -1, "dry_run_keys_max must be in"),
        ("deletes_in_flight_max", 2.5, "deletes_in_flight_max must be an integer"),
        ("enabled", "yes", "enabled must be true or false"),
    ],
)
def test_bad_config_values_are_rejected_with_a_clear_message(field, value, message) -> None:
    with pytest.raises(InvalidInput, match=message):
        GcConfig(**{field: value})


def test_default_config_is_valid_and_owns_every_prefix() -> None:
    config = GcConfig()
    assert config.prefixes == range(0, 1000)
    assert GcConfig(worker_index=1, worker_count=2).prefixes == range(500, 1000)


# ------------------------------------------------------------------------------ selection


async def test_objects_at_or_below_m_are_deleted_and_above_are_kept() -> None:
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    keys = [
        l0_key(prefix, epoch, prefix * 100 + epoch) for prefix in (0, 7, 500, 999) for epoch in range(1, 10)
    ]
    await put_l0(store, log_store, keys)
    board = board_of({"t/0": 5, "t/1": 7, "u/0": 6})
    gc = make_gc(store, log_store, board, epoch=100)

    report = await gc.run_round()

    assert report.m == 5  # the minimum over partitions
    assert report.holders == ["t/0"]
    assert sorted(l0_keys(store)) == sorted(k for k in keys if epoch_of(k) > 5)
    assert report.deleted == 4 * 5 and report.deleted_bytes == 4 * 5 * 10
    assert report.listed == 4 * 6  # per prefix: five deletable and the first epoch above M
    assert report.above_m == 4
    assert report.max_deleted_epoch == 5
    assert report.backlog == 0 and report.errors == 0
    deleted_rows = [row for row in log_store.l0_objects.values() if row.deleted_at is not None]
    assert sorted(row.key for row in deleted_rows) == sorted(k for k in keys if epoch_of(k) <= 5)
    assert {row.deleted_at_m for row in deleted_rows} == {5}
    (row,) = log_store.gc_rounds
    assert (row.m, row.deleted, row.dry_run, row.blocked_by, row.cluster_epoch) == (5, 20, False, None, 100)
    stats = gc.statistics()
    assert (stats.m, stats.epoch_lag, stats.totals.deleted, stats.rounds) == (5, 95, 20, 1)


async def test_a_partition_without_mp_blocks_every_delete_and_is_named() -> None:
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    keys = [l0_key(3, epoch, epoch) for epoch in (1, 2, 3)]
    await put_l0(store, log_store, keys)
    gc = make_gc(store, log_store, board_of({"t/0": 9, "new/1": None, "new/0": None}))

    report = await gc.run_round()

    assert report.blocked and report.m is None
    assert report.blocked_by == ["new/0", "new/1"]
    assert l0_keys(store) == sorted(keys)
    assert report.list_requests == 0 and report.deleted == 0
    assert log_store.gc_rounds[-1].blocked_by == "partitions without M(p): new/0, new/1"
    stats = gc.statistics()
    assert stats.safety_blocked_rounds == 1
    assert stats.blocked_by == ("new/0", "new/1")


async def test_the_cap_e_minus_1_binds_with_no_partitions() -> None:
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    keys = [l0_key(1, epoch, epoch) for epoch in range(1, 8)]
    await put_l0(store, log_store, keys)
    gc = make_gc(store, log_store, WatermarkBoard(), epoch=5)

    report = await gc.run_round()

    assert report.m == 4 and report.holders == [CAP_HOLDER]
    assert [epoch_of(k) for k in l0_keys(store)] == [5, 6, 7]


async def test_m_falling_between_rounds_is_an_invariant_violation() -> None:
    epochs = iter([10, 6])
    gc = make_gc(MemoryObjectStore(), MemoryLogStore(), WatermarkBoard(), epoch=lambda: next(epochs))
    assert (await gc.run_round()).m == 9
    with pytest.raises(InvariantViolation, match="M fell from 9 to 5"):
        await gc.run_round()


async def test_young_objects_survive_the_grace_period_and_go_once_old() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    old, young = l0_key(1, 1, 1), l0_key(1, 2, 2)
    await put_l0(store, log_store, [old])
    wall.now += HOUR_S
    await put_l0(store, log_store, [young])
    wall.now += 10
    gc = make_gc(store, log_store, board_of({"t/0": 50}), clock=wall, grace_s=30.0)

    report = await gc.run_round()
    assert l0_keys(store) == [young]
    assert (report.deleted, report.too_young, report.oldest_young_at) == (1, 1, wall.now - 10)

    wall.now += 20  # exactly the grace period: old enough
    report = await gc.run_round()
    assert l0_keys(store) == []
    assert (report.deleted, report.too_young) == (1, 0)
    assert gc.statistics().totals.too_young == 1


async def test_2500_eligible_keys_over_many_pages_are_all_deleted_in_batches_of_1000() -> None:
    inner, log_store = MemoryObjectStore(), MemoryLogStore()
    eligible = [l0_key(p, 1 + i % 4, i) for p in (10, 11, 620) for i in range(834)][:2500]
    above = [l0_key(p, 9, 10_000 + p) for p in (10, 11, 620)]
    await put_l0(inner, None, eligible + above)
    store = HookedStore(inner)
    gc = make_gc(store, log_store, board_of({"t/0": 4}), list_concurrency_max=3)

    report = await gc.run_round()

    assert sorted(l0_keys(inner)) == sorted(above)
    assert report.deleted == report.eligible == 2500
    assert sorted(len(batch) for batch in store.delete_batches) == [500, 1000, 1000]
    assert sorted(k for batch in store.delete_batches for k in batch) == sorted(eligible)
    assert report.list_requests >= 3  # 834 keys per prefix: at least one page boundary


async def test_small_batches_and_one_deleter_still_delete_everything() -> None:
    inner, log_store = MemoryObjectStore(), MemoryLogStore()
    keys = [l0_key(i % 50, 1, i) for i in range(1000)]
    await put_l0(inner, None, keys)
    store = HookedStore(inner)
    gc = make_gc(store, log_store, board_of({"t/0": 1}), delete_batch_keys_max=7, deletes_in_flight_max=1)
    report = await gc.run_round()
    assert report.deleted == 1000 and l0_keys(inner) == []
    assert max(len(b) for b in store.delete_batches) == 7
    assert len(store.delete_batches) == -(-1000 // 7)


async def test_an_idle_keyspace_costs_few_list_requests() -> None:
    """Empty prefixes cost nothing; a prefix past M is skipped, not paged through."""
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    await put_l0(store, None, [l0_key(p, 50 + i, p * 1000 + i) for p in (3, 400, 998) for i in range(1500)])
    gc = make_gc(store, log_store, board_of({"t/0": 10}), list_concurrency_max=4)
    report = await gc.run_round()
    assert report.deleted == 0 and report.above_m == 3
    # One per first digit of each range (4 ranges of 250 touch 12 digits), one after each skip.
    assert report.list_requests <= 12 + 3


async def test_two_workers_split_the_prefixes_and_delete_each_object_once() -> None:
    faults = FaultPlan()
    inner, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    keys = [l0_key(i % 1000, 1 + i % 3, i) for i in range(3000)]
    await put_l0(inner, None, keys)
    faults.set_delay("list", 0.0005)  # interleave the two workers' requests
    faults.set_delay("delete_many", 0.0005)
    store = HookedStore(inner)
    board = board_of({"t/0": 3})
    workers = [
        make_gc(store, log_store, board, worker_index=i, worker_count=2, delete_batch_keys_max=100)
        for i in range(2)
    ]
    reports = []

    async def one(gc: GcActor) -> None:
        reports.append(await gc.run_round())

    async with anyio.create_task_group() as tg:
        for gc in workers:
            tg.start_soon(one, gc)

    assert l0_keys(inner) == []
    assert sorted(r.deleted for r in reports) == [1500, 1500]
    all_deleted = [k for batch in store.delete_batches for k in batch]
    assert sorted(all_deleted) == sorted(keys)  # each key in exactly one delete request
    assert sum(r.errors for r in reports) == 0
    assert inner.statistics().delete_errors == 0


async def test_two_gc_instances_sharing_a_store_delete_everything_without_errors() -> None:
    faults = FaultPlan()
    inner, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    keys = [l0_key(i % 97, 1 + i % 2, i) for i in range(2500)]
    above = [l0_key(5, 3, 99_999)]
    await put_l0(inner, log_store, keys + above)
    faults.set_delay("list", 0.0005)
    faults.set_delay("delete_many", 0.0005)
    board = board_of({"t/0": 2})
    instances = [make_gc(inner, log_store, board, delete_batch_keys_max=250) for _ in range(2)]
    reports = []

    async def rounds(gc: GcActor) -> None:
        for _ in range(3):
            reports.append(await gc.run_round())

    async with anyio.create_task_group() as tg:
        for gc in instances:
            tg.start_soon(rounds, gc)

    assert l0_keys(inner) == above
    assert sum(r.errors for r in reports) == 0
    assert inner.statistics().delete_errors == 0 and inner.statistics().faults == 0
    # Deletes are idempotent: a key both instances listed is deleted once and "deleted" twice.
    assert sum(r.deleted for r in reports) >= len(keys)
    assert all(r.backlog == 0 for r in reports)
    marked = {row.key for row in log_store.l0_objects.values() if row.deleted_at is not None}
    assert marked == set(keys)


# ------------------------------------------------------------------------------ failures


async def test_partial_delete_failures_are_counted_and_retried_next_round() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    keys = [l0_key(1, 1, i) for i in range(10)]
    await put_l0(store, log_store, keys)
    failing = keys[2:5]
    faults.fail_deletes(failing, "InternalError: We encountered an internal error", count=1)
    gc = make_gc(store, log_store, board_of({"t/0": 1}))

    first = await gc.run_round()
    assert (first.deleted, first.delete_errors, first.backlog) == (7, 3, 3)
    assert l0_keys(store) == sorted(failing)
    assert "InternalError" in first.error_samples[0]
    assert log_store.gc_rounds[-1].errors == 3
    marked = {row.key for row in log_store.l0_objects.values() if row.deleted_at is not None}
    assert marked == set(keys) - set(failing)

    second = await gc.run_round()
    assert (second.deleted, second.delete_errors, second.backlog) == (3, 0, 0)
    assert l0_keys(store) == []
    stats = gc.statistics()
    assert (stats.totals.deleted, stats.totals.delete_errors, stats.backlog) == (10, 3, 0)


async def test_a_failed_delete_request_loses_nothing_and_the_next_round_deletes() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    keys = [l0_key(1, 1, i) for i in range(5)]
    await put_l0(store, log_store, keys)
    faults.fail_next("delete_many", StorageError("connection reset"))
    gc = make_gc(store, log_store, board_of({"t/0": 1}))

    first = await gc.run_round()
    assert (first.deleted, first.delete_errors, first.backlog, first.throttled) == (0, 5, 5, 0)
    second = await gc.run_round()
    assert second.deleted == 5 and l0_keys(store) == []


async def test_a_round_whose_every_list_fails_counts_as_failed() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    faults.fail_next("list", StorageError("connection refused"), count=1_000)
    gc = make_gc(store, log_store, board_of({"t/0": 1}), list_concurrency_max=8)

    report = await gc.run_round()
    assert (report.failed, report.list_errors, report.listed) == (True, 8, 0)
    assert (gc.statistics().rounds, gc.statistics().failed_rounds) == (1, 1)


async def test_failed_gc_requests_are_logged_once_an_interval_per_operation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # During an outage each of a round's 8 list ranges failed, every round: 8 warnings a round.
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    faults.fail_next("list", StorageError("connection refused"), count=1_000)
    wall = WallClock()
    gc = make_gc(store, log_store, board_of({"t/0": 1}), clock=wall, list_concurrency_max=8)
    with caplog.at_level(logging.WARNING, logger="levelzero.gc"):
        for _ in range(3):
            assert (await gc.run_round()).list_errors == 8
            wall.now += 1.0
    said = [r.getMessage() for r in caplog.records if "gc request failed" in r.getMessage()]
    assert said == ["gc request failed, retried next round: list: connection refused"], said


async def test_a_round_that_deletes_none_of_its_keys_counts_as_failed() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, i) for i in range(5)])
    faults.fail_next("delete_many", StorageError("connection reset"))
    gc = make_gc(store, log_store, board_of({"t/0": 1}), sweep_interval_s=60.0)

    first = await gc.run_round()  # the first round lists
    assert (first.failed, first.deleted, first.delete_errors) == (True, 0, 5)
    await put_l0(store, log_store, [l0_key(1, 1, 10)])
    faults.fail_next("delete_many", StorageError("connection reset"))
    second = await gc.run_round()  # from the catalog
    assert (second.swept, second.failed, second.deleted) == (False, True, 0)
    assert gc.statistics().failed_rounds == 2
    third = await gc.run_round()
    assert (third.failed, third.deleted) == (False, 6)
    assert gc.statistics().failed_rounds == 2


async def test_a_round_that_got_part_of_its_work_done_has_not_failed() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    keys = [l0_key(999, 1, i) for i in range(5)]  # the last range's; the first's list fails
    await put_l0(store, log_store, keys)
    faults.fail_next("list", StorageError("connection refused"), count=1)
    faults.fail_deletes(keys[:2], count=1)
    gc = make_gc(store, log_store, board_of({"t/0": 1}), list_concurrency_max=8)

    report = await gc.run_round()
    assert report.list_errors == 1 and report.delete_errors == 2 and report.deleted > 0
    assert (report.failed, gc.statistics().failed_rounds) == (False, 0)


async def test_a_gc_blocked_for_ten_rounds_warns_once_naming_the_partitions_and_once_unblocked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    board = board_of({"t/0": 1, "t/1": None})
    clock = WallClock()
    clock.now = store.clock() + HOUR_S  # the object is old enough
    gc = make_gc(store, log_store, board, clock=clock)

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    with caplog.at_level(logging.INFO, logger="levelzero.gc"):
        for _ in range(BLOCKED_WARNING_ROUNDS - 1):
            assert (await gc.run_round()).blocked
            clock.now += 5.0
        assert warnings() == []
        for _ in range(3):
            await gc.run_round()
            clock.now += 5.0
        assert warnings() == [
            "gc blocked for 10 rounds (45 s): no L0 object is deleted while partitions have no "
            "M(p): t/1 (levelzero gc explain says why)"
        ]
        board.publish("t/1", 1)
        assert (await gc.run_round()).deleted == 1
        await gc.run_round()
    [unblocked] = [r.getMessage() for r in caplog.records if "unblocked" in r.getMessage()]
    assert unblocked == "gc unblocked after 12 rounds (60 s): M is 1, L0 objects are deleted again"
    assert len(warnings()) == 1


async def test_a_gc_blocked_for_five_minutes_warns_although_its_rounds_are_few(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    clock = WallClock()
    gc = make_gc(store, log_store, board_of({"t/0": None}), clock=clock)
    with caplog.at_level(logging.WARNING, logger="levelzero.gc"):
        await gc.run_round()
        clock.now += BLOCKED_WARNING_S - 1
        await gc.run_round()
        assert caplog.records == []
        clock.now += 1
        await gc.run_round()
    [record] = caplog.records
    assert record.getMessage().startswith("gc blocked for 3 rounds (300 s)") and record.blocked_by == ["t/0"]


async def test_a_crash_mid_round_loses_nothing_a_new_instance_finishes() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    keys = [l0_key(i % 20, 1, i) for i in range(300)]
    await put_l0(store, log_store, keys)
    board = board_of({"t/0": 1})
    delete_calls = 0

    def die_on_the_second_delete(op: str, key: str | None) -> None:
        nonlocal delete_calls
        if op == "delete_many":
            delete_calls += 1
            if delete_calls == 2:
                raise RuntimeError("the process died")

    faults.hook = die_on_the_second_delete
    crashed = make_gc(store, log_store, board, delete_batch_keys_max=100, deletes_in_flight_max=1)
    with pytest.raises(RuntimeError):
        await crashed.run_round()
    assert crashed.statistics().failed_rounds == 1
    assert len(l0_keys(store)) == 200  # one batch went before the crash

    restarted = make_gc(store, log_store, board)
    report = await restarted.run_round()
    assert report.deleted == 200 and l0_keys(store) == []


async def test_throttled_deletes_back_off_and_retry_within_the_round() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    keys = [l0_key(1, 1, i) for i in range(5)]
    await put_l0(store, log_store, keys)
    faults.fail_next("delete_many", StorageError(SLOW_DOWN), count=2)
    sleeps = Sleeps()
    gc = make_gc(store, log_store, board_of({"t/0": 1}), sleep=sleeps, throttle_backoff_s=0.5)

    report = await gc.run_round()

    assert sleeps.delays == [0.5, 1.0]
    assert (report.deleted, report.throttled, report.delete_requests, report.errors) == (5, 2, 3, 0)
    assert gc.statistics().totals.throttled == 2


async def test_throttling_retries_are_bounded_and_the_keys_wait_for_the_next_round() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    keys = [l0_key(1, 1, i) for i in range(5)]
    await put_l0(store, log_store, keys)
    faults.fail_next("delete_many", StorageError(SLOW_DOWN), count=100)
    sleeps = Sleeps()
    gc = make_gc(store, log_store, board_of({"t/0": 1}), sleep=sleeps, throttle_backoff_s=1.0)

    report = await gc.run_round()

    assert sleeps.delays == [1.0, 2.0, 4.0][:THROTTLE_RETRIES_MAX]
    assert report.delete_requests == THROTTLE_RETRIES_MAX + 1
    assert (report.deleted, report.delete_errors, report.backlog) == (0, 5, 5)
    faults.clear()
    assert (await gc.run_round()).deleted == 5


async def test_per_key_slow_down_backs_off_before_the_next_batch() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    keys = [l0_key(1, 1, i) for i in range(4)]
    await put_l0(store, log_store, keys)
    faults.fail_deletes(keys[:1], "SlowDown: Please reduce your request rate.", count=1)
    sleeps = Sleeps()
    gc = make_gc(store, log_store, board_of({"t/0": 1}), sleep=sleeps, throttle_backoff_s=0.25)
    report = await gc.run_round()
    assert (report.deleted, report.delete_errors, report.throttled) == (3, 1, 1)
    assert sleeps.delays == [0.25]


async def test_a_failed_listing_ends_only_its_prefix_range() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    low, high = l0_key(100, 1, 1), l0_key(900, 1, 2)
    await put_l0(store, log_store, [low, high])
    gc = make_gc(store, log_store, board_of({"t/0": 1}), list_concurrency_max=2)
    faults.fail_next("list", StorageError("connection reset"))

    report = await gc.run_round()
    assert (report.list_errors, report.deleted) == (1, 1)
    assert len(l0_keys(store)) == 1
    assert (await gc.run_round()).deleted == 1
    assert l0_keys(store) == []


async def test_throttled_listing_backs_off_and_goes_on() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    faults.fail_next("list", StorageError("S3 list_objects_v2 failed: HTTP 503"))
    sleeps = Sleeps()
    gc = make_gc(store, log_store, board_of({"t/0": 1}), sleep=sleeps, list_concurrency_max=1)
    report = await gc.run_round()
    assert (report.throttled, report.list_errors, report.deleted) == (1, 0, 1)
    assert sleeps.delays == [1.0]


# ------------------------------------------------------------------------------ dry run


async def test_dry_run_lists_the_eligible_keys_and_deletes_nothing() -> None:
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    eligible = [l0_key(p, 2, p) for p in range(0, 1000, 100)]
    above = [l0_key(p, 3, 1000 + p) for p in range(0, 1000, 100)]
    await put_l0(store, log_store, eligible + above)
    gc = make_gc(store, log_store, board_of({"t/0": 2}))

    report = await gc.run_round(dry_run=True)

    assert report.dry_run and sorted(report.would_delete) == sorted(eligible)
    assert not report.would_delete_truncated
    assert (report.eligible, report.deleted, report.delete_requests) == (10, 0, 0)
    assert sorted(l0_keys(store)) == sorted(eligible + above)
    assert log_store.gc_rounds[-1].dry_run is True
    assert all(row.deleted_at is None for row in log_store.l0_objects.values())

    small = make_gc(store, log_store, board_of({"t/0": 2}), dry_run_keys_max=3)
    truncated = await small.run_round(dry_run=True)
    assert len(truncated.would_delete) == 3 and truncated.would_delete_truncated
    assert truncated.eligible == 10


# ------------------------------------------------------------------------------ safety


async def test_a_write_in_flight_at_the_windows_lower_edge_keeps_its_object() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    async with running_node(node_config(), log_store, store, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        actor = node.partition("t", 0)
        await produce(node, "t", 0, b"first")  # window [1, 1]
        await advance_epoch(node, [actor])  # window [1, 2]
        await catch_up(actor)  # lower bound -> previous_applied = 1: M(p) = 0
        assert actor.state.applied_window == (1, 2) and actor.state.mp == 0
        gc = node_gc(node, wall)

        # A producer with an epoch-1 cache uploaded its object; its placeholder is in flight.
        key = l0_key(17, 1, 4242)
        await store.put(key, b"payload")
        for _ in range(3):
            await gc.run_round()
            assert key in store.keys()
        placeholder = Placeholder(
            epoch=1, object_key=key, byte_offset=0, byte_length=7, record_count=1, checksum=0
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.write, placeholder)  # admitted: 1 is the window's lower edge
            for _ in range(3):
                await gc.run_round()
                assert key in store.keys()

        # The window moves on, but the placeholder is not reconciled: M(p) must stay below 1.
        await advance_epoch(node, [actor])
        await actor.catch_up(actor.state.lro, actor.state.lrlo)  # no progress
        for _ in range(3):
            report = await gc.run_round()
            assert report.m == 0 and key in store.keys()

        await settle(node, [actor])  # reconciled through it: now it may go
        report = await gc.run_round()
        assert key not in store.keys()
        assert report.m >= 1


async def test_a_partition_created_after_the_rounds_snapshot_never_loses_data() -> None:
    wall = WallClock()
    inner, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    created: list[str] = []

    async with running_node(node_config(), log_store, inner, wall_clock=wall) as node:
        for _ in range(4):
            await node.epochs.advance()  # E = 5, no partitions: M = E - 1 = 4
        orphans = [l0_key(p, e, p * 10 + e) for p in (0, 300, 999) for e in range(1, 5)]
        await put_l0(inner, None, orphans)

        async def create_and_produce() -> None:
            # Between the round's snapshot and its listing, a topic appears and gets data.
            await node.create_topic("late", 2)
            for p in range(2):
                created.append(await produce(node, "late", p, b"must survive"))

        store = HookedStore(inner, on_list=create_and_produce)
        node.object_store = store  # the GC lists through the hook; the node keeps `inner`
        gc = node_gc(node, wall)
        report = await gc.run_round()

        assert report.m == 4 and report.blocked_by == []  # snapshot before the topic existed
        assert all(epoch_of(k) >= 5 for k in created)
        assert sorted(l0_keys(inner)) == sorted(created)
        for p in range(2):
            fetched = await node.fetch("late", p, 0, 1 << 20)
            assert [r.value for r in fetched.records] == [b"must survive"]

        # Next round sees the partitions; their M(p) = 4 never reaches their epoch-5 objects.
        report = await gc.run_round()
        assert report.m == 4 and sorted(l0_keys(inner)) == sorted(created)


async def test_an_l0_reader_pins_its_objects_until_it_releases() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    async with running_node(node_config(), log_store, store, wall_clock=wall) as node:
        await node.create_topic("t", 1)
        actor = node.partition("t", 0)
        key = await produce(node, "t", 0, b"read me")
        await advance_epoch(node, [actor])
        await advance_epoch(node, [actor])  # window [2, 3]; nothing reconciled: M(p) = 0
        gc = node_gc(node, wall)

        reader_id, pinned = actor.register_reader()
        assert pinned == 0
        await catch_up(actor)  # the state's M(p) rises to 1, the pin holds the published 0
        assert actor.state.mp == 1 and node.board.get("t/0") == 0
        report = await gc.run_round()
        assert report.m == 0 and key in store.keys()
        assert await store.get(key)  # the reader's range reads still find the object
        why = await gc.explain()
        assert [(h.partition, h.reason) for h in why.holders] == [
            ("t/0", "pinned by an L0 reader (at 0; unpinned M(p) is 1)")
        ]

        actor.release_reader(reader_id)
        report = await gc.run_round()
        assert report.m == 1 and key not in store.keys()


# ------------------------------------------------------------------------------ liveness


async def test_orphans_reconciled_objects_and_idle_partitions_leave_nothing_behind() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    config = node_config(epoch_cache_ttl_s=10_000.0)  # a stale cache, invalidated only on rejection
    async with running_node(config, log_store, store, wall_clock=wall) as node:
        await node.create_topic("t", 3)  # t/2 stays idle: no data ever
        actors = [node.partition("t", p) for p in range(3)]
        for i in range(5):
            await produce(node, "t", 0, f"a{i}".encode())
            await produce(node, "t", 1, f"b{i}".encode())
        # The epoch moves twice, the partitions learn it, but the node's cache still says 1.
        for _ in range(2):
            epoch = await node.epochs.advance()
            for actor in actors[:2]:
                await actor.write(AdvanceEpoch(epoch))
        await produce(node, "t", 0, b"after")  # rejected at epoch 1, retried at epoch 3
        assert node.batcher.stats.orphan_objects == 1
        gc = node_gc(node, wall)

        report = await gc.run_round()
        assert report.blocked_by == ["t/2"]  # the idle partition has no epoch yet
        assert l0_keys(store)

        # The housekeeper's job, by hand: give the idle partition its epoch, reconcile all.
        await actors[2].write(AdvanceEpoch(node.epochs.current))
        await settle(node, actors)
        report = await gc.run_round()
        assert report.blocked_by == [] and report.errors == 0
        assert l0_keys(store) == []
        assert report.m == node.epochs.current - 2
        assert {row.deleted_at is not None for row in log_store.l0_objects.values()} == {True}


async def test_gc_after_many_epochs_keeps_only_the_unreconciled_tail() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    async with running_node(node_config(), log_store, store, wall_clock=wall) as node:
        await node.create_topic("t", 2)
        actors = [node.partition("t", p) for p in range(2)]
        gc = node_gc(node, wall)
        for generation in range(4):
            for p in range(2):
                await produce(node, "t", p, f"g{generation}".encode())
            await settle(node, actors, rounds=1)
            await gc.run_round()
        tail = await produce(node, "t", 0, b"unreconciled")
        report = await gc.run_round()
        assert tail in l0_keys(store)
        assert gc.statistics().totals.deleted >= 6  # the early generations went
        assert all(epoch_of(k) > report.m for k in l0_keys(store))
        assert gc.statistics().totals.max_deleted_epoch <= report.m


# ------------------------------------------------------------------------------ explain


async def test_explain_names_the_partition_that_holds_m_back_and_why() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    async with running_node(node_config(), log_store, store, wall_clock=wall) as node:
        await node.create_topic("t", 2)
        fast, slow = node.partition("t", 0), node.partition("t", 1)
        key = await produce(node, "t", 1, b"x", b"y", b"z")
        await produce(node, "t", 0, b"a")
        wall.now += HOUR_S
        await settle(node, [fast], rounds=3)  # t/0 reconciled and moved on
        await advance_epoch(node, [slow])  # t/1 has its epochs, but 3 records unreconciled
        gc = node_gc(node, wall, grace_s=30.0)

        why = await gc.explain()
        assert why.m == 0 and why.verdict is None
        assert [(h.partition, h.mp, h.mp_minus_m) for h in why.holders] == [("t/1", 0, 0)]
        assert why.holders[0].reason == "unreconciled data (LRO -1, high watermark 3)"
        assert "held by t/1" in why.detail

        about = await gc.explain(key=key)
        assert (about.verdict, about.epoch, about.owned) == (ExplainVerdict.ABOVE_M, 1, True)
        assert [(h.partition, h.behind) for h in about.holders] == [("t/1", 1)]

        await catch_up(slow)  # reconciled, but its window was not advanced since
        await slow.catch_up(slow.state.lro, slow.state.lrlo)
        why = await gc.explain(epoch=2)
        (holder,) = [h for h in why.holders if h.partition == "t/1"]
        assert holder.reason == "idle: waiting for the housekeeper to advance its epoch"
        assert holder.behind == 2 - holder.mp

        await settle(node, [slow])
        young = await produce(node, "t", 0, b"new")
        wall.now += 5
        assert (await gc.explain(key=key)).verdict == ExplainVerdict.DELETABLE
        assert (await gc.explain(key=key)).holders == []
        await settle(node, [fast, slow])
        too_young = await gc.explain(key=young)
        assert too_young.verdict == ExplainVerdict.TOO_YOUNG
        assert "deletable in 25.0 s" in too_young.detail
        await gc.run_round()
        gone = await gc.explain(key=key)
        assert gone.verdict == ExplainVerdict.NOT_FOUND
        bad = await gc.explain(key="level_zero/data/1/2/3")
        assert bad.verdict == ExplainVerdict.MALFORMED

        await node.create_topic("new", 1)
        blocked = await gc.explain(epoch=1)
        assert blocked.verdict == ExplainVerdict.BLOCKED
        assert blocked.blocked_by == ["new/0"]
        assert [(h.partition, h.reason) for h in blocked.holders][:1] == [("new/0", "no epoch yet")]


async def test_explain_reports_the_cap_and_rejects_bad_questions() -> None:
    gc = make_gc(MemoryObjectStore(), MemoryLogStore(), board_of({"t/0": 50}), epoch=10)
    why = await gc.explain(epoch=12)
    assert why.verdict == ExplainVerdict.ABOVE_M and why.m == 9
    assert [(h.partition, h.behind, h.reason) for h in why.holders] == [
        (CAP_HOLDER, 3, "capped at cluster epoch - 1 (cluster epoch 10)")
    ]
    assert (await gc.explain()).holders[0].partition == CAP_HOLDER
    with pytest.raises(InvalidInput):
        await gc.explain(key=l0_key(1, 1, 1), epoch=1)
    with pytest.raises(InvalidInput):
        await gc.explain(epoch=0)


# ------------------------------------------------------------------------------ the loop


@asynccontextmanager
async def running(gc: GcActor):
    async with anyio.create_task_group() as tg:
        await tg.start(gc.run)
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


async def test_run_now_wakes_the_loop_and_pacing_follows_progress_then_idles() -> None:
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    sleeps = Sleeps(block=True)
    gc = make_gc(
        store,
        log_store,
        board_of({"t/0": 1}),
        sleep=sleeps,
        interval_s=2.0,
        idle_backoff_max_s=5.0,
        jitter_fraction=0.1,
    )
    async with running(gc):
        for expected_rounds in range(1, 5):
            gc.run_now()
            await gc.wait_round_finished(expected_rounds - 1)
            await wait_all_tasks_blocked()
        assert l0_keys(store) == []
    # first wait, then: progress -> interval; idle -> interval, 4 (doubled), 5 (the cap)
    first, progress, *idle = sleeps.delays
    assert first == pytest.approx(2.0, rel=0.1)
    assert progress == pytest.approx(2.0, rel=0.1)
    assert len(idle) == 3
    for delay, base in zip(idle, [2.0, 4.0, 5.0], strict=True):
        assert delay == pytest.approx(base, rel=0.1)
    assert gc.statistics().pace_reason == "idle"


async def test_a_young_object_wakes_the_loop_when_it_ages_out() -> None:
    wall = WallClock()
    store, log_store = MemoryObjectStore(clock=wall), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    wall.now += 25
    sleeps = Sleeps(block=True)
    gc = make_gc(
        store,
        log_store,
        board_of({"t/0": 1}),
        clock=wall,
        sleep=sleeps,
        grace_s=30.0,
        interval_s=60.0,
        idle_backoff_max_s=600.0,
    )
    async with running(gc):
        gc.run_now()
        await gc.wait_round_finished(0)
        await wait_all_tasks_blocked()
    assert sleeps.delays[-1] == pytest.approx(5.0)
    assert gc.statistics().pace_reason == "young"


async def test_paused_gc_runs_no_rounds_until_resumed() -> None:
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    gc = make_gc(store, log_store, board_of({"t/0": 1}), sleep=Sleeps(block=True))
    async with running(gc):
        gc.pause()
        gc.run_now()
        await wait_all_tasks_blocked()
        assert gc.rounds_finished == 0 and gc.statistics().paused
        assert l0_keys(store)
        gc.resume()
        await gc.wait_round_finished(0)
        assert l0_keys(store) == [] and not gc.statistics().paused


async def test_a_disabled_gc_starts_paused_but_answers_run_round() -> None:
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    gc = make_gc(store, log_store, board_of({"t/0": 1}), sleep=Sleeps(block=True), enabled=False)
    async with running(gc):
        gc.run_now()
        await wait_all_tasks_blocked()
        assert gc.rounds_finished == 0
        assert (await gc.run_round(dry_run=True)).would_delete == [l0_key(1, 1, 1)]


async def test_a_failing_round_does_not_end_the_loop() -> None:
    faults = FaultPlan()
    store, log_store = MemoryObjectStore(faults=faults), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    gc = make_gc(store, log_store, board_of({"t/0": 1}), sleep=Sleeps(block=True))

    async def failing_record(row) -> None:
        raise StorageError("the log store is read-only")

    original = log_store.record_gc_round
    log_store.record_gc_round = failing_record  # type: ignore[method-assign]
    async with running(gc):
        gc.run_now()
        await gc.wait_round_finished(0)
        await wait_all_tasks_blocked()
        assert gc.statistics().failed_rounds == 1
        log_store.record_gc_round = original  # type: ignore[method-assign]
        gc.run_now()
        await gc.wait_round_finished(1)
    assert gc.statistics().rounds == 1 and l0_keys(store) == []


@pytest.mark.parametrize("sweep_interval_s", [0.0, 3600.0])  # listing rounds, catalog rounds
async def test_in_a_cluster_each_node_deletes_its_share_and_together_every_eligible_object(
    sweep_interval_s: float,
) -> None:
    """Two nodes' GC over one store and one (shared) catalog, M from the control plane: each
    lists (or reads from the catalog) and deletes only in its prefix share; together they
    delete exactly the objects at or below M, each once."""

    store, log_store = MemoryObjectStore(), MemoryLogStore()
    rows = await log_store.create_topic("t", 2, 1, 0.0)
    await log_store.set_cluster_epoch(100)
    control = MemoryClusterControl(log_store, time.monotonic)
    await control.publish_watermarks({rows[0].pid: 5, rows[1].pid: 7})
    keys = [
        l0_key(prefix, epoch, prefix * 100 + epoch) for prefix in (0, 7, 500, 999) for epoch in range(1, 10)
    ]
    await put_l0(store, log_store, keys)
    hooked = HookedStore(store)
    gcs = []
    for node in ("a", "b"):
        gc = make_gc(hooked, log_store, WatermarkBoard(), epoch=1, sweep_interval_s=sweep_interval_s)
        gc._watermarks = control.watermark_snapshot  # as Node wires it in cluster mode
        gc._share = lambda node=node: prefix_share(node, ["a", "b"])
        gcs.append(gc)
    if sweep_interval_s:  # catalog rounds after a first sweep
        for gc in gcs:
            gc._last_sweep_at = time.time()
    reports = [await gc.run_round() for gc in gcs]

    assert [r.m for r in reports] == [5, 5]  # over both partitions, from the control plane
    assert [r.cluster_epoch for r in reports] == [100, 100]
    assert sorted(l0_keys(store)) == sorted(k for k in keys if epoch_of(k) > 5)
    deleted = [key for batch in hooked.delete_batches for key in batch]
    assert sorted(deleted) == sorted(k for k in keys if epoch_of(k) <= 5)  # each once
    assert [r.deleted for r in reports] == [10, 10]  # prefixes 0 and 7 | 500 and 999


async def test_a_round_id_is_the_gc_start_in_milliseconds_plus_its_rounds_since_in_status_logs_and_rows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Round ids look like timestamps on purpose: the log store keys its rounds by id, and a
    restarted GC counting from 1 again would overwrite the earlier process's rows. The log line,
    the report (status, `gc run`) and the stored row show the same id, and the export's schema
    says what it is (it said the id restarts at 1 with the process)."""
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    board, wall = board_of({"t/0": 5}), WallClock()
    wall.now = 1_795_974_347.848
    with caplog.at_level(logging.DEBUG, logger="levelzero.gc"):  # rounds with nothing to do
        gc = make_gc(store, log_store, board, clock=wall)
        first, second = await gc.run_round(), await gc.run_round()
        wall.now += 60.0  # restarted a minute later
        again = await make_gc(store, log_store, board, clock=wall).run_round()
    ids = [first.round_id, second.round_id, again.round_id]
    assert ids == [1_795_974_347_848, 1_795_974_347_849, 1_795_974_407_848]
    assert [row.round_id for row in log_store.gc_rounds] == ids  # none overwritten
    logged = [r.__dict__["round"] for r in caplog.records if r.getMessage() == "gc round"]
    assert logged == ids
    assert gc.last_round is not None and gc.last_round.round_id == ids[1]
    # The docs say so (the export's schema said the id restarts at 1 with the process; the
    # logging docs showed `round=12`).
    repo = Path(__file__).resolve().parents[2]
    (schema_row,) = [
        line
        for line in (repo / "levelzero" / "export" / "SCHEMAS.md").read_text().splitlines()
        if line.startswith("| round_id |")
    ]
    assert "milliseconds" in schema_row and "unique across restarts" in schema_row
    operating = (repo / "docs" / "operating.md").read_text()
    assert 'msg="gc round" round=1795974489834 ' in operating and "round=12" not in operating


async def test_a_round_that_did_nothing_is_logged_at_debug_one_that_deleted_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An idle daemon logged a "gc round" line at INFO every round.
    store, log_store = MemoryObjectStore(), MemoryLogStore()
    await put_l0(store, log_store, [l0_key(1, 1, 1)])
    gc = make_gc(store, log_store, board_of({"t/0": 5}))
    with caplog.at_level(logging.DEBUG, logger="levelzero.gc"):
        assert (await gc.run_round()).deleted == 1
        assert (await gc.run_round()).deleted == 0
    levels = [r.levelno for r in caplog.records if r.getMessage() == "gc round"]
    assert levels == [logging.INFO, logging.DEBUG]
