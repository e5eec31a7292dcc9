"""Item 6: GC delete throughput beside raw DeleteObjects, and GC lag, against moto's S3 server.

Per round, the same `objects` eligible keys (spread over the 1000 prefixes like the batcher
spreads them, tiny bodies; each recorded in a SQLite catalog as the batcher records its uploads)
are created four times and removed four ways, the order rotating:
- gc:            one catalog round of `GcActor.run_round()` — the GC's steady state: it reads
                 the keys from the catalog of this node's uploads and deletes them, pipelined,
                 marking them deleted in the catalog;
- gc sweep:      one sweep round (what the GC does every `sweep_interval_s`, to find strays):
                 list per prefix + delete, pipelined;
- raw delete:    aiobotocore DeleteObjects of the keys, known up front, in the requests a catalog
                 round sends (its catalog's order, epoch then key, 1000 a request:
                 `catalog_order`), as many in flight as the GC's `deletes_in_flight_max` — the
                 floor no GC can beat;
- raw list+del:  the least a lister can do: list the root page by page, delete each page as one
                 request, as many in flight — the floor of a sweep.
Target: gc >= 80% of raw delete.

Lag: the GC loop runs with `interval_s` (idle backoff capped at the same value); objects are
created and recorded in the catalog; at a random moment `M(p)` is raised so that
`LAG_OBJECTS_PER_STEP` objects become eligible; the time until each is deleted is recorded. Its
figure is the median lag beside `interval_s`.

Why the floor takes the catalog's order: moto's CPU for the same keys depends on the order they
are deleted in. Deleted in the order the fill made them, as the floor did, they cost moto
~10-15% less CPU (550-600 against 610-700 ms per 20,000 keys, six alternating pairs, for a
sorted or a shuffled order alike: the objects it made one after another sit together in its
memory) than in any other order, which the GC's, read from its catalog, is. The floor had that
saving and the GC could not.

Objects are created inside the bench's moto server (`levelzero.testing.moto`: ~15 µs an object instead of a
~2.5 ms PUT), and catalog rows by 64 concurrent callers; neither is part of any figure.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio

from levelzero.actors.gc import GcActor, GcConfig
from levelzero.core.leader import WatermarkBoard
from levelzero.core.keys import L0_ROOT, PREFIX_COUNT, format_l0_key, new_uuid
from levelzero.core.keys import parse_l0_key
from levelzero.storage.protocols import DeleteResult, L0ObjectRow, ListPage, LogStore, ObjectInfo, ObjectStore
from levelzero.storage.s3_store import S3ObjectStore
from levelzero.storage.sqlite import SqliteLogStore

from .common import (
    Figure,
    Settings,
    Target,
    figure,
    frozen_heap,
    moto_server,
    raw_s3_client,
    s3_config,
    work_dir,
)
from levelzero.testing.moto import FILL_PATH

ITEM = "gc"
BUCKET = "levelzero-bench-gc"
FILL_KEYS_PER_REQUEST = 10_000
RECORDERS = 64
OBJECTS_PER_ROUND = 20_000  # per way: 20 DeleteObjects requests of 1,000 keys
DELETES_IN_FLIGHT = GcConfig().deletes_in_flight_max
LAG_OBJECTS_PER_STEP = 20
TARGET = Target(0.80)


def make_keys(count: int, rng: random.Random, epochs: Sequence[int] = (1, 2, 3)) -> list[str]:
    return [
        format_l0_key(rng.randrange(PREFIX_COUNT), rng.choice(epochs), new_uuid(rng.getrandbits(128)))
        for _ in range(count)
    ]


def catalog_order(keys: Sequence[str]) -> list[str]:
    """`keys` in the order a catalog round reads and deletes them (`l0_objects_live`: epoch,
    then key); cut into requests of 1000, the same requests as the round's."""
    return sorted(keys, key=lambda key: (parse_l0_key(key).epoch, key))


async def create_objects(url: str, bucket: str, keys: Sequence[str]) -> float:
    """Create `keys` (one-byte bodies) through the bench server's fill endpoint, in requests of
    `FILL_KEYS_PER_REQUEST`. Returns seconds taken."""
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        for start in range(0, len(keys), FILL_KEYS_PER_REQUEST):
            body = {"bucket": bucket, "keys": list(keys[start : start + FILL_KEYS_PER_REQUEST])}
            async with session.post(f"{url}{FILL_PATH}", json=body) as response:
                if response.status != 200:
                    raise RuntimeError(f"fill: HTTP {response.status}: {await response.text()}")
    return time.perf_counter() - started


async def record_objects(log_store: LogStore, keys: Sequence[str]) -> None:
    """What the batcher does after each upload: a catalog row per object (many callers at once,
    as many partitions' objects are recorded, so they share group commits). In epoch order, as
    a node uploads: every object of an epoch is made while that epoch is current, so one
    epoch's rows sit together in the table, as the GC later marks them."""
    now = time.time() - 1.0
    rows = [L0ObjectRow(key, parse_l0_key(key).epoch, 1, now, 1) for key in keys]
    pending = iter(sorted(rows, key=lambda row: row.epoch))

    async def recorder() -> None:
        for row in pending:
            await log_store.record_l0_object(row)

    async with anyio.create_task_group() as tg:
        for _ in range(RECORDERS):
            tg.start_soon(recorder)


def make_gc(store: ObjectStore, log_store: LogStore, board: WatermarkBoard, **config: Any) -> GcActor:
    settings: dict[str, Any] = {"grace_s": 0.0}
    settings.update(config)
    return GcActor(
        GcConfig(**settings),
        store,
        log_store,
        cluster_epoch=lambda: 10**9,
        board=board,
        views=list,
        clock=time.time,
        rng=random.Random(1),
    )


def board_at(mp: int) -> WatermarkBoard:
    board = WatermarkBoard()
    board.register("bench/0")
    board.publish("bench/0", mp)
    return board


async def ready_gc(store: ObjectStore, log_store: LogStore, *, sweep: bool) -> GcActor:
    """A GC whose next round sweeps (lists), or reads the catalog. Its first round always
    sweeps: for a catalog GC that round runs here, before the objects exist."""
    gc = make_gc(store, log_store, board_at(3), sweep_interval_s=0.0 if sweep else 3600.0)
    if not sweep:
        first = await gc.run_round()
        assert first.swept and first.deleted == 0, first
    return gc


async def gc_round_s(gc: GcActor, count: int, *, dry_run: bool = False) -> tuple[float, Any]:
    """Seconds for one GC round over `count` eligible objects; and its report."""
    started = time.perf_counter()
    report = await gc.run_round(dry_run=dry_run)
    elapsed = time.perf_counter() - started
    if dry_run:
        assert report.eligible == count, report
    else:
        assert report.deleted == count and report.errors == 0, report
    return elapsed, report


async def raw_delete_s(client: Any, bucket: str, keys: Sequence[str]) -> float:
    batches = [keys[i : i + 1000] for i in range(0, len(keys), 1000)]
    limit = anyio.Semaphore(DELETES_IN_FLIGHT)

    async def one(batch: Sequence[str]) -> None:
        async with limit:
            response = await client.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            assert not response.get("Errors"), response["Errors"][:3]

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for batch in batches:
            tg.start_soon(one, batch)
    return time.perf_counter() - started


async def raw_list_and_delete_s(client: Any, bucket: str) -> tuple[float, int]:
    limit = anyio.Semaphore(DELETES_IN_FLIGHT)
    deleted = 0

    async def one(batch: list[str]) -> None:
        nonlocal deleted
        try:
            response = await client.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            assert not response.get("Errors"), response["Errors"][:3]
            deleted += len(batch)
        finally:
            limit.release()

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        request = {"Bucket": bucket, "Prefix": L0_ROOT, "MaxKeys": 1000}
        while True:
            page = await client.list_objects_v2(**request)
            keys = [item["Key"] for item in page.get("Contents", [])]
            if keys:
                await limit.acquire()
                tg.start_soon(one, keys)
            if not page.get("IsTruncated"):
                break
            request["StartAfter"] = keys[-1]
    return time.perf_counter() - started, deleted


@dataclass(frozen=True, slots=True)
class ThroughputRound:
    gc_per_s: float
    sweep_per_s: float
    raw_delete_per_s: float
    raw_list_delete_per_s: float
    gc_delete_requests: int
    sweep_list_requests: int
    sweep_delete_requests: int


async def throughput_round(
    url: str, store: S3ObjectStore, client: Any, keys: list[str], rotation: int, root: Path
) -> ThroughputRound:
    """One measurement of each way. Every GC way gets a fresh SQLite catalog (the keys are the
    same each time, and a catalog row marked deleted stays so)."""
    count = len(keys)
    in_catalog_order = catalog_order(keys)  # the raw way's requests are the catalog round's
    reports: dict[str, Any] = {}
    gc: GcActor | None = None
    catalog: SqliteLogStore | None = None

    async def prepare_gc(sweep: bool) -> None:
        nonlocal gc, catalog
        catalog = await stack.enter_async_context(
            await SqliteLogStore.open(root / f"catalog-{rotation}-{sweep}.db")
        )
        gc = await ready_gc(store, catalog, sweep=sweep)

    async def run_gc(name: str) -> float:
        assert gc is not None
        seconds, reports[name] = await gc_round_s(gc, count)
        return count / seconds

    async def raw() -> float:
        return count / await raw_delete_s(client, BUCKET, in_catalog_order)

    async def raw_listing() -> float:
        seconds, deleted = await raw_list_and_delete_s(client, BUCKET)
        assert deleted == count, deleted
        return count / seconds

    async def nothing() -> None:
        pass

    ways: list[tuple[str, Callable[[], Awaitable[None]], Callable[[], Awaitable[float]]]] = [
        ("gc", lambda: prepare_gc(False), lambda: run_gc("gc")),
        ("sweep", lambda: prepare_gc(True), lambda: run_gc("sweep")),
        ("raw", nothing, raw),
        ("list", nothing, raw_listing),
    ]
    turn = rotation % len(ways)
    ways = ways[turn:] + ways[:turn]
    rates: dict[str, float] = {}
    async with AsyncExitStack() as stack:
        for name, prepare, way in ways:
            catalog = None
            await prepare()
            await create_objects(url, BUCKET, keys)
            if catalog is not None:
                await record_objects(catalog, keys)  # what the batcher records on upload
            rates[name] = await way()
    return ThroughputRound(
        rates["gc"],
        rates["sweep"],
        rates["raw"],
        rates["list"],
        reports["gc"].delete_requests,
        reports["sweep"].list_requests,
        reports["sweep"].delete_requests,
    )


# ------------------------------------------------------------------------------ lag


class TimedStore:
    """Delegates to an object store and stamps when each key's delete returned."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.deleted_at: dict[str, float] = {}
        self.waiting: set[str] = set()
        self.all_deleted = anyio.Event()

    async def put(self, key: str, data: bytes | bytearray) -> None:
        await self.inner.put(key, data)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return await self.inner.get(key, offset, length)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self.inner.head(key)

    async def list_page(self, prefix: str, start_after: str | None = None, limit: int = 1000) -> ListPage:
        return await self.inner.list_page(prefix, start_after, limit)

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        result = await self.inner.delete_many(keys)
        now = time.perf_counter()
        for key in result.deleted:
            self.deleted_at[key] = now
            self.waiting.discard(key)
        if not self.waiting:
            self.all_deleted.set()
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


async def gc_lags(url: str, interval_s: float, backoff_factor: int, steps: int, root: Path) -> list[float]:
    """Seconds from "eligible" to "deleted" for every object of `steps` steps (catalog rounds:
    the objects are recorded as the batcher records its uploads)."""
    rng = random.Random(int(interval_s * 100) + backoff_factor)
    lags: list[float] = []
    async with (
        S3ObjectStore(s3_config(url, BUCKET)) as inner,
        await SqliteLogStore.open(root / f"lag-{interval_s}-{backoff_factor}.db") as catalog,
    ):
        store = TimedStore(inner)
        board = board_at(0)
        gc = make_gc(
            store,
            catalog,
            board,
            interval_s=interval_s,
            idle_backoff_max_s=interval_s * backoff_factor,
        )
        async with anyio.create_task_group() as tg:
            await tg.start(gc.run)
            for step in range(1, steps + 1):
                keys = make_keys(LAG_OBJECTS_PER_STEP, rng, epochs=(step,))
                await create_objects(url, BUCKET, keys)  # epoch `step` > M = step - 1: kept
                await record_objects(catalog, keys)
                store.waiting = set(keys)
                store.all_deleted = anyio.Event()
                # A random phase against the loop (longer gaps let an idle GC back off).
                await anyio.sleep(rng.uniform(0, interval_s * backoff_factor))
                eligible_at = time.perf_counter()
                board.publish("bench/0", step)  # now they are eligible
                with anyio.fail_after(60 + interval_s * backoff_factor * 4):
                    await store.all_deleted.wait()
                lags.extend(store.deleted_at[key] - eligible_at for key in keys)
            tg.cancel_scope.cancel()
    return lags


# ------------------------------------------------------------------------------ the item


async def run(settings: Settings) -> list[Figure]:
    count = settings.pick(OBJECTS_PER_ROUND, 1_000)
    # One slow moto answer moves a round of a few requests by tens of percent: 20 requests a
    # round, and the median of all `settings.rounds` rounds, not of three.
    rounds = settings.pick(settings.rounds, 1)
    lag_steps = settings.pick(6, 2)
    intervals = settings.pick((0.5, 1.0), (0.5,))
    rng = random.Random(7)
    with work_dir(settings, ITEM) as root:
        async with moto_server(root) as url:
            async with (
                S3ObjectStore(s3_config(url, BUCKET)) as store,
                raw_s3_client(url) as client,
            ):
                with frozen_heap():  # an 80 ms full collection hit every other round before
                    results = []
                    for i in range(rounds):
                        keys = make_keys(count, rng)
                        results.append(await throughput_round(url, store, client, keys, i, root))
            lag_pairs: dict[float, list[float]] = {}
            for interval_s in intervals:
                lag_pairs[interval_s] = await gc_lags(url, interval_s, 1, lag_steps, root)
    notes = {
        "objects": count,
        "deletes_in_flight": DELETES_IN_FLIGHT,
        "gc_delete_requests": results[0].gc_delete_requests,
        "gc_list_requests": 0,
    }
    sweep_notes = {
        "objects": count,
        "sweep_list_requests": results[0].sweep_list_requests,
        "sweep_delete_requests": results[0].sweep_delete_requests,
    }
    figures = [
        figure(
            ITEM,
            "GC deletes/s (catalog round) vs raw DeleteObjects of the same keys (moto)",
            "objects/s",
            [(r.gc_per_s, r.raw_delete_per_s) for r in results],
            target=TARGET,
            sut_label="gc",
            floor_label="raw delete",
            notes=notes,
        ),
        figure(
            ITEM,
            "GC deletes/s (sweep round: lists) vs raw list + DeleteObjects (moto)",
            "objects/s",
            [(r.sweep_per_s, r.raw_list_delete_per_s) for r in results],
            sut_label="sweep",
            floor_label="raw list+delete",
            notes=sweep_notes,
        ),
        figure(
            ITEM,
            "GC deletes/s (sweep round: lists) vs raw DeleteObjects of the same keys (moto)",
            "objects/s",
            [(r.sweep_per_s, r.raw_delete_per_s) for r in results],
            sut_label="sweep",
            floor_label="raw delete",
        ),
    ]
    for interval_s, lags in lag_pairs.items():
        figures.append(
            figure(
                ITEM,
                f"GC lag (eligible -> deleted), median, vs interval_s {interval_s}",
                "s",
                [(statistics.median(lags), interval_s)],
                sut_label="lag",
                floor_label="interval_s",
                notes={
                    "objects": len(lags),
                    "p90_s": round(sorted(lags)[int(0.9 * (len(lags) - 1))], 3),
                    "max_s": round(max(lags), 3),
                },
            )
        )
    return figures


async def memory_store_round_rate(count: int) -> float:
    """Objects/s of one GC round over `count` eligible objects in the memory store: the actor's
    own cost (scan, batching, bookkeeping) without a network."""
    from levelzero.storage.memory_log import MemoryLogStore
    from levelzero.storage.memory_store import MemoryObjectStore

    store = MemoryObjectStore()
    for key in make_keys(count, random.Random(3)):
        await store.put(key, b"x")
    seconds, _ = await gc_round_s(await ready_gc(store, MemoryLogStore(), sweep=True), count)
    assert not store.keys()
    return count / seconds
