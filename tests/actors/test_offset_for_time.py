"""ListOffsets by time without a scan (`Reader.offset_for_time`): the first offset whose record
timestamp is >= T, checked against a brute-force answer for every T over a log whose timestamps
are not monotonic, across L1 objects and L0 extents, with the object reads of each lookup
counted (at most one object range: the extent that holds the answer)."""

from __future__ import annotations

from dataclasses import replace

import anyio
import msgspec

from levelzero.actors.node import Node, NodeConfig
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.l0format import NO_TIMESTAMP, Record, decode_extent
from levelzero.storage.counting_store import CountingObjectStore
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.testing.nodes import hand_run_config, running_node
from levelzero.testing.virtual_time import in_virtual_time

import pytest

# One list per produce request (one extent each): L1 objects A and B, then L0 extents C and D.
# Timestamps go back and forth within and across extents; offset 6 has none.
L1_EXTENTS = [[100, 300, 200, 150], [500, 400, NO_TIMESTAMP, 450]]
L0_EXTENTS = [[350, 900, 600], [1000, 700]]
TIMESTAMPS = [t for extent in L1_EXTENTS + L0_EXTENTS for t in extent]
PROBES = sorted({t + d for t in TIMESTAMPS if t >= 0 for d in (-1, 0, 1)} | {0, 2000})


def uncached_config() -> NodeConfig:
    """The GETs counted here are the extents a lookup reads: without the readers' cache of L0
    objects, which would answer a second read of an L0 object from memory."""
    return replace(hand_run_config(), l0_cache_bytes_max=0)


def brute_force(timestamps: list[int], at_or_after: int, start: int = 0) -> tuple[int, int]:
    for offset in range(start, len(timestamps)):
        if timestamps[offset] >= at_or_after:
            return offset, timestamps[offset]
    return -1, -1


async def fill(
    node: Node, l1_extents: list[list[int]] = L1_EXTENTS, l0_extents: list[list[int]] = L0_EXTENTS
) -> None:
    """Two L1 objects (a reconciler round after each extent), then two L0 extents."""
    await node.create_topic("t", 1)
    for extent in l1_extents:
        await node.produce("t", 0, [Record(None, b"v%d" % t, t) for t in extent])
        assert await node.reconciler.run_round() == 1
    for extent in l0_extents:
        await node.produce("t", 0, [Record(None, b"v%d" % t, t) for t in extent])
    state = node.partition("t", 0).state
    assert state.lro == sum(map(len, l1_extents)) - 1
    assert state.high_watermark == sum(map(len, l1_extents + l0_extents))


def brute_force_max(timestamps: list[int], start: int = 0) -> tuple[int, int]:
    """The first offset carrying the largest timestamp at or above `start`."""
    best = (-1, -1)
    for offset in range(start, len(timestamps)):
        if timestamps[offset] > best[1]:
            best = (offset, timestamps[offset])
    return best


async def largest(node: Node, objects: CountingObjectStore) -> tuple[tuple[int, int], int]:
    """ListOffsets' max-timestamp answer and the object GETs it took."""
    before = objects.snapshot("lookup").gets
    with CountingObjectStore.role("lookup"):
        found = await node.max_timestamp("t", 0)
    return found, objects.snapshot("lookup").gets - before


async def lookup(node: Node, objects: CountingObjectStore, at_or_after: int) -> tuple[tuple[int, int], int]:
    """The answer and the object GETs it took."""
    before = objects.snapshot("lookup").gets
    with CountingObjectStore.role("lookup"):
        found = await node.offset_for_time("t", 0, at_or_after)
    return found, objects.snapshot("lookup").gets - before


@in_virtual_time
async def test_every_time_finds_the_first_offset_at_or_after_it_reading_at_most_one_extent():
    objects = CountingObjectStore(MemoryObjectStore())
    async with running_node(uncached_config(), MemoryLogStore(), objects) as node:
        await fill(node)
        assert [row.max_timestamp_ms for row in node.l1._valid[node.partition("t", 0).row.pid]] == [300, 500]
        for probe in PROBES:
            found, gets = await lookup(node, objects, probe)
            assert found == brute_force(TIMESTAMPS, probe), probe
            # The one extent holding the answer; none when no record is that recent.
            assert gets == (0 if found == (-1, -1) else 1), (probe, gets)
        # Non-monotonic: 250 is first passed at offset 1 (300), not at the later 350 of L0;
        # 501 skips L1 entirely and lands on 900 at offset 9, inside L0's first extent.
        assert (await lookup(node, objects, 250))[0] == (1, 300)
        assert (await lookup(node, objects, 501))[0] == (9, 900)
        assert (await lookup(node, objects, 1001))[0] == (-1, -1)


@in_virtual_time
async def test_rows_and_placeholders_without_a_largest_timestamp_are_read_to_find_out():
    """Rows and placeholders written before the largest timestamp was kept (None) still get
    the exact answer: each such extent is read, in offset order, until one holds it."""
    log_store, objects = MemoryLogStore(), CountingObjectStore(MemoryObjectStore())
    async with running_node(uncached_config(), log_store, objects) as node:
        await fill(node)
        actor = node.partition("t", 0)
        for key, row in list(log_store.l1.items()):
            log_store.l1[key] = msgspec.structs.replace(row, max_timestamp_ms=None)
        log_store.logs[actor.row.pid] = [
            LogRecord(
                r.log_offset, r.term, r.base_offset, msgspec.structs.replace(r.entry, max_timestamp_ms=None)
            )
            if isinstance(r.entry, Placeholder)
            else r
            for r in log_store.logs[actor.row.pid]
        ]
        await node.l1.refresh(actor)
        for probe in PROBES:
            found, gets = await lookup(node, objects, probe)
            assert found == brute_force(TIMESTAMPS, probe), probe
        assert await lookup(node, objects, 450) == ((4, 500), 2)  # A read for nothing, then B
        assert await lookup(node, objects, 950) == ((11, 1000), 4)  # every extent up to D
        assert await lookup(node, objects, 2000) == ((-1, -1), 4)
        # ListOffsets -3 reads every extent to know its largest: the same answer
        assert await largest(node, objects) == (brute_force_max(TIMESTAMPS), 4)


@in_virtual_time
async def test_records_below_the_start_offset_are_not_answers():
    """After DeleteRecords to offset 2, object A's largest timestamp (300, at offset 1) is
    below the start offset: A is read, holds no answer at or above 2, and B answers."""
    objects = CountingObjectStore(MemoryObjectStore())
    async with running_node(uncached_config(), MemoryLogStore(), objects) as node:
        await fill(node)
        assert await node.delete_records("t", 0, 2) == 2
        for probe in PROBES:
            assert (await lookup(node, objects, probe))[0] == brute_force(TIMESTAMPS, probe, start=2), probe
        assert await lookup(node, objects, 250) == ((4, 500), 2)
        assert await lookup(node, objects, 150) == ((2, 200), 1)
        # below 0 (Kafka's ListOffsets with a timestamp no special value names): the first
        # record from the start offset, as Kafka's log search answers
        assert (await lookup(node, objects, -7))[0] == (2, TIMESTAMPS[2])


@in_virtual_time
async def test_merged_requests_and_merged_extents_keep_the_largest_timestamp_of_all():
    """Two produce requests cut into one extent give its placeholder the larger of their
    largest timestamps; two placeholders reconciled into one L1 object give its row theirs."""
    log_store, object_store = MemoryLogStore(), MemoryObjectStore()
    async with running_node(hand_run_config(), log_store, object_store) as node:
        await node.create_topic("t", 1)
        async with anyio.create_task_group() as tg:  # sent together: one batch, one extent
            tg.start_soon(node.produce, "t", 0, [Record(None, b"a", 700), Record(None, b"b", 50)])
            tg.start_soon(node.produce, "t", 0, [Record(None, b"c", 90), Record(None, b"d", 900)])
        await node.produce("t", 0, [Record(None, b"e", 300), Record(None, b"f", NO_TIMESTAMP)])
        pid = node.partition("t", 0).row.pid
        placeholders = [r.entry for r in log_store.logs[pid] if isinstance(r.entry, Placeholder)]
        assert [(p.record_count, p.max_timestamp_ms) for p in placeholders] == [(4, 900), (2, 300)]
        # Which of the two requests went first is the loop's choice (the deterministic loop
        # draws the order of tasks ready together): the extent says.
        first = placeholders[0]
        data = await object_store.get(first.object_key, first.byte_offset, first.byte_length)
        values = [r.value for r in decode_extent(data, first.checksum, first.record_count, "t/0")]
        assert sorted([values[:2], values[2:]]) == [[b"a", b"b"], [b"c", b"d"]]
        assert await node.reconciler.run_round() == 1
        assert [row.max_timestamp_ms for row in log_store.l1.values()] == [900]
        assert await node.offset_for_time("t", 0, 800) == (values.index(b"d"), 900)
        # The first record at or after 100: a (700) if its request went first, else d (900).
        expected = (0, 700) if values[0] == b"a" else (1, 900)
        assert await node.offset_for_time("t", 0, 100) == expected


@pytest.mark.parametrize(
    ("l1_extents", "l0_extents", "start", "answer", "gets"),
    [
        (L1_EXTENTS, L0_EXTENTS, 0, (11, 1000), 1),  # in L0's last extent: only it is read
        ([[100, 3000, 200], [500]], L0_EXTENTS, 0, (1, 3000), 1),  # in L1's first object
        # the largest (3000, offset 1) is below the start offset: A is read to find what it
        # holds at or above the start (200), then the largest above it (1000) is read
        ([[100, 3000, 200], [500]], L0_EXTENTS, 2, (7, 1000), 2),
        ([[100, 1000], [1000]], [[1000, 5]], 0, (1, 1000), 1),  # a tie: the first record
        ([[NO_TIMESTAMP]], [[NO_TIMESTAMP, NO_TIMESTAMP]], 0, (-1, -1), 0),  # no timestamps
    ],
)
@in_virtual_time
async def test_the_largest_timestamp_is_found_reading_only_the_extent_that_holds_it(
    l1_extents: list[list[int]], l0_extents: list[list[int]], start: int, answer: tuple[int, int], gets: int
):
    """ListOffsets -3 (KIP-734) compares the kept largest timestamps of rows and placeholders,
    then reads one extent: the first holding the largest (not a scan of the partition)."""
    objects = CountingObjectStore(MemoryObjectStore())
    async with running_node(uncached_config(), MemoryLogStore(), objects) as node:
        await fill(node, l1_extents, l0_extents)
        if start:
            assert await node.delete_records("t", 0, start) == start
        timestamps = [t for extent in l1_extents + l0_extents for t in extent]
        assert brute_force_max(timestamps, start) == answer
        assert await largest(node, objects) == (answer, gets)
