"""A reconciler round reads each L0 object once for all the partitions it copies
(`actors/round_reads.py`): the spans, their memory bound, the fall-backs, and a node's round
counted at the object store (one GET per L0 object where it made one per extent)."""

from __future__ import annotations

from dataclasses import replace

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.compactor import CompactorConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.actors.round_reads import RoundReads
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import StorageError
from levelzero.core.l0format import Record
from levelzero.storage.counting_store import CountingObjectStore
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.testing.gated_store import GatedStore
from levelzero.testing.nodes import running_node, wait_until
from levelzero.testing.virtual_time import in_virtual_time

KEY = "l0/000/e1/object"
BODY = bytes(range(256)) * 4  # 1 KiB, every byte told apart by its place


def extent(offset: int, length: int, key: str = KEY) -> Placeholder:
    return Placeholder(
        epoch=1, object_key=key, byte_offset=offset, byte_length=length, checksum=0, record_count=1
    )


async def store_with_body() -> GatedStore:
    store = GatedStore()
    await store.put(KEY, BODY)
    return store


@in_virtual_time
async def test_the_planned_extents_of_an_object_come_from_one_get_of_their_span():
    store = await store_with_body()
    reads = RoundReads(store, budget_bytes=1024)
    planned = [extent(100, 10), extent(300, 50), extent(900, 24)]
    reads.plan(planned)
    before = store.snapshot().gets
    for p in planned:
        assert await reads.get(p) == BODY[p.byte_offset : p.byte_offset + p.byte_length]
    assert store.snapshot().gets - before == 1
    assert (reads.stats.span_gets, reads.stats.extents_from_spans, reads.stats.extent_gets) == (1, 3, 0)
    assert reads.held_bytes == 0  # the span went with its last extent


@in_virtual_time
async def test_a_span_beyond_the_budget_an_unplanned_extent_and_a_lone_one_are_read_alone():
    store = await store_with_body()
    reads = RoundReads(store, budget_bytes=100)
    reads.plan([extent(0, 10), extent(500, 10)])  # a span of 510 bytes: over the budget
    reads.plan([extent(0, 8, key="other")])  # the only extent planned in its object
    await store.put("other", b"x" * 64)
    before = store.snapshot().gets
    assert await reads.get(extent(0, 10)) == BODY[:10]
    assert await reads.get(extent(500, 10)) == BODY[500:510]
    assert await reads.get(extent(0, 8, key="other")) == b"x" * 8
    assert await reads.get(extent(700, 5)) == BODY[700:705]  # never planned
    assert store.snapshot().gets - before == 4
    assert (reads.stats.span_gets, reads.stats.extent_gets) == (0, 4)


def test_planning_stops_at_the_budget():
    def batch(*extents: Placeholder) -> list[LogRecord]:
        return [LogRecord(log_offset=i, term=1, base_offset=i, entry=e) for i, e in enumerate(extents)]

    reads = RoundReads(MemoryObjectStore(), budget_bytes=100)
    assert not reads.full and reads.sharing
    assert reads.plan_batch(1, 0, batch(extent(0, 60), extent(60, 30)))
    assert not reads.full
    assert reads.plan_batch(2, 0, batch(extent(90, 10)))
    assert reads.full
    assert not RoundReads(MemoryObjectStore(), budget_bytes=0).sharing  # shared reads off: no plan
    # At least `partitions_min` batches are planned whatever their spans (a wave copies as
    # many as copy at once; a span that does not fit is read alone), then the budget rules.
    reads = RoundReads(MemoryObjectStore(), budget_bytes=10, partitions_min=2)
    assert reads.plan_batch(1, 0, batch(extent(0, 60)))
    assert not reads.full
    assert reads.plan_batch(2, 0, batch(extent(60, 60)))
    assert reads.full and not reads.plan_batch(3, 0, batch(extent(120, 1)))


@in_virtual_time
async def test_copies_waiting_for_a_span_share_its_get_and_fall_back_when_it_fails():
    store = await store_with_body()
    planned = [extent(0, 4), extent(10, 4), extent(20, 4)]

    async def read_all(reads: RoundReads) -> list[bytes | BaseException]:
        out: list[bytes | BaseException] = [b""] * len(planned)

        async def one(i: int) -> None:
            try:
                out[i] = await reads.get(planned[i])
            except StorageError as exc:
                out[i] = exc

        store.gate = anyio.Event()
        async with anyio.create_task_group() as tg:
            for i in range(len(planned)):
                tg.start_soon(one, i)
            await anyio.sleep(0.01)  # all three wait on the one span GET
            store.gate.set()
        store.gate = None
        return out

    reads = RoundReads(store, budget_bytes=1024)
    reads.plan(planned)
    before = store.snapshot().gets
    assert await read_all(reads) == [BODY[0:4], BODY[10:14], BODY[20:24]]
    assert store.snapshot().gets - before == 1

    # The span's GET fails: its copy gets the error (as its own GET's), the others read alone.
    reads = RoundReads(store, budget_bytes=1024)
    reads.plan(planned)
    store.fail_next = 1
    results = await read_all(reads)
    failed = [i for i, r in enumerate(results) if isinstance(r, StorageError)]
    assert len(failed) == 1  # the copy whose GET it was (whichever of the three came first)
    expected = [BODY[0:4], BODY[10:14], BODY[20:24]]
    assert [r for i, r in enumerate(results) if i not in failed] == [
        e for i, e in enumerate(expected) if i not in failed
    ]
    assert reads.held_bytes == 0 and reads.stats.extent_gets == 2


def config(read_buffer_bytes_max: int) -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=0.0,
        batcher=BatcherConfig(linger_ms=20),
        reconciler=ReconcilerConfig(
            enabled=False, object_age_max_s=0.0, read_buffer_bytes_max=read_buffer_bytes_max
        ),
        housekeeper=HousekeeperConfig(enabled=False),
        compactor=CompactorConfig(enabled=False),
    )


PARTITIONS = 8
WINDOWS = 5


class CountingLogStore(MemoryLogStore):
    """Counts the placeholder reads of each partition."""

    def __init__(self) -> None:
        super().__init__()
        self.placeholder_reads: dict[int, int] = {}

    async def read_placeholders(self, pid: int, from_data_offset: int, limit: int) -> list[LogRecord]:
        self.placeholder_reads[pid] = self.placeholder_reads.get(pid, 0) + 1
        return await super().read_placeholders(pid, from_data_offset, limit)


async def produce_in_windows(node: Node, partitions: int) -> None:
    """`partitions` partitions of topic "t", written in the same `WINDOWS` batch windows: each
    L0 object holds an extent of each."""
    await node.create_topic("t", partitions)
    for window in range(WINDOWS):
        async with anyio.create_task_group() as tg:
            for p in range(partitions):
                records = [Record(None, b"%d/%d/%d" % (window, p, i)) for i in range(3)]
                tg.start_soon(node.produce, "t", p, records)


@pytest.mark.parametrize(("budget", "gets"), [(64 * 1024 * 1024, WINDOWS), (0, WINDOWS * PARTITIONS)])
@in_virtual_time
async def test_a_round_reads_each_l0_object_once_for_every_partition_it_copies(budget: int, gets: int):
    """8 partitions written in the same 5 batch windows: 5 L0 objects of 8 extents. The round
    copying all 8 makes 5 GETs (one per object); with the shared reads off, 40 (one per
    extent). What it copies is the same: every record reads back from L1."""
    objects = CountingObjectStore(MemoryObjectStore())
    log_store = CountingLogStore()
    async with running_node(config(budget), log_store, objects) as node:
        await produce_in_windows(node, PARTITIONS)
        assert objects.snapshot().l0_puts == WINDOWS
        before = objects.snapshot()
        log_store.placeholder_reads.clear()
        assert await node.reconciler.run_round() == PARTITIONS
        assert (objects.snapshot() - before).l0_gets == gets
        # Each partition's placeholders read once: the plan's batch is the copy's.
        assert sorted(log_store.placeholder_reads.values()) == [1] * PARTITIONS
        stats = node.reconciler.stats
        assert stats.l0_span_gets + stats.l0_extent_gets == gets
        for p in range(PARTITIONS):
            actor = node.partition("t", p)
            assert actor.state.lro == WINDOWS * 3 - 1
            fetched = await node.fetch("t", p, 0, 1 << 20)
            values = [r.value for r in fetched.records]
            assert values == [b"%d/%d/%d" % (w, p, i) for w in range(WINDOWS) for i in range(3)]


@in_virtual_time
async def test_a_copy_made_outside_a_round_reads_its_own_placeholders_not_the_rounds_plan():
    """A round planned partitions 0 and 1 and waits in partition 0's copy (one partition at a
    time); a direct `reconcile_partition` of partition 1 then (the simulation's late
    reconciler) reads partition 1's placeholders itself: the round's plan stays the round's."""
    objects = GatedStore()
    log_store = CountingLogStore()
    node_config = config(64 * 1024 * 1024)
    node_config = replace(node_config, reconciler=replace(node_config.reconciler, partitions_in_flight_max=1))
    async with running_node(node_config, log_store, objects) as node:
        await produce_in_windows(node, 2)
        second = node.partition("t", 1)
        log_store.placeholder_reads.clear()
        objects.gate = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(node.reconciler.run_round)
            await wait_until(lambda: len(log_store.placeholder_reads) == 2, "the round planned both")
            tg.start_soon(node.reconciler.reconcile_partition, second)
            await wait_until(
                lambda: log_store.placeholder_reads[second.row.pid] == 2,
                "the direct copy read its own placeholders",
            )
            objects.gate.set()
        objects.gate = None
        for p in range(2):
            assert node.partition("t", p).state.lro == WINDOWS * 3 - 1
            fetched = await node.fetch("t", p, 0, 1 << 20)
            values = [r.value for r in fetched.records]
            assert values == [b"%d/%d/%d" % (w, p, i) for w in range(WINDOWS) for i in range(3)]


def test_a_planned_batch_is_taken_once_and_only_from_its_start():
    reads = RoundReads(MemoryObjectStore(), budget_bytes=1024)
    batch = [LogRecord(log_offset=4, term=1, base_offset=10, entry=extent(0, 10))]
    reads.plan_batch(7, 10, batch)
    assert reads.full is False
    assert reads.take_batch(7, 10) == batch
    assert reads.take_batch(7, 10) is None  # once: a second copy reads its own
    reads.plan_batch(7, 10, batch)
    assert reads.take_batch(7, 11) is None  # the partition moved on since: not this batch
    assert reads.take_batch(7, 10) is None
    assert reads.take_batch(8, 10) is None  # never planned


def test_the_read_buffer_bound_is_checked():
    with pytest.raises(Exception, match="read_buffer_bytes_max"):
        replace(ReconcilerConfig(), read_buffer_bytes_max=-1)


def test_a_batch_that_would_take_the_spans_past_the_budget_is_not_planned_unless_it_is_the_first():
    reads = RoundReads(MemoryObjectStore(), budget_bytes=100)

    def batch(*extents: Placeholder) -> list[LogRecord]:
        return [LogRecord(log_offset=i, term=1, base_offset=i, entry=e) for i, e in enumerate(extents)]

    # The first batch is planned whatever its size: a round makes progress.
    assert reads.plan_batch(1, 0, batch(extent(0, 30), extent(0, 80, key="other")))
    assert reads.full  # spans of 30 and 80 bytes: past the budget, with the first batch alone
    assert not reads.plan_batch(2, 0, batch(extent(30, 1)))
    # A span grows from its first planned byte to the end of its last extent: a neighbour's
    # extent adds its own length, one far away the gap too.
    reads = RoundReads(MemoryObjectStore(), budget_bytes=100)
    assert reads.plan_batch(1, 0, batch(extent(0, 30)))
    assert reads.plan_batch(2, 0, batch(extent(30, 30)))  # 60
    assert not reads.plan_batch(3, 0, batch(extent(200, 10)))  # would be 210: not planned
    assert reads.take_batch(3, 0) is None
    assert reads.plan_batch(4, 0, batch(extent(60, 40)))  # 100: exactly the budget
    assert reads.full
    assert [reads.take_batch(pid, 0) is not None for pid in (1, 2, 4)] == [True, True, True]


def config_with(read_buffer_bytes_max: int, partitions_in_flight_max: int = 4) -> NodeConfig:
    node_config = config(read_buffer_bytes_max)
    return replace(
        node_config,
        reconciler=replace(node_config.reconciler, partitions_in_flight_max=partitions_in_flight_max),
    )


@in_virtual_time
async def test_partitions_whose_extents_do_not_fit_are_copied_in_later_waves_of_the_round():
    """8 partitions in the same 5 windows, a read buffer for two partitions' extents: the
    round copies them in four waves of two neighbours, each with one GET per L0 object (their
    extents lie together: the batcher writes an object's extents in partition order). 20 GETs,
    where copying the partitions that did not fit with a GET per extent took 5 + 30; memory
    stays within the buffer."""
    objects = CountingObjectStore(MemoryObjectStore())
    async with running_node(config_with(0, partitions_in_flight_max=1), MemoryLogStore(), objects) as node:
        await produce_in_windows(node, PARTITIONS)
        extents = await node.log_store.read_placeholders(node.partition("t", 0).row.pid, 0, 100)
        lengths = {record.entry.byte_length for record in extents if isinstance(record.entry, Placeholder)}
        assert len(lengths) == 1  # every partition's extent the same size: "w/p/i" values
        # (two partitions: two neighbouring extents in each of the 5 objects)
        budget = 2 * WINDOWS * lengths.pop()
        node.reconciler.config = replace(node.reconciler.config, read_buffer_bytes_max=budget)
        before = objects.snapshot()
        assert await node.reconciler.run_round() == PARTITIONS
        assert (objects.snapshot() - before).l0_gets == 4 * WINDOWS
        stats = node.reconciler.stats
        assert (stats.l0_span_gets, stats.l0_extent_gets, stats.partitions_deferred) == (20, 0, 6 + 4 + 2)
        for p in range(PARTITIONS):
            assert node.partition("t", p).state.lro == WINDOWS * 3 - 1
            fetched = await node.fetch("t", p, 0, 1 << 20)
            values = [r.value for r in fetched.records]
            assert values == [b"%d/%d/%d" % (w, p, i) for w in range(WINDOWS) for i in range(3)]


@in_virtual_time
async def test_a_read_buffer_smaller_than_any_partitions_extents_still_copies_every_partition():
    """Each wave copies as many partitions as copy at once (4), planned whatever their size:
    a wave makes progress at the copies' concurrency; their spans do not fit, so each extent
    is read alone. The round copies all of them, in two waves."""
    objects = CountingObjectStore(MemoryObjectStore())
    async with running_node(config(1), MemoryLogStore(), objects) as node:
        await produce_in_windows(node, PARTITIONS)
        before = objects.snapshot()
        assert await node.reconciler.run_round() == PARTITIONS
        assert (objects.snapshot() - before).l0_gets == WINDOWS * PARTITIONS
        stats = node.reconciler.stats
        assert node.reconciler.config.partitions_in_flight_max == 4
        assert (stats.l0_span_gets, stats.partitions_deferred) == (0, 4)
        assert all(node.partition("t", p).state.lro == WINDOWS * 3 - 1 for p in range(PARTITIONS))


@in_virtual_time
async def test_records_that_arrive_while_a_round_copies_wait_for_an_object_of_their_own():
    """A partition's copy waits on its GET while more records arrive: the round writes one L1
    object, of what was due when it began; the newer records stay unreconciled, waiting for
    their own object (before, the copy went on to write a second, small one for them)."""
    objects = GatedStore()
    async with running_node(config(64 * 1024 * 1024), MemoryLogStore(), objects) as node:
        await produce_in_windows(node, 1)
        actor = node.partition("t", 0)
        due = actor.state.high_watermark
        objects.gate = anyio.Event()
        async with anyio.create_task_group() as tg:
            written: list[int] = []

            async def round_() -> None:
                written.append(await node.reconciler.run_round())

            tg.start_soon(round_)
            await wait_until(lambda: len(objects.ranges) > 0, "the copy's first GET")
            await node.produce("t", 0, [Record(None, b"late")])
            objects.gate.set()
        objects.gate = None
        assert written == [1] and node.reconciler.stats.objects_written == 1
        assert actor.state.lro == due - 1 and actor.state.high_watermark == due + 1
