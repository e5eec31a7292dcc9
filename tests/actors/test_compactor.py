"""The compactor over a running node: the latest record per key at its offset, gaps read as
Kafka reads them, tombstones until delete.retention.ms, the lag and the reconciled offset
respected, superseded objects deleted only after the result is accepted, a zombie's result
refused and its object collected, reads in flight never failing."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import anyio
import pytest

from levelzero.actors.intake import ProduceIntake
from levelzero.actors.node import Node
from levelzero.core.errors import KeylessRecord, StorageError
from levelzero.core.keys import L1_ROOT, parse_l1_key
from levelzero.core.l0format import Record
from levelzero.storage.counting_store import CountingObjectStore
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import DeleteResult, L1State, ObjectStore
from levelzero.testing.faulty_store import FaultSpec, FaultyObjectStore
from levelzero.testing.nodes import hand_run_config, running_node


class WallClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "60000"}


@dataclass
class CompactedTopic:
    """A hand-run node (`hand_run_config`) with the compacted topic "c" of one partition, its
    stores and its wall clock."""

    node: Node
    log_store: MemoryLogStore
    objects: ObjectStore
    wall: WallClock

    async def produce(self, pairs: list[tuple[bytes, bytes | None]]) -> None:
        """Each (key, value) a produce of its own, stamped with the wall clock."""
        for key, value in pairs:
            await self.node.produce("c", 0, [Record(key, value, timestamp_ms=round(self.wall.now * 1000))])

    async def reconciled(self, pairs: list[tuple[bytes, bytes | None]]) -> None:
        """`pairs` produced, then reconciled into one L1 object."""
        await self.produce(pairs)
        assert await self.node.reconciler.run_round() == 1

    async def read_all(self, start: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
        out = []
        offset = start
        actor = self.node.partition("c", 0)
        for _ in range(1000):
            if offset >= actor.state.high_watermark:
                break
            result = await self.node.fetch("c", 0, offset, 1 << 20)
            out.extend((r.offset, r.key, r.value) for r in result.records)
            assert result.next_offset > offset
            offset = result.next_offset
        return out

    def l1_keys(self) -> set[str]:
        """The L1 objects in the (memory) object store."""
        assert isinstance(self.objects, MemoryObjectStore)
        return {k for k in self.objects._objects if k.startswith(L1_ROOT)}

    async def l1_keys_by_offset(self) -> list[str]:
        """Every L1 row's key, in offset order."""
        keys = [r.key for r in await self.log_store.l1_list()]
        return sorted(keys, key=lambda k: parse_l1_key(k).base_offset)

    @contextlib.asynccontextmanager
    async def restarted(self) -> AsyncIterator[CompactedTopic]:
        """A new node over the same stores and clock: this one's restart, once it stopped."""
        async with running_node(
            hand_run_config(), self.log_store, self.objects, wall_clock=self.wall
        ) as node:
            yield CompactedTopic(node, self.log_store, self.objects, self.wall)


@contextlib.asynccontextmanager
async def compacted_topic(
    objects: ObjectStore | None = None, topic_config: dict[str, str] = COMPACT
) -> AsyncIterator[CompactedTopic]:
    log_store, wall = MemoryLogStore(), WallClock()
    objects = MemoryObjectStore() if objects is None else objects
    async with running_node(hand_run_config(), log_store, objects, wall_clock=wall) as node:
        await node.create_topic("c", 1, topic_config)
        yield CompactedTopic(node, log_store, objects, wall)


async def test_compaction_keeps_the_latest_record_per_key_at_its_offset() -> None:
    async with compacted_topic() as t:
        await t.reconciled([(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1")])
        await t.reconciled([(b"b", b"2"), (b"a", b"3")])
        before = t.l1_keys()
        assert len(before) == 2
        await t.produce([(b"a", b"4")])  # above the reconciled offset: untouched, in L0
        assert await t.node.compactor.run_round() == 1
        assert await t.read_all() == [(3, b"c", b"1"), (4, b"b", b"2"), (5, b"a", b"3"), (6, b"a", b"4")]
        # A fetch at a removed offset returns the next record present.
        first = await t.node.fetch("c", 0, 1, 1 << 20)
        assert [r.offset for r in first.records][:1] == [3]
        after = t.l1_keys()
        assert len(after) == 1 and not (after & before)  # superseded objects deleted
        states = {r.key: r.state for r in await t.log_store.l1_list()}
        assert sorted(states.values()) == [
            L1State.COPY_FINISHED,
            L1State.DELETE_FINISHED,
            L1State.DELETE_FINISHED,
        ]
        status = t.node.compactor.partitions["c/0"]
        assert status.passes == 1 and status.records_removed == 3 and status.bytes_reclaimed > 0
        assert status.cleaner_offsets == {t.node.partition("c", 0).term: 5}
        # Nothing new above the cleaner offset: no pass.
        assert await t.node.compactor.run_round() == 0
        assert (
            t.node.compactor.partitions["c/0"].not_compacted == "no reconciled data above the cleaner offset"
        )


async def test_a_compacted_object_reads_whole_at_every_fetch_size() -> None:
    """Fetches of any byte budget step over compaction's gaps and end where they may: the
    records read from 0 on, a fetch after another, are the kept ones, whatever the budget
    (one that ended at a gap failed an assertion: Kafka consumers with a fetch size smaller
    than the compacted object got nothing)."""
    async with compacted_topic() as t:
        await t.reconciled([(b"k%d" % i, b"a%d" % i) for i in range(20)])
        await t.reconciled([(b"k%d" % i, b"b%d" % i) for i in range(0, 20, 2)])
        assert await t.node.compactor.run_round() == 1
        kept = [(o, b"k%d" % o, b"a%d" % o) for o in range(1, 20, 2)]
        kept += [(20 + i, b"k%d" % (2 * i), b"b%d" % (2 * i)) for i in range(10)]
        for max_bytes in range(1, 80):
            read, offset = [], 0
            for _ in range(100):
                if offset >= 30:
                    break
                result = await t.node.fetch("c", 0, offset, max_bytes)
                read.extend((r.offset, r.key, r.value) for r in result.records)
                assert result.next_offset > offset, (max_bytes, offset)
                offset = result.next_offset
            assert read == kept, max_bytes


async def test_records_stamped_in_the_future_are_cleanable_without_a_lag() -> None:
    """min.compaction.lag.ms 0 (the default): no record's time holds a pass back, as Kafka's
    cleaner looks at timestamps only for a positive lag. Records stamped an hour ahead (a
    producer's clock, event time) waited for that hour, the pass re-copying them meanwhile.
    With a lag they wait, as in Kafka."""
    hour_ahead = lambda t: round((t.wall.now + 3600) * 1000)  # noqa: E731
    async with compacted_topic() as t:
        for value in (b"1", b"2", b"3"):
            await t.node.produce("c", 0, [Record(b"a", value, timestamp_ms=hour_ahead(t))])
        assert await t.node.reconciler.run_round() == 1
        assert await t.node.compactor.run_round() == 1
        assert await t.read_all() == [(2, b"a", b"3")]
    async with compacted_topic(topic_config=COMPACT | {"min.compaction.lag.ms": "1000"}) as t:
        for value in (b"1", b"2"):
            await t.node.produce("c", 0, [Record(b"a", value, timestamp_ms=hour_ahead(t))])
        assert await t.node.reconciler.run_round() == 1
        t.wall.now += 2
        assert await t.node.compactor.run_round() == 0
        assert t.node.compactor.partitions["c/0"].not_compacted.startswith("nothing cleanable yet")


async def test_tombstones_stay_until_delete_retention_then_go() -> None:
    async with compacted_topic() as t:
        await t.reconciled([(b"a", b"1"), (b"a", None), (b"b", b"1")])
        assert await t.node.compactor.run_round() == 1
        assert await t.read_all() == [(1, b"a", None), (2, b"b", b"1")]
        t.wall.now += 61
        await t.reconciled([(b"b", b"2")])
        assert await t.node.compactor.run_round() == 1
        assert await t.read_all() == [(3, b"b", b"2")]  # the tombstone went, and no "a" came back
        assert t.node.compactor.partitions["c/0"].tombstones_dropped == 1


async def test_min_compaction_lag_holds_young_records() -> None:
    async with compacted_topic(topic_config={**COMPACT, "min.compaction.lag.ms": "10000"}) as t:
        await t.reconciled([(b"a", b"1"), (b"a", b"2")])
        assert await t.node.compactor.run_round() == 0
        assert "min.compaction.lag.ms" in (t.node.compactor.partitions["c/0"].not_compacted or "")
        t.wall.now += 11
        assert await t.node.compactor.run_round() == 1
        assert await t.read_all() == [(1, b"a", b"2")]


async def test_a_pass_that_removes_nothing_reclaims_nothing_rather_than_a_negative_count() -> None:
    # One record, dirty (ratio 1.0): its object rewritten comes out a few bytes larger; the
    # reclaimed count (a Prometheus counter) must not go down.
    async with compacted_topic() as t:
        await t.reconciled([(b"a", b"1")])
        (before,) = await t.log_store.l1_list()
        assert await t.node.compactor.run_round() == 1
        status = t.node.compactor.partitions["c/0"]
        assert status.records_removed == 0 and status.bytes_reclaimed == 0
        assert await t.read_all() == [(0, b"a", b"1")]
        after = [r for r in await t.log_store.l1_list() if r.state == L1State.COPY_FINISHED]
        assert len(after) == 1 and after[0].size > before.size  # why the count was negative


async def test_max_compaction_lag_compacts_old_dirty_data_whatever_the_dirty_ratio() -> None:
    config = {**COMPACT, "min.cleanable.dirty.ratio": "0.9", "max.compaction.lag.ms": "30000"}
    async with compacted_topic(topic_config=config) as t:
        await t.reconciled([(k, b"v" * 100) for k in (b"a", b"b", b"c", b"d", b"e", b"f")])
        assert await t.node.compactor.run_round() == 1  # all of it dirty: ratio 1.0
        await t.reconciled([(b"a", b"w")])
        status = t.node.compactor.partitions["c/0"]
        assert await t.node.compactor.run_round() == 0
        assert 0 < status.dirty_ratio < 0.9
        assert "max.compaction.lag.ms" in (status.not_compacted or "")
        t.wall.now += 29
        assert await t.node.compactor.run_round() == 0  # 29 s old: still within the lag
        t.wall.now += 2
        assert await t.node.compactor.run_round() == 1  # 31 s old: compacted whatever the ratio
        assert status.not_compacted is None and status.passes == 2
        assert [(o, k) for o, k, _ in await t.read_all()] == [
            (1, b"b"),
            (2, b"c"),
            (3, b"d"),
            (4, b"e"),
            (5, b"f"),
            (6, b"a"),
        ]


async def test_a_zombie_leaders_result_is_refused_and_its_object_collected() -> None:
    async with compacted_topic() as t:
        await t.reconciled([(b"a", b"1"), (b"a", b"2")])
        before = t.l1_keys()
        actor = t.node.partition("c", 0)
        await t.log_store.begin_term(actor.row.pid, actor.state.next_log_offset, actor.state.high_watermark)
        assert not await t.node.compactor.compact_partition(actor)  # its term is no longer current
        status = t.node.compactor.partitions["c/0"]
        assert status.refused == 1 and "zombie" in (status.not_compacted or "")
        assert t.l1_keys() == before  # what the current leader reads stays; its own went
        assert await t.log_store.l1_compaction_state(actor.row.pid) == type(
            await t.log_store.l1_compaction_state(actor.row.pid)
        )({}, frozenset())


async def test_a_read_holding_the_old_lineage_reads_the_new_object() -> None:
    async with compacted_topic() as t:
        await t.reconciled([(b"a", b"1"), (b"a", b"2"), (b"b", b"1")])
        actor = t.node.partition("c", 0)
        stale = list(t.node.l1._valid[actor.row.pid])
        assert await t.node.compactor.run_round() == 1
        t.node.l1._valid[actor.row.pid] = stale  # a reader that took the lineage before the commit
        assert await t.read_all() == [(1, b"a", b"2"), (2, b"b", b"1")]


async def test_a_read_whose_fresh_lineage_loses_its_object_before_the_get_reads_the_new_one() -> None:
    # Found by the simulation (seed 56): a fetch read the lineage afresh, its GET went out slowly,
    # and meanwhile a compaction committed and deleted the object it named.
    async with compacted_topic() as t:
        await t.reconciled([(b"a", b"1"), (b"a", b"2"), (b"b", b"1")])
        actor = t.node.partition("c", 0)
        (old,) = t.l1_keys()
        get = t.objects.get
        compacted: list[int] = []
        reads: list[str] = []

        async def slow_get(key: str, *args: object, **kwargs: object) -> bytes:
            reads.append(key)
            if reads == [old]:  # the fetch's GET lands after the compaction's delete
                compacted.append(await t.node.compactor.run_round())
            return await get(key, *args, **kwargs)  # type: ignore[arg-type]

        t.objects.get = slow_get  # type: ignore[method-assign]
        t.node.l1._valid.pop(actor.row.pid, None)  # the fetch reads the lineage itself
        assert await t.read_all() == [(1, b"a", b"2"), (2, b"b", b"1")]
        assert compacted == [1] and old not in t.l1_keys()


async def test_a_record_without_a_key_is_refused_on_a_compacted_topic() -> None:
    async with compacted_topic() as t:
        intake = ProduceIntake(t.node)
        with pytest.raises(KeylessRecord):
            await intake.produce("c", 0, [Record(None, b"x")])
        with anyio.fail_after(5):
            assert (await intake.produce("c", 0, [Record(b"k", b"x")])).base_offset == 0


async def test_a_crash_between_the_accepted_result_and_the_deletes_resumes_them() -> None:
    async with compacted_topic() as t:
        await t.reconciled([(b"a", b"1"), (b"a", b"2")])
        superseded = t.l1_keys()

        async def crash(_keys: list[str], _partition: str) -> dict[str, str]:
            return {}  # the process died after the commit, before any store delete

        t.node.l1.finish_superseded = crash  # type: ignore[method-assign]
        assert await t.node.compactor.run_round() == 1
        assert superseded <= t.l1_keys()  # still stored, no longer read
        assert await t.read_all() == [(1, b"a", b"2")]
    async with t.restarted() as t:
        await t.node.reconciler.run_round()  # start-up collection resumes DELETE_STARTED rows
        assert not (superseded & t.l1_keys())
        assert await t.read_all() == [(1, b"a", b"2")]
        assert sorted(r.state for r in await t.log_store.l1_list()) == [
            L1State.COPY_FINISHED,
            L1State.DELETE_FINISHED,
        ]


async def test_a_pass_deletes_its_superseded_objects_in_one_request_and_keeps_its_newest_timestamp() -> None:
    objects = CountingObjectStore(MemoryObjectStore())
    async with compacted_topic(objects) as t:
        for value in (b"1", b"2", b"3"):
            await t.produce([(b"a", value), (b"b", value)])
            t.wall.now += 1
            assert await t.node.reconciler.run_round() == 1
        superseded = {r.key for r in await t.log_store.l1_list()}
        before = objects.snapshot()
        assert await t.node.compactor.run_round() == 1
        spent = objects.snapshot() - before
        assert (spent.delete_requests, spent.deleted_keys, spent.l1_gets) == (1, 3, 3)
        rows = {r.key: r for r in await t.log_store.l1_list()}
        assert {k for k, r in rows.items() if r.state == L1State.DELETE_FINISHED} == superseded
        (new,) = [r for r in rows.values() if r.state == L1State.COPY_FINISHED]
        # The kept records are the last two, written at the last produce's time.
        assert new.max_timestamp_ms == round((t.wall.now - 1) * 1000)
        assert await t.read_all() == [(4, b"a", b"3"), (5, b"b", b"3")]


async def superseded_delete_failed(t: CompactedTopic, objects: FaultyObjectStore) -> tuple[str, str]:
    """Two values of one key in two L1 objects, then a compaction whose delete of the first
    (superseded) object fails once: (the first, the second)."""
    for value in (b"1", b"2"):
        await t.reconciled([(b"a", value)])
    first, second = await t.l1_keys_by_offset()
    objects.fail_deletes(first, times=1)
    assert await t.node.compactor.run_round() == 1
    return first, second


async def test_a_failed_delete_of_a_superseded_object_is_retried_alone() -> None:
    objects = FaultyObjectStore(MemoryObjectStore(), FaultSpec())
    async with compacted_topic(objects) as t:
        first, second = await superseded_delete_failed(t, objects)
        states = {r.key: r.state for r in await t.log_store.l1_list()}
        assert (states[first], states[second]) == (L1State.DELETE_STARTED, L1State.DELETE_FINISHED)
        pending = t.node.l1.pending_deletes.get(first)
        assert pending is not None and pending.last_error.startswith("storage_error: deleting")
        t.wall.now += 3600
        assert await t.node.l1.retry_deletes() == 1
        assert {r.key: r.state for r in await t.log_store.l1_list()}[first] == L1State.DELETE_FINISHED
        assert await t.read_all() == [(1, b"a", b"2")]


class GatedDeletes(MemoryObjectStore):
    """The first delete of `key` waits for `gate`, then fails; later ones go through."""

    def __init__(self) -> None:
        super().__init__()
        self.key = ""
        self.gate = anyio.Event()
        self.waiting = anyio.Event()

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        if self.key in keys:
            self.key = ""
            self.waiting.set()
            await self.gate.wait()
            raise StorageError("injected: the delete timed out")
        return await super().delete_many(keys)


async def test_a_retry_failing_while_another_path_finished_the_same_delete_notes_it_afresh() -> None:
    """A retried delete on its way while another path (a collection, a compaction's clean-up)
    finishes the same key, then failing, leaves a fresh entry, not a broken count (found by the
    simulation's seed 473: the retry asserted its entry had one failure more)."""
    objects = FaultyObjectStore(GatedDeletes(), FaultSpec())
    gated = objects.inner
    assert isinstance(gated, GatedDeletes)
    async with compacted_topic(objects) as t:
        first, _ = await superseded_delete_failed(t, objects)
        before = t.node.l1.pending_deletes.get(first)
        assert before is not None and before.failures == 1
        t.wall.now += 3600
        gated.key = first
        async with anyio.create_task_group() as tg:
            retried: list[int] = []

            async def retry() -> None:
                retried.append(await t.node.l1.retry_deletes())

            tg.start_soon(retry)
            await gated.waiting.wait()
            await t.node.l1.finish_superseded([first], "c/0")  # the other path: it goes
            assert t.node.l1.pending_deletes.get(first) is None
            t.wall.now += 1
            gated.gate.set()
        assert retried == [0]
        again = t.node.l1.pending_deletes.get(first)
        assert again is not None and again.failures == 1 and again.since == t.wall.now
        assert first not in gated._objects  # the other path's delete went
        t.wall.now += 3600
        assert await t.node.l1.retry_deletes() == 1
        assert t.node.l1.pending_deletes.get(first) is None


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
    objects = FailingGets()
    async with compacted_topic(objects) as t:
        for value in (b"1", b"2", b"3"):
            await t.reconciled([(b"a", value)])
        keys = await t.l1_keys_by_offset()
        objects.failing = {keys[1]}  # the second object, read while the first is scanned
        assert await t.node.compactor.run_round() == 0
        status = t.node.compactor.partitions["c/0"]
        assert t.node.compactor.stats.errors == 1 and "injected: reading" in (status.not_compacted or "")
        assert {r.key for r in await t.log_store.l1_list()} == set(keys)  # nothing recorded
        objects.failing = set()
        assert await t.node.compactor.run_round() == 1
        assert await t.read_all() == [(2, b"a", b"3")]
