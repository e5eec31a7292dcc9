"""The write and read paths through a Node: shared L0 objects, byte-for-byte round trips on every
log store and object store, corruption detection, stale-epoch retries and their orphans,
offset bounds, backpressure and a draining shutdown.

The reconciler and housekeeper are switched off so every fetch exercises the L0 path and no
background task moves an epoch under the test.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from levelzero.actors.batcher import BatcherConfig, ProduceResult, _ByteBudget
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reader import FetchedRecord
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.entries import AdvanceEpoch, Placeholder
from levelzero.core.errors import CorruptData, OffsetOutOfRange, ShuttingDown, StaleClusterEpoch, TooLarge
from levelzero.core.keys import L0_ROOT, parse_l0_key
from levelzero.core.l0format import Record, encode_extent
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import LogStore, ObjectStore
from levelzero.storage.sqlite import SqliteLogStore
from levelzero.testing.nodes import running_node, wait_until

TOPIC = "t"
LONG_TTL_S = 1e9  # the epoch cache never expires by itself: staleness is the test's to set up


def node_config(
    *, epoch_cache_ttl_s: float = 5.0, snapshot_every_records: int = 1_000, **batcher: object
) -> NodeConfig:
    batcher.setdefault("linger_ms", 5.0)
    return NodeConfig(
        epoch_cache_ttl_s=epoch_cache_ttl_s,
        epoch_bump_interval_s=None,
        snapshot_every_records=snapshot_every_records,
        batcher=BatcherConfig(**batcher),  # type: ignore[arg-type]
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
    )


@asynccontextmanager
async def open_log_store(kind: str, tmp_path: Path) -> AsyncIterator[LogStore]:
    """Opened and closed in the test's own task, as SqliteLogStore requires."""
    if kind == "memory":
        yield MemoryLogStore()
        return
    async with await SqliteLogStore.open(tmp_path / "log.db", synchronous="NORMAL") as store:
        yield store


async def fetch_all(node: Node, partition: int, offset: int = 0) -> list[FetchedRecord]:
    out: list[FetchedRecord] = []
    while True:
        result = await node.fetch(TOPIC, partition, offset, 1 << 20)
        out.extend(result.records)
        if result.next_offset == result.high_watermark:
            return out
        assert result.records, "a fetch below the high watermark must make progress"
        offset = result.next_offset


def make_records(rng: random.Random, tag: str, count: int) -> list[Record]:
    return [
        Record(
            None if i % 3 == 0 else f"{tag}-{i}".encode(),
            rng.randbytes(rng.randrange(0, 300)),
        )
        for i in range(count)
    ]


def l0_keys(objects: MemoryObjectStore) -> list[str]:
    """The L0 objects (the bucket also holds each topic's record, `levelzero/topics/...`)."""
    return [key for key in objects.keys() if key.startswith(L0_ROOT)]


async def placeholders_of(log_store: LogStore, pid: int) -> list[Placeholder]:
    return [r.entry for r in await log_store.read_placeholders(pid, 0, 10_000)]


# ------------------------------------------------------------------------------ round trips


async def round_trip(log_store: LogStore, object_store: ObjectStore) -> None:
    partitions, produces_per_partition = 8, 6
    rng = random.Random(42)
    sent: dict[tuple[int, int], list[Record]] = {
        (p, i): make_records(rng, f"p{p}i{i}", 1 + (p + i) % 4)
        for p in range(partitions)
        for i in range(produces_per_partition)
    }
    results: dict[tuple[int, int], ProduceResult] = {}
    async with running_node(node_config(), log_store, object_store) as node:
        await node.create_topic(TOPIC, partitions)

        async def produce(p: int, i: int) -> None:
            results[(p, i)] = await node.produce(TOPIC, p, sent[(p, i)])

        async with anyio.create_task_group() as tg:
            for p, i in sent:
                tg.start_soon(produce, p, i)

        stats = node.batcher.stats
        assert stats.objects_uploaded < len(sent), "partitions must share L0 objects"
        partitions_per_object = Counter(r.object_key for r in results.values())
        assert max(partitions_per_object.values()) > 1
        for p in range(partitions):
            fetched = await fetch_all(node, p)
            expected_count = sum(len(sent[(p, i)]) for i in range(produces_per_partition))
            assert [r.offset for r in fetched] == list(range(expected_count))
            for i in range(produces_per_partition):
                result = results[(p, i)]
                assert result.attempts == 1
                assert result.last_offset - result.base_offset + 1 == len(sent[(p, i)])
                got = fetched[result.base_offset : result.last_offset + 1]
                assert [(r.key, r.value) for r in got] == [(r.key, r.value) for r in sent[(p, i)]]


@pytest.mark.parametrize("log_kind", ["memory", "sqlite"])
async def test_produce_fetch_round_trip_on_each_store(
    log_kind: str, object_store: ObjectStore, tmp_path: Path
) -> None:
    """`object_store` runs this on the memory, local and S3 (marked `s3`) adapters."""
    async with open_log_store(log_kind, tmp_path) as log_store:
        await round_trip(log_store, object_store)


async def test_acknowledged_records_survive_a_node_restart_on_sqlite(tmp_path: Path) -> None:
    objects = MemoryObjectStore()
    records = [Record(b"k", b"v" * 100), Record(None, b"")]
    async with (
        open_log_store("sqlite", tmp_path) as log_store,
        running_node(node_config(), log_store, objects) as node,
    ):
        await node.create_topic(TOPIC, 2)
        result = await node.produce(TOPIC, 1, records)
    async with (
        open_log_store("sqlite", tmp_path) as log_store,
        running_node(node_config(), log_store, objects) as node,
    ):
        assert node.topics() == {TOPIC: 2}
        fetched = await fetch_all(node, 1)
        assert [(r.offset, r.key, r.value) for r in fetched] == [
            (result.base_offset + i, r.key, r.value) for i, r in enumerate(records)
        ]
        assert node.partition(TOPIC, 1).term == 2


# ------------------------------------------------------------------------------ corruption


async def test_corrupted_extent_is_detected_on_fetch() -> None:
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    async with running_node(node_config(), log_store, objects) as node:
        await node.create_topic(TOPIC, 2)
        async with anyio.create_task_group() as tg:
            tg.start_soon(node.produce, TOPIC, 0, [Record(b"a", b"x" * 64)])
            tg.start_soon(node.produce, TOPIC, 1, [Record(b"b", b"y" * 64)])
        actor = node.partition(TOPIC, 1)
        (holder,) = await placeholders_of(log_store, actor.row.pid)
        data, modified = objects._objects[holder.object_key]
        flipped = bytearray(data)
        flipped[holder.byte_offset + holder.byte_length // 2] ^= 0xFF
        objects._objects[holder.object_key] = (bytes(flipped), modified)

        with pytest.raises(CorruptData, match="checksum mismatch"):
            await node.fetch(TOPIC, 1, 0, 1 << 20)
        assert actor.view().readers == 0, "a failed read releases its pin"
        # The other partition's extent in the same object is intact and still readable.
        assert l0_keys(objects) == [holder.object_key]
        (other,) = (await node.fetch(TOPIC, 0, 0, 1 << 20)).records
        assert other.value == b"x" * 64


# ------------------------------------------------------------------------------ stale epochs


async def move_window_ahead(node: Node, partition: int, advances: int) -> int:
    """Advance the cluster epoch and let the partition's window follow (as the housekeeper
    would), while the node's long-TTL cache keeps its old epoch."""
    for _ in range(advances):
        await node.epochs.advance()
    actor = node.partition(TOPIC, partition)
    current = node.epochs.current
    await actor.write(AdvanceEpoch(current - 1))
    await actor.write(AdvanceEpoch(current))
    assert actor.state.applied_window == (current - 1, current)
    return current


async def test_stale_epoch_is_retried_once_and_leaves_one_orphan() -> None:
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = node_config(epoch_cache_ttl_s=LONG_TTL_S)
    async with running_node(config, log_store, objects) as node:
        await node.create_topic(TOPIC, 1)
        first = await node.produce(TOPIC, 0, [Record(None, b"first")])
        assert node.epoch_cache.cached == 1
        current = await move_window_ahead(node, 0, advances=3)
        assert node.epoch_cache.cached == 1

        second = await node.produce(TOPIC, 0, [Record(None, b"second")])

        assert (first.attempts, second.attempts) == (1, 2)
        assert node.epoch_cache.cached == current
        stats = node.batcher.stats
        assert (stats.stale_rejections, stats.stale_retries, stats.orphan_objects) == (1, 1, 1)
        pid = node.partition(TOPIC, 0).row.pid
        referenced = {p.object_key for p in await placeholders_of(log_store, pid)}
        assert referenced == {first.object_key, second.object_key}
        stored = set(l0_keys(objects))
        assert len(stored) == len(referenced) + 1
        (orphan,) = stored - referenced
        assert parse_l0_key(orphan).epoch == 1, "the orphan is garbage by its (old) epoch"
        assert parse_l0_key(second.object_key).epoch == current
        # Every upload has its catalog row, the orphan's too; a row follows its object's
        # placeholders (written by the batcher's recorder a turn of the loop later).
        for _ in range(100):
            if set(log_store.l0_objects) == stored:
                break
            await anyio.lowlevel.checkpoint()
        assert set(log_store.l0_objects) == stored

        fetched = await fetch_all(node, 0)
        assert [(r.offset, r.value) for r in fetched] == [(0, b"first"), (1, b"second")]


async def test_an_objects_epoch_is_the_max_of_the_cached_epoch_and_its_partitions_creation_epochs() -> None:
    """A node whose cache still says epoch 1 writes, in one object, to a partition created at
    epoch 2 and then to one created at epoch 4: the object is stamped 4 — not the cached 1,
    not the first partition's 2 — so no extent is rejected as stale and no orphan is left."""
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    # Two ~600-byte requests fill a 1 KiB object; the linger never cuts it.
    config = node_config(epoch_cache_ttl_s=LONG_TTL_S, linger_ms=600_000.0, batch_bytes_max=1024)
    async with running_node(config, log_store, objects) as node:
        await node.create_topic("warm", 1)
        await node.produce("warm", 0, [Record(None, b"w" * (1024 - 8))])  # fills the cache: 1
        assert node.epoch_cache.cached == 1
        await node.epochs.advance()
        await node.create_topic("older", 1)
        for _ in range(2):
            await node.epochs.advance()
        await node.create_topic("newer", 1)
        older, newer = node.partition("older", 0), node.partition("newer", 0)
        assert (older.row.creation_epoch, newer.row.creation_epoch) == (2, 4)
        assert node.epoch_cache.cached == 1

        results: dict[str, ProduceResult] = {}

        async def produce(topic: str) -> None:
            results[topic] = await node.produce(topic, 0, [Record(None, b"v" * 600)])

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce, "older")  # the first partition of the object
            await wait_until(lambda: node.batcher.stats.inflight_bytes > 0, "the first request queued")
            tg.start_soon(produce, "newer")

        assert results["older"].object_key == results["newer"].object_key, "one object"
        assert parse_l0_key(results["older"].object_key).epoch == 4
        assert [p.epoch for p in await placeholders_of(log_store, older.row.pid)] == [4]
        assert [p.epoch for p in await placeholders_of(log_store, newer.row.pid)] == [4]
        assert (results["older"].attempts, results["newer"].attempts) == (1, 1)
        stats = node.batcher.stats
        assert (stats.stale_rejections, stats.orphan_objects, stats.objects_uploaded) == (0, 0, 2)


async def test_exhausted_stale_retries_fail_the_producer() -> None:
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = node_config(epoch_cache_ttl_s=LONG_TTL_S, stale_retries_max=0)
    async with running_node(config, log_store, objects) as node:
        await node.create_topic(TOPIC, 1)
        await node.produce(TOPIC, 0, [Record(None, b"first")])
        current = await move_window_ahead(node, 0, advances=2)

        with pytest.raises(StaleClusterEpoch) as rejected:
            await node.produce(TOPIC, 0, [Record(None, b"lost")])
        assert (rejected.value.epoch, rejected.value.window_min) == (1, current - 1)
        assert rejected.value.window_max == current
        stats = node.batcher.stats
        # The producer hears of the rejection before the upload task counts its orphan.
        await wait_until(lambda: stats.orphan_objects == 1, "the orphan is counted")
        assert (stats.stale_failures, stats.stale_retries) == (1, 0)
        assert node.partition(TOPIC, 0).state.high_watermark == 1

        again = await node.produce(TOPIC, 0, [Record(None, b"again")])  # the cache was refreshed
        assert again.attempts == 1 and again.base_offset == 1
        assert [r.value for r in await fetch_all(node, 0)] == [b"first", b"again"]


# ------------------------------------------------------------------------------ offset bounds


async def test_fetch_outside_the_readable_range_is_refused() -> None:
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        await node.produce(TOPIC, 0, [Record(None, bytes([i])) for i in range(5)])
        actor = node.partition(TOPIC, 0)
        await actor.set_start_offset(2, actor.term)

        with pytest.raises(OffsetOutOfRange) as below:
            await node.fetch(TOPIC, 0, 1, 1 << 20)
        assert (below.value.start_offset, below.value.high_watermark) == (2, 5)
        with pytest.raises(OffsetOutOfRange):
            await node.fetch(TOPIC, 0, 6, 1 << 20)

        at_end = await node.fetch(TOPIC, 0, 5, 1 << 20)
        assert (at_end.records, at_end.next_offset, at_end.tier) == ([], 5, "none")
        from_start = await node.fetch(TOPIC, 0, 2, 1 << 20)
        assert [(r.offset, r.value) for r in from_start.records] == [
            (2, b"\x02"),
            (3, b"\x03"),
            (4, b"\x04"),
        ]
        assert (from_start.next_offset, from_start.start_offset) == (5, 2)


async def test_fetch_from_an_empty_partition_is_empty() -> None:
    async with running_node(node_config(), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        result = await node.fetch(TOPIC, 0, 0, 1 << 20)
        assert (result.records, result.high_watermark, result.tier) == ([], 0, "none")
        with pytest.raises(OffsetOutOfRange):
            await node.fetch(TOPIC, 0, 1, 1 << 20)


# ------------------------------------------------------------------------------ backpressure


async def test_inflight_bytes_never_exceed_the_budget() -> None:
    budget_bytes = 4096
    config = node_config(batch_bytes_max=2048, inflight_bytes_max=budget_bytes, uploads_max=2)
    async with running_node(config, MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 4)
        budget = node.batcher._budget
        peak = 0
        original_acquire = budget.acquire

        async def observed_acquire(n: int) -> None:
            nonlocal peak
            await original_acquire(n)
            peak = max(peak, budget.used, node.batcher.stats.inflight_bytes)
            assert budget.used <= budget_bytes

        budget.acquire = observed_acquire  # type: ignore[method-assign]
        value = b"z" * 300
        request_bytes = len(value) + 8
        producers = 64
        results: list[ProduceResult] = []

        async def produce(i: int) -> None:
            results.append(await node.produce(TOPIC, i % 4, [Record(None, value)]))

        async with anyio.create_task_group() as tg:
            for i in range(producers):
                tg.start_soon(produce, i)

        assert len(results) == producers
        assert budget_bytes - request_bytes < peak <= budget_bytes, "the budget was the limit"
        assert budget.used == node.batcher.stats.inflight_bytes == 0
        assert node.batcher.stats.objects_uploaded >= producers * request_bytes // budget_bytes
        assert sum(a.state.high_watermark for a in node.partitions()) == producers


async def test_byte_budget_is_first_come_first_served() -> None:
    budget = _ByteBudget(100)
    await budget.acquire(60)
    granted: list[str] = []

    async def take(n: int, tag: str) -> None:
        await budget.acquire(n)
        granted.append(tag)

    async with anyio.create_task_group() as tg:
        tg.start_soon(take, 50, "big")
        await wait_until(lambda: len(budget._waiters) == 1, "big waits")
        tg.start_soon(take, 10, "small")  # would fit, but must not overtake the waiting one
        await wait_until(lambda: len(budget._waiters) == 2, "small queues behind big")
        assert granted == [] and budget.used == 60
        budget.release(60)
    assert granted == ["big", "small"]
    assert budget.used == 60


async def test_byte_budget_waiter_cancelled_before_its_grant_holds_nothing_back() -> None:
    budget = _ByteBudget(100)
    await budget.acquire(90)
    granted: list[str] = []

    async def take(n: int, tag: str) -> None:
        await budget.acquire(n)
        granted.append(tag)

    async with anyio.create_task_group() as tg, anyio.create_task_group() as doomed:
        doomed.start_soon(take, 50, "cancelled")
        await wait_until(lambda: len(budget._waiters) == 1, "the head waits")
        tg.start_soon(take, 10, "behind")
        await wait_until(lambda: len(budget._waiters) == 2, "a second waits behind it")
        doomed.cancel_scope.cancel()
    assert granted == ["behind"]
    assert budget.used == 100 and not budget._waiters


# ------------------------------------------------------------------------------ shutdown


async def test_shutdown_drains_a_produce_in_flight() -> None:
    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = node_config(linger_ms=600_000)  # only the shutdown's flush sends this batch
    outcome: list[ProduceResult] = []
    async with running_node(config, log_store, objects) as node:
        await node.create_topic(TOPIC, 1)

        async def produce() -> None:
            outcome.append(await node.produce(TOPIC, 0, [Record(b"k", b"in flight")]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            await anyio.wait_all_tasks_blocked()  # the request sits in the lingering batch
            assert outcome == [] and node.batcher.stats.objects_uploaded == 0
            await node.shutdown()
        assert [(r.base_offset, r.attempts) for r in outcome] == [(0, 1)]
        with pytest.raises(ShuttingDown):
            await node.produce(TOPIC, 0, [Record(None, b"late")])

    async with running_node(node_config(), log_store, objects) as again:
        assert [r.value for r in await fetch_all(again, 0)] == [b"in flight"]


async def test_a_restarted_node_puts_every_partition_on_the_board_before_it_publishes() -> None:
    """A partition that never had an epoch publishes no M(p); after a restart it must still
    block GC rounds (no deletes) instead of being invisible to them."""

    log_store, objects = MemoryLogStore(), MemoryObjectStore()
    config = NodeConfig(housekeeper=HousekeeperConfig(enabled=False), epoch_bump_interval_s=None)
    async with anyio.create_task_group() as tg:
        first = Node(config, log_store, objects)
        await tg.start(first.run)
        await first.create_topic("quiet", 1)
        await first.shutdown()
    async with anyio.create_task_group() as tg:
        second = Node(config, log_store, objects)
        await tg.start(second.run)
        assert second.board.snapshot() == {"quiet/0": None}
        await second.shutdown()


async def test_a_request_at_batch_bytes_max_by_the_size_rule_is_stored_and_one_byte_over_is_too_large() -> (
    None
):
    """The one size rule (value + key + header names and values + 8 per record), not the
    encoded size: this request encodes to more than the limit (msgpack framing, a 9-byte
    timestamp) and is stored; one byte more value is TooLarge (413 / MESSAGE_TOO_LARGE)."""

    def request(value_bytes: int) -> list[Record]:
        return [Record(b"k" * 100, b"v" * value_bytes, 1_700_000_000_000, (("h", b"xyz"),))]

    at_limit = request(1024 - 100 - 4 - 8)
    assert len(encode_extent(at_limit)) > 1024
    async with running_node(node_config(batch_bytes_max=1024), MemoryLogStore(), MemoryObjectStore()) as node:
        await node.create_topic(TOPIC, 1)
        result = await node.produce(TOPIC, 0, at_limit)
        assert (result.base_offset, result.last_offset) == (0, 0)
        with pytest.raises(TooLarge) as err:
            await node.produce(TOPIC, 0, request(1024 - 100 - 4 - 8 + 1))
        assert (err.value.size, err.value.limit) == (1025, 1024)
        (stored,) = await fetch_all(node, 0)
        assert (stored.key, stored.value, stored.headers) == (b"k" * 100, at_limit[0].value, (("h", b"xyz"),))
        assert node.batcher.stats.records_appended == 1
