"""The readers' cache of whole L0 objects (`actors/l0_cache.py`): one GET per object for the
extents of all its partitions, shared by reads in flight at once; the memory bound (objects
held plus GETs in flight) at every step; least-recently-used eviction; the fall-backs to a
ranged GET of one extent; and a node's reads through it (partitions read one after another
share the GETs of the objects they have in common)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from itertools import pairwise

import anyio
import pytest

from levelzero.actors.gc import GcConfig
from levelzero.actors.l0_cache import L0ObjectCache, l0_object_bytes_bound
from levelzero.actors.node import Node
from levelzero.actors.reader import FetchResult
from levelzero.core.entries import Placeholder
from levelzero.core.errors import ObjectNotFound, StorageError
from levelzero.core.keys import L0_ROOT, format_l0_key
from levelzero.core.l0format import Record
from levelzero.storage.counting_store import CountingObjectStore
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import iter_objects
from levelzero.testing.gated_store import GatedStore
from levelzero.testing.nodes import hand_run_config, running_node
from levelzero.testing.virtual_time import in_virtual_time

SIZE = 1000  # bytes of each object


def key(i: int) -> str:
    return f"level_zero/data/{i:03}/{1:018}/object-{i}"


def body(i: int) -> bytes:
    return bytes((i * 7 + b) % 256 for b in range(SIZE))


async def store_with(objects: int) -> GatedStore:
    store = GatedStore()
    for i in range(objects):
        await store.put(key(i), body(i))
    return store


def held(cache: L0ObjectCache) -> int:
    stats = cache.statistics()
    assert stats.held_bytes + stats.inflight_bytes <= stats.bytes_max, stats
    return stats.held_bytes


@in_virtual_time
async def test_extents_of_one_object_are_sliced_from_one_get():
    store = await store_with(1)
    cache = L0ObjectCache(store, bytes_max=10 * SIZE, object_bytes_max=2 * SIZE)
    extents = [(0, 100), (100, 250), (350, 650), (990, 10)]
    for offset, length in extents:
        assert await cache.get(key(0), offset, length) == body(0)[offset : offset + length]
    assert store.ranges == [(key(0), 0, 2 * SIZE)]  # the object, whole: no ranged GETs
    stats = cache.statistics()
    assert (stats.loads, stats.hits, stats.shared, stats.uncached_gets) == (1, 3, 0, 0)
    assert stats.hit_ratio == 0.75 and held(cache) == SIZE and stats.objects == 1


@in_virtual_time
async def test_reads_in_flight_at_once_share_the_objects_get():
    """As the partitions of one Kafka fetch, read concurrently: 8 reads of 8 extents of one
    object wait for the first one's GET instead of making their own."""
    store = await store_with(1)
    store.gate = anyio.Event()
    cache = L0ObjectCache(store, bytes_max=10 * SIZE, object_bytes_max=2 * SIZE)
    got: dict[int, bytes] = {}

    async def read(p: int) -> None:
        got[p] = await cache.get(key(0), p * 100, 100)

    async with anyio.create_task_group() as tg:
        for p in range(8):
            tg.start_soon(read, p)
        await anyio.wait_all_tasks_blocked()
        assert cache.statistics().inflight_bytes == 2 * SIZE and held(cache) == 0
        store.gate.set()
    assert got == {p: body(0)[p * 100 : p * 100 + 100] for p in range(8)}
    assert len(store.ranges) == 1
    stats = cache.statistics()
    assert (stats.loads, stats.shared, stats.hits, stats.inflight_bytes) == (1, 7, 0, 0)


@in_virtual_time
async def test_the_bound_holds_and_the_least_recently_used_object_goes_first():
    """Room for three objects' loads: a fourth evicts the least recently used (object 1, since
    object 0 was read again), and every step keeps held + in flight within the bound."""
    store = await store_with(5)
    cache = L0ObjectCache(store, bytes_max=3 * SIZE, object_bytes_max=SIZE)
    for i in range(3):
        await cache.get(key(i), 0, 10)
        assert held(cache) == (i + 1) * SIZE
    await cache.get(key(0), 10, 10)  # object 0 is now the most recently used
    await cache.get(key(3), 0, 10)
    assert held(cache) == 3 * SIZE
    stats = cache.statistics()
    assert (stats.evictions, stats.loads, stats.hits) == (1, 4, 1)
    loads = len(store.ranges)
    assert await cache.get(key(0), 20, 5) == body(0)[20:25]  # kept
    assert await cache.get(key(2), 20, 5) == body(2)[20:25]  # kept
    assert len(store.ranges) == loads
    assert await cache.get(key(1), 20, 5) == body(1)[20:25]  # evicted: loaded again
    assert len(store.ranges) == loads + 1
    assert cache.statistics().evictions == 2 and held(cache) == 3 * SIZE


@in_virtual_time
async def test_without_room_beside_the_gets_in_flight_an_extent_is_read_alone():
    """Two loads in flight fill the bound (each counted at `object_bytes_max` until it
    answers): a read of a third object gets its own ranged GET and holds nothing."""
    store = await store_with(3)
    store.gate = anyio.Event()
    cache = L0ObjectCache(store, bytes_max=2 * SIZE, object_bytes_max=SIZE)
    async with anyio.create_task_group() as tg:
        tg.start_soon(cache.get, key(0), 0, 10)
        tg.start_soon(cache.get, key(1), 0, 10)
        await anyio.wait_all_tasks_blocked()
        assert cache.statistics().inflight_bytes == 2 * SIZE
        store.gate.set()
        assert await cache.get(key(2), 5, 10) == body(2)[5:15]
    assert (key(2), 5, 10) in store.ranges
    stats = cache.statistics()
    assert (stats.loads, stats.uncached_gets, stats.objects) == (2, 1, 2) and held(cache) == 2 * SIZE


@in_virtual_time
async def test_an_extent_past_the_bytes_loaded_is_read_alone():
    """An object larger than a load asks for: its first bytes are kept, an extent beyond them
    is read with its own ranged GET."""
    store = await store_with(1)
    cache = L0ObjectCache(store, bytes_max=10 * SIZE, object_bytes_max=SIZE // 2)
    assert await cache.get(key(0), 100, 50) == body(0)[100:150]
    assert await cache.get(key(0), 600, 50) == body(0)[600:650]
    assert store.ranges == [(key(0), 0, SIZE // 2), (key(0), 600, 50)]
    assert held(cache) == SIZE // 2


@in_virtual_time
async def test_a_failed_load_fails_its_read_and_the_waiting_reads_get_their_own():
    store = await store_with(1)
    store.gate = anyio.Event()
    store.fail_next = 1
    cache = L0ObjectCache(store, bytes_max=10 * SIZE, object_bytes_max=SIZE)
    outcomes: dict[int, object] = {}

    async def read(p: int) -> None:
        try:
            outcomes[p] = await cache.get(key(0), p * 10, 10)
        except StorageError as exc:
            outcomes[p] = exc

    async with anyio.create_task_group() as tg:
        for p in range(3):
            tg.start_soon(read, p)
        await anyio.wait_all_tasks_blocked()
        store.gate.set()
    failed = [p for p, outcome in outcomes.items() if isinstance(outcome, StorageError)]
    assert len(failed) == 1  # the read whose load failed (whichever started first)
    assert {p: outcomes[p] for p in range(3) if p not in failed} == {
        p: body(0)[p * 10 : p * 10 + 10] for p in range(3) if p not in failed
    }
    stats = cache.statistics()
    assert (stats.loads, stats.uncached_gets, stats.objects, stats.inflight_bytes) == (0, 2, 0, 0)
    with pytest.raises(ObjectNotFound):
        await cache.get(key(9), 0, 10)  # a missing object: as its ranged GET would
    assert cache.statistics().inflight_bytes == 0 and held(cache) == 0


@in_virtual_time
async def test_a_cache_of_zero_bytes_reads_each_extent_alone():
    store = await store_with(1)
    cache = L0ObjectCache(store, bytes_max=0, object_bytes_max=SIZE)
    for p in range(4):
        assert await cache.get(key(0), p * 10, 10) == body(0)[p * 10 : p * 10 + 10]
    assert store.ranges == [(key(0), p * 10, 10) for p in range(4)]
    assert cache.statistics().uncached_gets == 4 and held(cache) == 0


def test_a_load_asks_for_two_batches():
    assert l0_object_bytes_bound(4 << 20) == 8 << 20


PARTITIONS = 8
WINDOWS = 5


@pytest.mark.parametrize(("cache_bytes", "gets"), [(64 << 20, WINDOWS), (0, WINDOWS * PARTITIONS)])
@in_virtual_time
async def test_partitions_read_one_after_another_share_the_gets_of_their_objects(cache_bytes: int, gets: int):
    """Consumers of different partitions close in time: 8 partitions written in the same 5
    batch windows, fetched one partition after another, make 5 GETs (40 without the cache);
    every record reads back as written."""
    objects = CountingObjectStore(MemoryObjectStore())
    config = replace(hand_run_config(), l0_cache_bytes_max=cache_bytes)
    async with running_node(config, MemoryLogStore(), objects) as node:
        await node.create_topic("t", PARTITIONS)
        for w in range(WINDOWS):
            async with anyio.create_task_group() as tg:
                for p in range(PARTITIONS):
                    records = [Record(b"k", b"%d/%d/%d" % (w, p, i)) for i in range(3)]
                    tg.start_soon(node.produce, "t", p, records)
        assert objects.snapshot().l0_puts == WINDOWS
        before = objects.snapshot()
        for p in range(PARTITIONS):
            fetched = await node.fetch("t", p, 0, 1 << 20)
            assert fetched.tier == "l0"
            assert [(r.offset, r.key, r.value) for r in fetched.records] == [
                (w * 3 + i, b"k", b"%d/%d/%d" % (w, p, i)) for w in range(WINDOWS) for i in range(3)
            ]
        assert (objects.snapshot() - before).l0_gets == gets


@in_virtual_time
async def test_a_load_is_counted_at_the_objects_loaded_lately_and_a_larger_one_makes_room():
    """Before any load, a GET in flight counts at the most a load asks for; after, at the
    largest object loaded lately (so more loads fit beside the objects held). An object larger
    than its reservation evicts the least recently used when it lands; the bound holds."""
    store = await store_with(3)
    await store.put(key(9), bytes(3 * SIZE))  # three times the others
    cache = L0ObjectCache(store, bytes_max=4 * SIZE, object_bytes_max=4 * SIZE)
    store.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(cache.get, key(0), 0, 10)
        await anyio.wait_all_tasks_blocked()
        assert cache.statistics().inflight_bytes == 4 * SIZE  # nothing known yet
        store.gate.set()
    store.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(cache.get, key(1), 0, 10)
        tg.start_soon(cache.get, key(9), 0, 10)
        await anyio.wait_all_tasks_blocked()
        assert cache.statistics().inflight_bytes == 2 * SIZE and held(cache) == SIZE
        store.gate.set()
    stats = cache.statistics()
    assert held(cache) == 4 * SIZE and stats.objects == 2 and stats.evictions == 1
    assert await cache.get(key(9), 5, 5) == bytes(5)  # kept
    assert cache.statistics().hits == 1


async def _scan(cache: L0ObjectCache, objects: range, extents: int, length: int) -> None:
    """A catch-up scan: each object in turn read for `extents` extents of `length` bytes
    (partitions reading one after another), never read again."""
    for i in objects:
        for e in range(extents):
            offset = e * length
            assert await cache.get(key(i), offset, length) == body(i)[offset : offset + length]


async def _scan_watching(
    cache: L0ObjectCache, objects: range, extents: int, length: int
) -> list[tuple[int, int]]:
    """`_scan`, and each change of the cache's load rate: (evictions then, one miss in N)."""
    changes = []
    for i in objects:
        await _scan(cache, range(i, i + 1), extents, length)
        stats = cache.statistics()
        if not changes or changes[-1][1] != stats.load_every:
            changes.append((stats.evictions, stats.load_every))
    return changes


@in_virtual_time
async def test_while_objects_are_evicted_with_a_few_small_extents_read_misses_load_ever_less_often():
    """A catch-up scan with room for two objects, each read for three extents of 30 bytes
    before it is evicted: every object served reads besides the one that loaded it, but 90
    of its 1,000 bytes (under an eighth): a whole-object GET read 11 times the bytes asked for
    to save two GETs. That is thrashing: at each 32 evictions, misses load their objects half
    as often (the others read their extent alone), up to one in 64."""
    store = await store_with(1200)
    cache = L0ObjectCache(store, bytes_max=2 * SIZE, object_bytes_max=SIZE)
    changes = await _scan_watching(cache, range(1200), 3, 30)
    assert changes == [(0, 1), (32, 2), (64, 4), (96, 8), (128, 16), (160, 32), (192, 64)]
    stats = cache.statistics()
    alone = [r for r in store.ranges if r[1:] != (0, SIZE)]
    assert all(r[2] == 30 for r in alone) and len(alone) == stats.uncached_gets
    assert stats.loads + stats.hits + stats.uncached_gets == 3 * 1200
    # Every miss loading: 1,200 GETs of 1,000 bytes. Here a quarter of the bytes (2.7 times
    # the GETs: those of the extents read alone, as without the cache).
    get_bytes = stats.loads * SIZE + 30 * stats.uncached_gets
    assert (stats.loads, stats.uncached_gets, get_bytes) == (214, 3056, 305_680), stats


@in_virtual_time
async def test_a_cyclic_scan_one_object_wider_than_the_cache_keeps_most_of_what_it_holds():
    """Five objects read in turn, pass after pass, three extents of 30 bytes each, with room
    for four: least-recently-used eviction alone evicts every object just before it is read
    again (in 48 passes, 240 loads of 1,000 bytes, two hits each). Loading one miss in four
    (the rate the judgements settle at), the objects held stay and serve their extents pass
    after pass: 96 loads, 505 hits, 119 extents read alone."""
    store = await store_with(5)
    cache = L0ObjectCache(store, bytes_max=4 * SIZE, object_bytes_max=SIZE)
    for _ in range(48):
        await _scan(cache, range(5), 3, 30)
    stats = cache.statistics()
    assert (stats.loads, stats.hits, stats.uncached_gets, stats.load_every) == (96, 505, 119, 4), stats


@in_virtual_time
async def test_once_objects_are_read_for_more_of_their_bytes_again_misses_load_more_often():
    """After a thrashing scan brought loads down to one miss in 16, objects read whole (25
    extents of 40 bytes): each 32 evictions, loads twice as often, back to every miss."""
    store = await store_with(600)
    cache = L0ObjectCache(store, bytes_max=2 * SIZE, object_bytes_max=SIZE)
    assert (await _scan_watching(cache, range(300), 3, 30))[-1][1] == 16
    changes = await _scan_watching(cache, range(300, 600), 25, 40)
    assert [every for _, every in changes] == [16, 8, 4, 2, 1], changes
    assert all(later - earlier == 32 for (earlier, _), (later, _) in pairwise(changes[1:]))


@in_virtual_time
async def test_objects_read_for_an_eighth_of_their_bytes_before_eviction_are_loaded_whole():
    """The scan with four extents of 40 bytes: 160 bytes of an object of 1,000 served
    before its eviction, 16%, over an eighth: a whole-object GET per object (instead of four
    ranged ones) stays worth its bytes, and every miss loads its object."""
    store = await store_with(34 + 40)
    cache = L0ObjectCache(store, bytes_max=2 * SIZE, object_bytes_max=SIZE)
    assert await _scan_watching(cache, range(34 + 40), 4, 40) == [(0, 1)]
    stats = cache.statistics()
    assert (stats.loads, stats.hits, stats.uncached_gets, stats.evictions) == (74, 3 * 74, 0, 72)
    assert all(r[1:] == (0, SIZE) for r in store.ranges)


def l0_key(epoch: int, i: int) -> str:
    return format_l0_key(i % 1000, epoch, f"{i:032x}")


@in_virtual_time
async def test_a_release_drops_the_objects_at_or_below_the_watermark_and_only_those():
    """Objects of epochs 1, 2 and 3 held: releasing through 2 drops the four of epochs 1 and 2
    (counted as released, not evicted: the rate of loads is not judged by them) and their
    bytes; epoch 3's stay and are served without a GET; a lower watermark after changes
    nothing."""
    store = GatedStore()
    keys = {epoch: [l0_key(epoch, 10 * epoch + i) for i in range(2)] for epoch in (1, 2, 3)}
    for i, k in enumerate(k for ks in keys.values() for k in ks):
        await store.put(k, body(i))
    cache = L0ObjectCache(store, bytes_max=10 * SIZE, object_bytes_max=SIZE)
    for ks in keys.values():
        for k in ks:
            await cache.get(k, 0, 10)
    assert held(cache) == 6 * SIZE
    assert cache.release_through(2) == 4
    stats = cache.statistics()
    assert (stats.objects, stats.released, stats.evictions) == (2, 4, 0) and held(cache) == 2 * SIZE
    gets = len(store.ranges)
    for k in keys[3]:
        await cache.get(k, 20, 10)
    assert len(store.ranges) == gets and cache.statistics().hits == 2
    assert cache.release_through(1) == 0 and cache.statistics().objects == 2
    await cache.get(keys[1][0], 0, 10)  # asked again (no reader does): read, and not kept
    assert cache.statistics().objects == 2 and held(cache) == 2 * SIZE


@in_virtual_time
async def test_an_object_loading_when_it_is_released_serves_its_reads_and_is_not_kept():
    store = GatedStore()
    k = l0_key(1, 0)
    await store.put(k, body(0))
    store.gate = anyio.Event()
    cache = L0ObjectCache(store, bytes_max=10 * SIZE, object_bytes_max=SIZE)
    got: list[bytes] = []

    async def read() -> None:
        got.append(await cache.get(k, 5, 10))

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(read)
        await anyio.wait_all_tasks_blocked()
        assert cache.release_through(1) == 0  # nothing held yet
        store.gate.set()
    assert got == [body(0)[5:15]] * 2 and len(store.ranges) == 1
    stats = cache.statistics()
    assert (stats.objects, stats.inflight_bytes, stats.loads, stats.shared) == (0, 0, 1, 1)
    assert held(cache) == 0


@in_virtual_time
async def test_a_gc_round_releases_the_objects_it_collects_from_the_readers_cache():
    """Records read from L0 leave their objects in the cache; once reconciled and collected by
    the GC, the cache holds none of them and its bytes fall to the objects still in L0 (a
    later window's, above `M`); the same offsets read again come from L1, record for record,
    without loading a collected object again."""
    objects = CountingObjectStore(MemoryObjectStore())
    config = replace(hand_run_config(), gc=GcConfig(enabled=False, grace_s=0.0))
    async with running_node(config, MemoryLogStore(), objects) as node:
        await node.create_topic("t", PARTITIONS)
        expected = await _produce_windows(node, range(WINDOWS))
        for p in range(PARTITIONS):
            fetched = await node.fetch("t", p, 0, 1 << 20)
            assert fetched.tier == "l0" and _values(fetched) == expected[p]
        collected = {info.key: info.size async for info in iter_objects(objects, L0_ROOT)}
        assert len(collected) == WINDOWS
        cache = node.l0_cache
        assert (cache.statistics().objects, cache.statistics().held_bytes) == (
            WINDOWS,
            sum(collected.values()),
        )
        assert await node.reconciler.run_round() == PARTITIONS
        for _ in range(3):  # M passes the objects once the reconciled log passes their window
            await node.epochs.advance()
            await node.housekeeper.run_round(force=True)
            await node.reconciler.run_round()
            await node.gc.run_round()
        assert not [info async for info in iter_objects(objects, L0_ROOT)]  # all collected
        stats = cache.statistics()
        assert (stats.objects, stats.held_bytes, stats.released) == (0, 0, WINDOWS)

        later = await _produce_windows(node, [WINDOWS])  # a window above M, read from L0
        assert _values(await node.fetch("t", 0, len(expected[0]), 1 << 20)) == later[0]
        [kept] = [info async for info in iter_objects(objects, L0_ROOT)]
        await node.gc.run_round()
        stats = cache.statistics()
        assert (stats.objects, stats.held_bytes, stats.released) == (1, kept.size, WINDOWS)

        loads = stats.loads
        for p in range(PARTITIONS):
            fetched = await node.fetch("t", p, 0, 1 << 20)
            assert fetched.tier == "l1+l0"  # the collected windows from L1, the later from L0
            assert _values(fetched) == expected[p] + later[p]
        assert cache.statistics().loads == loads
        for key in collected:  # not held: asked for, the cache GETs it, and it is gone
            with pytest.raises(ObjectNotFound):
                await cache.get(key, 0, 1)


async def _produce_windows(node: Node, windows: Iterable[int]) -> dict[int, list[bytes]]:
    """One L0 object per window, three records of every partition in each."""
    values: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for w in windows:
        async with anyio.create_task_group() as tg:
            for p in range(PARTITIONS):
                batch = [b"%d/%d/%d" % (w, p, i) for i in range(3)]
                values[p] += batch
                tg.start_soon(node.produce, "t", p, [Record(b"k", v) for v in batch])
    return values


def _values(fetched: FetchResult) -> list[bytes | None]:
    return [r.value for r in fetched.records]


@in_virtual_time
async def test_an_object_a_registered_reader_may_still_read_is_neither_collected_nor_released():
    """A reader registered before the reconciler passed the objects (as a fetch racing it:
    it read the placeholders above the old LRO) pins M(p): the rounds' M stays below the
    objects, so the GC keeps them and the cache keeps serving them; once the reader is done,
    the next rounds collect and release them."""
    objects = CountingObjectStore(MemoryObjectStore())
    config = replace(hand_run_config(), gc=GcConfig(enabled=False, grace_s=0.0))
    async with running_node(config, MemoryLogStore(), objects) as node:
        await node.create_topic("t", PARTITIONS)
        expected = await _produce_windows(node, range(WINDOWS))
        actor = node.partition("t", 0)
        reader_id, _ = actor.register_reader()
        assert _values(await node.fetch("t", 0, 0, 1 << 20)) == expected[0]  # loads the objects
        assert await node.reconciler.run_round() == PARTITIONS

        async def rounds() -> None:
            for _ in range(3):
                await node.epochs.advance()
                await node.housekeeper.run_round(force=True)
                await node.reconciler.run_round()
                await node.gc.run_round()

        await rounds()
        assert len([info async for info in iter_objects(objects, L0_ROOT)]) == WINDOWS
        stats = node.l0_cache.statistics()
        assert (stats.objects, stats.released) == (WINDOWS, 0)
        loads = stats.loads
        for p in range(PARTITIONS):  # the pinned objects still serve reads of their extents
            for record in await node.log_store.read_placeholders(node.partition("t", p).row.pid, 0, 64):
                extent = record.entry
                assert isinstance(extent, Placeholder)
                await node.l0_cache.get(extent.object_key, extent.byte_offset, extent.byte_length)
        assert node.l0_cache.statistics().loads == loads
        actor.release_reader(reader_id)
        await rounds()
        assert not [info async for info in iter_objects(objects, L0_ROOT)]
        stats = node.l0_cache.statistics()
        assert (stats.objects, stats.held_bytes, stats.released) == (0, 0, WINDOWS)
