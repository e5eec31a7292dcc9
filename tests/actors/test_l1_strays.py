"""The sweep of a live partition's L1 key prefix: objects no row of it names, older than the
grace, go (`L1Catalog.sweep_strays`, run by the reconciler at each term's start here and then
every `l1_stray_sweep_interval_s`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from levelzero.actors.reconciler import STRAY_SWEEP_RETRY_S, ReconcilerConfig
from levelzero.core.errors import InvalidInput
from levelzero.core.keys import format_l1_key, new_uuid
from levelzero.core.l0format import Record
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import L1Row, L1State
from levelzero.testing.nodes import hand_run_config, running_node
from levelzero.testing.virtual_time import in_virtual_time

GRACE_S = 600.0
INTERVAL_S = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def sweeping_config():
    config = hand_run_config()
    return replace(
        config,
        reconciler=replace(config.reconciler, l1_stray_grace_s=GRACE_S, l1_stray_sweep_interval_s=INTERVAL_S),
    )


class World:
    """A node on memory stores; the object store stamps objects with a clock of its own."""

    def __init__(self) -> None:
        self.wall = Clock()
        self.store_clock = Clock()
        self.log_store = MemoryLogStore()
        self.objects = MemoryObjectStore(clock=self.store_clock)
        self._uuids = iter(range(1, 1_000_000))

    def key(self, partition: int, base: int = 1000) -> str:
        return format_l1_key("t", partition, base, base + 9, 0, new_uuid(next(self._uuids)))

    async def put_aged(self, key: str, age_s: float) -> str:
        """An object under `key` the store last modified `age_s` before the node's now."""
        self.store_clock.now = self.wall.now - age_s
        await self.objects.put(key, b"stray")
        return key

    def stored(self, key: str) -> bool:
        return key in self.objects._objects


async def produce_and_reconcile(node, partition: int) -> None:
    for i in range(3):
        await node.produce("t", partition, [Record(None, f"v{i}".encode())])
    await node.reconciler.run_round()


async def read_values(node, partition: int) -> list[bytes]:
    result = await node.fetch("t", partition, 0, 1 << 20)
    return [r.value for r in result.records]


@in_virtual_time
async def test_a_stray_older_than_the_grace_is_deleted_and_a_younger_one_kept():
    w = World()
    async with running_node(sweeping_config(), w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 2)
        old = await w.put_aged(w.key(0), GRACE_S + 1)
        young = await w.put_aged(w.key(0), GRACE_S - 1)
        await produce_and_reconcile(node, 0)  # the term's first round: the sweep runs
        assert not w.stored(old)
        assert w.stored(young)
        assert node.l1.strays_deleted == 1
        assert node.reconciler.stats.stray_sweeps == 2  # both partitions, once each
        assert await read_values(node, 0) == [b"v0", b"v1", b"v2"]  # its own object stays


@in_virtual_time
async def test_every_object_a_row_names_is_kept_unless_its_delete_finished():
    w = World()
    async with running_node(sweeping_config(), w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 1)
        await produce_and_reconcile(node, 0)
        reconciled = {r.key for r in await w.log_store.l1_list(node.partition("t", 0).row.pid)}
        assert len(reconciled) == 1
        w.wall.now += INTERVAL_S  # the next sweep is due
        pid = node.partition("t", 0).row.pid
        named = {}
        for i, state in enumerate(L1State.ALL):
            key = await w.put_aged(w.key(0, base=1000 + 10 * i), 10 * GRACE_S)
            # Updated just now: the collection of abandoned copies and deletes leaves them be.
            await w.log_store.l1_insert(
                L1Row(key, pid, 1000 + 10 * i, 1009 + 10 * i, 0, 0, 5, state, w.wall.now, w.wall.now)
            )
            named[state] = key
        stray = await w.put_aged(w.key(0, base=2000), 10 * GRACE_S)
        await node.reconciler.run_round()
        assert not w.stored(stray)
        # A DELETE_FINISHED row's key holds an upload that landed after its delete: a stray.
        kept = set(L1State.ALL) - {L1State.DELETE_FINISHED}
        assert {state for state, key in named.items() if w.stored(key)} == kept
        assert all(w.stored(key) for key in reconciled)
        assert node.l1.strays_deleted == 2


@in_virtual_time
async def test_a_partitions_sweep_leaves_a_prefix_sharing_partitions_objects_alone():
    w = World()
    async with running_node(sweeping_config(), w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 11)
        mine = await w.put_aged(w.key(1), 10 * GRACE_S)
        tenth = await w.put_aged(w.key(10), 10 * GRACE_S)  # level_one/t/10/… starts with level_one/t/1
        assert await node.l1.sweep_strays(node.partition("t", 1), GRACE_S) == 1
        assert not w.stored(mine)
        assert w.stored(tenth)


@in_virtual_time
async def test_a_partition_is_swept_at_its_terms_start_then_once_per_interval():
    w = World()
    async with running_node(sweeping_config(), w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 1)
        await node.reconciler.run_round()  # the first sweep
        assert node.reconciler.stats.stray_sweeps == 1
        lists = w.objects.statistics().lists
        stray = await w.put_aged(w.key(0), 10 * GRACE_S)
        w.wall.now += INTERVAL_S - 1
        await node.reconciler.run_round()
        assert w.stored(stray)
        assert node.reconciler.stats.stray_sweeps == 1
        assert w.objects.statistics().lists == lists  # no LIST before the interval
        w.wall.now += 15  # due, and the next round visiting every partition (copy_deadline_s / 4)
        await node.reconciler.run_round()
        assert not w.stored(stray)
        assert node.reconciler.stats.stray_sweeps == 2


@in_virtual_time
async def test_a_paused_gc_holds_the_sweep_until_it_resumes():
    w = World()
    async with running_node(sweeping_config(), w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 1)
        stray = await w.put_aged(w.key(0), 10 * GRACE_S)
        node.gc.pause()
        await node.reconciler.run_round()
        assert w.stored(stray)
        node.gc.resume()
        w.wall.now += 15  # the next round visiting every partition (copy_deadline_s / 4)
        await node.reconciler.run_round()
        assert not w.stored(stray)


@in_virtual_time
async def test_a_failed_sweep_is_a_warning_and_is_tried_again_later(caplog):
    w = World()
    async with running_node(sweeping_config(), w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 1)
        await produce_and_reconcile(node, 0)  # the first sweep, with nothing to delete
        stray = await w.put_aged(w.key(0), 10 * GRACE_S)
        w.objects.faults.fail_deletes([stray], count=1)
        w.wall.now += INTERVAL_S
        await node.reconciler.run_round()
        assert w.stored(stray)
        assert node.reconciler.stats.stray_sweep_errors == 1
        assert node.reconciler.health.get("t/0") is None  # not a failing reconciliation
        assert "sweeping t/0 for stray L1 objects failed" in caplog.text
        w.wall.now += STRAY_SWEEP_RETRY_S
        await node.reconciler.run_round()
        assert not w.stored(stray)
        assert await read_values(node, 0) == [b"v0", b"v1", b"v2"]


@in_virtual_time
async def test_a_round_sweeps_a_bounded_number_of_partitions_and_the_rest_later():
    w = World()
    async with running_node(sweeping_config(), w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 40)
        strays = [await w.put_aged(w.key(p), 10 * GRACE_S) for p in range(40)]
        rounds = 0
        while any(w.stored(key) for key in strays):
            await node.reconciler.run_round()
            rounds += 1
            assert rounds <= 3
        assert rounds == 3  # 16 + 16 + 8
        assert node.reconciler.stats.stray_sweeps == 40


@pytest.mark.parametrize(
    "fields",
    [
        {"l1_stray_grace_s": 59.0},
        {"l1_stray_grace_s": 31 * 86_400.0},
        {"l1_stray_sweep_interval_s": 59.0},
        {"l1_stray_sweep_interval_s": -1.0},
        {"l1_stray_sweep_interval_s": 31 * 86_400.0},
    ],
)
def test_stray_times_out_of_bounds_are_refused(fields):
    with pytest.raises(InvalidInput):
        ReconcilerConfig(**fields)


@in_virtual_time
async def test_a_zero_interval_sweeps_nothing():
    w = World()
    config = sweeping_config()
    config = replace(config, reconciler=replace(config.reconciler, l1_stray_sweep_interval_s=0.0))
    async with running_node(config, w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 1)
        stray = await w.put_aged(w.key(0), 10 * GRACE_S)
        lists = w.objects.statistics().lists
        await node.reconciler.run_round()
        assert w.stored(stray)
        assert w.objects.statistics().lists == lists


@in_virtual_time
async def test_a_deleted_partition_is_no_longer_kept_due_for_a_sweep():
    # What the reconciler keeps per partition for the sweeps is bounded by the partitions it
    # leads: topics that come and go leave nothing behind.
    w = World()
    async with running_node(sweeping_config(), w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 1)
        await node.create_topic("u", 2)
        await node.reconciler.run_round()  # each partition's first sweep
        assert len(node.reconciler._strays_due) == 3
        assert len(node.reconciler._recovered) == 3  # each partition's term collected
        await node.delete_topic("u")
        await node.reconciler.run_round()
        assert set(node.reconciler._strays_due) == {node.partition("t", 0).row.pid}
        assert set(node.reconciler._recovered) == {node.partition("t", 0).row.pid}


@in_virtual_time
async def test_a_deleted_partition_leaves_nothing_cached_in_the_l1_catalog():
    # The lineage, the compacted keys and the start offset's moves are cached per partition:
    # a partition no longer led here (its topic deleted) is dropped from each.
    w = World()
    async with running_node(sweeping_config(), w.log_store, w.objects, wall_clock=w.wall) as node:
        await node.create_topic("t", 1)
        await node.create_topic("u", 2)
        catalog = node.reconciler.catalog
        for topic, partition in (("t", 0), ("u", 0), ("u", 1)):
            actor = node.partition(topic, partition)
            await catalog.refresh(actor)
            catalog.note_start_moved(actor, 0, 1, "retention")
        kept = {node.partition("t", 0).row.pid}
        caches = (catalog._valid, catalog._compacted, catalog._start_moves)
        assert all(len(cache) == 3 for cache in caches)
        await node.delete_topic("u")
        await node.reconciler.run_round()
        assert [set(cache) for cache in caches] == [kept, kept, kept]
