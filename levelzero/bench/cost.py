"""Item 13: object-store requests and bytes per GiB ingested, by class, and what they cost on S3.

A real `Node` at its default settings (batcher linger 250 ms and 4 MiB objects, reconciler,
housekeeper and GC on; SQLite log store) over an in-memory object store wrapped in
`CountingObjectStore` (storage/counting_store.py): every request is counted where S3 would bill
it. Open-loop producers offer a fixed rate of 1 KiB records (one produce call per partition per
20 ms tick, the records of the tick spread evenly), for each workload of WORKLOADS.

- warm-up: the node runs the workload for a few seconds, after the GC's first round (which
  lists every prefix: the cost of one sweep, measured);
- window: `seconds` (at least the reconciler's age bound + 10 s) more. The batcher's requests
  are counted per GiB acknowledged in the window; the reconciler's (L1 PUTs, its GETs of L0
  extents), per GiB it reconciled in warm-up and window: an L1 object waits up to
  `reconciler.object_age_max_s`, so they come in bursts a window would catch or miss;
- readers: production stops, and one consumer of every partition reads the window's records
  once: round after round, a fetch of every partition not at its end yet, all at once (as one
  Kafka Fetch carries them), each up to 1 MiB (Kafka's max.partition.fetch.bytes), counted
  apart (`CountingObjectStore.role`): from L1 what is reconciled, from L0 what waits. Read
  twice: first each L0 extent alone (a reader without the cache: one ranged GET per partition
  per L0 object, as before the cache), then through the node's reader and its cache of L0
  objects (`actors/l0_cache.py`); the second is what the dollars count.
Rates, floors and dollars are taken at the rate acknowledged in the window: a loaded machine
may fall behind the offered rate (the notes give both).

The GC's sweep lists the L0 prefixes (1,000 of them: at least one LIST each) every
`gc.sweep_interval_s` whatever the rate, so LISTs are charged by time: the requests of one sweep
(measured in the warm-up) times the sweeps in the time a GiB takes at the offered rate.

Floor: the L0 PUTs the batch window allows (one per linger window, or one per
`batch_bytes_max` when a window holds more), which is also the sizing of Redpanda's Cloud Topics
(objects of ~4 MiB or 0.25 s). Target: L0 PUTs within 10% of it. Every other request is listed
with its cause in the notes and BENCHMARKS.md.

Prices: `S3Prices` (S3 Standard, us-east-1 list prices), overridden by the environment variable
LEVELZERO_BENCH_S3_PRICES, e.g. `put_per_1000=0.0025,get_per_1000=0.0002`.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path

import anyio

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.l0_cache import L0ObjectCache
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reader import FetchResult, Reader
from levelzero.core.errors import InvalidInput
from levelzero.core.l0format import Record
from levelzero.storage.counting_store import CountingObjectStore, RequestCounts
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.sqlite import SqliteLogStore

from .common import Figure, Settings, Target, figure, work_dir

ITEM = "cost"
VALUE_BYTES = 1024
TICK_S = 0.02
GIB = 1024**3
MIB = 1024**2
SECONDS_PER_MONTH = 30 * 86_400
TARGET_L0 = Target(1.10, higher_is_better=False)
KEPT_UP = 0.9  # of the offered rate acknowledged, or the L0 row gets no verdict
READ_BYTES = 1024 * 1024
ROUNDS_MAX = 100_000  # of the readers' fetches (a round reads up to READ_BYTES a partition)
PRICES_ENV = "LEVELZERO_BENCH_S3_PRICES"
_RUNS = itertools.count()  # a fresh log store per measurement


@dataclass(frozen=True, slots=True)
class Workload:
    partitions: int
    mib_per_s: float

    @property
    def label(self) -> str:
        return f"{self.partitions} partitions, {self.mib_per_s:g} MiB/s"


WORKLOADS = (Workload(64, 1.0), Workload(64, 10.0), Workload(1024, 1.0), Workload(1024, 10.0))
QUICK_WORKLOADS = (Workload(64, 1.0),)


@dataclass(frozen=True, slots=True)
class S3Prices:
    """US dollars, S3 Standard in us-east-1 (list prices): PUT, COPY, POST and LIST requests
    $0.005 per 1,000; GET and other requests $0.0004 per 1,000; DELETE requests free (a
    DeleteObjects is a POST: set delete_per_1000=0.005 to bill it as one); storage $0.023 per
    GB-month. `retention_days` is how long the data is kept (storage cost)."""

    put_per_1000: float = 0.005
    list_per_1000: float = 0.005
    get_per_1000: float = 0.0004
    delete_per_1000: float = 0.0
    storage_per_gb_month: float = 0.023
    retention_days: float = 7.0

    @classmethod
    def parse(cls, text: str) -> S3Prices:
        """`name=value,...` for any of the fields."""
        names = {f.name for f in fields(cls)}
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, raw = part.partition("=")
            if not sep or name not in names:
                raise InvalidInput(
                    f"{PRICES_ENV}={text!r}: expected name=value with names {', '.join(sorted(names))}"
                )
            try:
                values[name] = float(raw)
            except ValueError:
                raise InvalidInput(f"{PRICES_ENV}: {name} must be a number (got {raw!r})") from None
            if not math.isfinite(values[name]) or values[name] < 0:
                raise InvalidInput(f"{PRICES_ENV}: {name} must be >= 0 (got {raw!r})")
        return replace(cls(), **values)

    @classmethod
    def from_environment(cls) -> S3Prices:
        text = os.environ.get(PRICES_ENV, "")
        return cls.parse(text) if text else cls()


@dataclass(frozen=True, slots=True)
class PerGib:
    """Requests per GiB of record payload, by class."""

    l0_puts: float
    l1_puts: float
    reconciler_gets: float
    reader_gets: float
    lists: float
    delete_requests: float
    heads: float

    def request_dollars(self, prices: S3Prices) -> float:
        """Dollars per GiB ingested (and read once)."""
        return (
            (self.l0_puts + self.l1_puts) * prices.put_per_1000
            + self.lists * prices.list_per_1000
            + (self.reconciler_gets + self.reader_gets + self.heads) * prices.get_per_1000
            + self.delete_requests * prices.delete_per_1000
        ) / 1000


def window_floor_puts_per_gib(mib_per_s: float, batcher: BatcherConfig) -> float:
    """The L0 PUTs per GiB the batch window allows: one per linger window, or one per
    `batch_bytes_max` when a window holds more."""
    seconds_per_gib = GIB / (mib_per_s * MIB)
    by_window = seconds_per_gib / (batcher.linger_ms / 1000)
    by_size = GIB / batcher.batch_bytes_max
    return max(by_window, by_size)


def monthly_dollars(per_gib: PerGib, mib_per_s: float, prices: S3Prices) -> tuple[float, float]:
    """(requests, storage) dollars per month at `mib_per_s` sustained, data kept
    `retention_days` (GB as AWS bills it: 2^30 bytes)."""
    gib_per_month = mib_per_s * MIB * SECONDS_PER_MONTH / GIB
    stored_gib = mib_per_s * MIB * prices.retention_days * 86_400 / GIB
    return per_gib.request_dollars(prices) * gib_per_month, stored_gib * prices.storage_per_gb_month


@dataclass(frozen=True, slots=True)
class Measured:
    workload: Workload
    window_s: float
    payload_bytes: int  # record values offered in the window (each acknowledged)
    window: RequestCounts
    run: RequestCounts  # warm-up and window: the reconciler's requests come in bursts
    reconciled_bytes: int  # record values the reconciler copied in warm-up and window
    readers: RequestCounts  # through the node's reader (its cache of L0 objects)
    readers_uncached: RequestCounts  # each L0 extent read alone (as before the cache)
    read_bytes: int
    sweep: RequestCounts  # the GC's first round (a sweep over every prefix)
    sweep_interval_s: float
    unreconciled_s: float  # mean over samples: unreconciled records / offered records per s
    l1_records_per_object: float

    @property
    def mib_per_s(self) -> float:
        """The rate offered in the window and acknowledged: the workload's unless the machine fell
        behind (a late tick stretches the window)."""
        return self.payload_bytes / MIB / self.window_s

    def per_gib(self, *, uncached: bool = False) -> PerGib:
        """`uncached`: the readers' GETs of the pass that read each L0 extent alone."""
        gib = self.payload_bytes / GIB
        seconds_per_gib = GIB / (self.mib_per_s * MIB)
        sweeps_per_gib = seconds_per_gib / self.sweep_interval_s if self.sweep_interval_s else 0.0
        read_gib = max(self.read_bytes, 1) / GIB
        # The reconciler's requests per GiB it reconciled: an L1 object waits up to
        # `object_age_max_s`, so its PUTs and GETs come in bursts a window may miss or catch.
        reconciled_gib = self.reconciled_bytes / GIB
        return PerGib(
            l0_puts=self.window.l0_puts / gib,
            l1_puts=self.run.l1_puts / reconciled_gib if reconciled_gib else 0.0,
            reconciler_gets=self.run.gets / reconciled_gib if reconciled_gib else 0.0,
            reader_gets=(self.readers_uncached if uncached else self.readers).gets / read_gib,
            lists=self.sweep.lists * sweeps_per_gib,
            delete_requests=self.window.delete_requests / gib,
            heads=self.window.heads / gib,
        )


async def measure(
    workload: Workload, root: Path, warm_up_s: float, window_s: float, config: NodeConfig
) -> Measured:
    inner = MemoryObjectStore()
    store = CountingObjectStore(inner)
    rng = random.Random(1)
    value = rng.randbytes(VALUE_BYTES)
    records_per_tick = workload.mib_per_s * MIB * TICK_S / VALUE_BYTES
    topic = "cost"
    acked = 0
    counting = False
    async with await SqliteLogStore.open(root / f"log-{next(_RUNS)}.db") as log_store:
        node = Node(config, log_store, store, rng=rng)
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            await node.create_topic(topic, workload.partitions)

            async def send(partition: int, count: int, in_window: bool) -> None:
                # Counted by when the records were offered, not when acknowledged: a warm-up
                # produce still in its batch window when the window opens is not the window's.
                nonlocal acked
                await node.produce(topic, partition, [Record(None, value)] * count)
                if in_window:
                    acked += count * VALUE_BYTES

            async def offer(seconds: float, producers: anyio.abc.TaskGroup) -> None:
                """One tick's records spread over the partitions, round robin from where the last
                tick stopped; produce calls not awaited (open loop)."""
                owed = 0.0
                next_partition = 0
                started = time.perf_counter()
                ticks = round(seconds / TICK_S)
                for tick in range(ticks):
                    owed += records_per_tick
                    due = int(owed)
                    owed -= due
                    per_partition: dict[int, int] = {}
                    for _ in range(due):
                        per_partition[next_partition] = per_partition.get(next_partition, 0) + 1
                        next_partition = (next_partition + 1) % workload.partitions
                    for partition, count in per_partition.items():
                        producers.start_soon(send, partition, count, counting)
                    await anyio.sleep(max(0.0, started + (tick + 1) * TICK_S - time.perf_counter()))

            unreconciled: list[int] = []

            async def sample(stop: anyio.Event) -> None:
                while not stop.is_set():
                    with anyio.move_on_after(0.5):
                        await stop.wait()
                    unreconciled.append(
                        sum(max(0, a.state.high_watermark - 1 - a.state.lro) for a in node.partitions())
                    )

            async with anyio.create_task_group() as producers:
                sweep_before = store.snapshot()
                # The GC's first round lists every prefix: the cost of one sweep.
                for _ in range(600):
                    if node.gc.statistics().sweeps >= 1:
                        break
                    await anyio.sleep(0.05)
                sweep = store.snapshot() - sweep_before
                run_start = store.snapshot()
                reconciled_before = node.reconciler.stats.records_reconciled
                await offer(warm_up_s, producers)
                counting = True
                start = store.snapshot()
                offsets_at_start = {a.row.partition: a.state.high_watermark for a in node.partitions()}
                stop = anyio.Event()
                async with anyio.create_task_group() as sampler:
                    sampler.start_soon(sample, stop)
                    began = time.perf_counter()
                    await offer(window_s, producers)
                    window = store.snapshot() - start
                    run = store.snapshot() - run_start
                    reconciled = node.reconciler.stats.records_reconciled - reconciled_before
                    elapsed = time.perf_counter() - began
                    stop.set()
                counting = False
            offsets_at_end = {a.row.partition: a.state.high_watermark for a in node.partitions()}
            # Readers: one consumer of every partition reads the window once (from the L1
            # objects the reconciler wrote, and the unreconciled L0 tail, if any): first
            # reading each L0 extent alone, as before the readers' cache, then through the
            # node's reader and its cache. (Counted under roles of their own: the reconciler
            # may still be catching up.)
            uncached = Reader(log_store, L0ObjectCache(store, 0, 1))
            uncached.l1 = node.l1

            async def fetch_uncached(partition: int, offset: int) -> FetchResult:
                return await uncached.fetch(node.partition(topic, partition), offset, READ_BYTES)

            async def fetch_cached(partition: int, offset: int) -> FetchResult:
                return await node.fetch(topic, partition, offset, READ_BYTES)

            span = {p: (first, offsets_at_end[p]) for p, first in offsets_at_start.items()}
            with store.role("reader_uncached"):
                read_bytes_uncached = await _read_once(fetch_uncached, span)
            with store.role("reader"):
                read_bytes = await _read_once(fetch_cached, span)
            assert read_bytes == read_bytes_uncached, (read_bytes, read_bytes_uncached)
            readers_uncached = store.snapshot("reader_uncached")
            readers = store.snapshot("reader")
            stats = node.reconciler.stats
            per_object = stats.records_reconciled / max(1, stats.objects_written)
            await node.shutdown()
    acked_per_s = acked / VALUE_BYTES / elapsed
    return Measured(
        workload=workload,
        window_s=elapsed,
        payload_bytes=acked,
        window=window,
        run=run,
        reconciled_bytes=reconciled * VALUE_BYTES,
        readers=readers,
        readers_uncached=readers_uncached,
        read_bytes=read_bytes,
        sweep=sweep,
        sweep_interval_s=config.gc.sweep_interval_s,
        unreconciled_s=(sum(unreconciled) / max(1, len(unreconciled))) / acked_per_s,
        l1_records_per_object=per_object,
    )


async def _read_once(
    fetch: Callable[[int, int], Awaitable[FetchResult]], span: dict[int, tuple[int, int]]
) -> int:
    """One consumer of every partition reads each partition's [first, end) once: round after
    round, one fetch of each partition not read to its end yet, all at once (as one Kafka Fetch
    carries every partition, each up to READ_BYTES). The record bytes read."""
    positions = {p: first for p, (first, _) in span.items()}
    read = 0

    async def one(partition: int) -> None:
        nonlocal read
        result = await fetch(partition, positions[partition])
        assert result.records, (partition, positions[partition], span[partition])
        read += sum(len(r.value or b"") for r in result.records)
        positions[partition] = result.next_offset

    for _ in range(ROUNDS_MAX):
        due = [p for p, (_, end) in span.items() if positions[p] < end]
        if not due:
            return read
        async with anyio.create_task_group() as tg:
            for p in due:
                tg.start_soon(one, p)
    raise AssertionError(f"not read in {ROUNDS_MAX} rounds")


def _reader_dollars(m: Measured, prices: S3Prices, *, uncached: bool = False) -> float:
    """The readers' GETs a month at the acknowledged rate (the window read once)."""
    gets = m.per_gib(uncached=uncached).reader_gets
    return monthly_dollars(PerGib(0, 0, 0, gets, 0, 0, 0), m.mib_per_s, prices)[0]


def _round(value: float) -> float:
    return round(value, 1)


def _notes(m: Measured, per_gib: PerGib, prices: S3Prices, config: NodeConfig) -> dict[str, object]:
    requests_usd, storage_usd = monthly_dollars(per_gib, m.mib_per_s, prices)
    return {
        "window_s": round(m.window_s, 1),
        "offered_mib_per_s": m.workload.mib_per_s,
        "acknowledged_mib_per_s": round(m.mib_per_s, 2),
        "payload_mib": round(m.payload_bytes / MIB, 1),
        "reconciled_mib": round(m.reconciled_bytes / MIB, 1),
        "per_gib": {f.name: _round(getattr(per_gib, f.name)) for f in fields(per_gib)},
        "window_counts": m.window.as_dict(),
        "run_counts": m.run.as_dict(),
        "reader_counts": m.readers.as_dict(),
        "reader_counts_uncached": m.readers_uncached.as_dict(),
        "reader_gets_per_gib_uncached": _round(m.per_gib(uncached=True).reader_gets),
        "reader_dollars_per_month": round(_reader_dollars(m, prices), 2),
        "reader_dollars_per_month_uncached": round(_reader_dollars(m, prices, uncached=True), 2),
        "sweep_counts": m.sweep.as_dict(),
        "l0_mean_object_kib": round(m.window.l0_put_bytes / max(1, m.window.l0_puts) / 1024, 1),
        "l1_mean_object_kib": round(m.run.l1_put_bytes / max(1, m.run.l1_puts) / 1024, 1),
        "l1_records_per_object": round(m.l1_records_per_object, 1),
        "unreconciled_s": round(m.unreconciled_s, 2),
        "object_bytes_min": config.reconciler.object_bytes_min,
        "object_age_max_s": config.reconciler.object_age_max_s,
        "dollars_per_month_requests": round(requests_usd, 2),
        "dollars_per_month_storage": round(storage_usd, 2),
        "prices": {f.name: getattr(prices, f.name) for f in fields(prices)},
    }


async def run(settings: Settings) -> list[Figure]:
    config = NodeConfig()
    if settings.quick:  # a few seconds: L1 objects must be due within them
        config = replace(config, reconciler=replace(config.reconciler, object_age_max_s=1.0))
    per_pass = replace(
        config, reconciler=replace(config.reconciler, object_bytes_min=0, object_age_max_s=0.0)
    )
    prices = S3Prices.from_environment()
    workloads = settings.pick(WORKLOADS, QUICK_WORKLOADS)
    # The window outlasts the reconciler's age bound: its L1 objects hold a full wait.
    window_s = settings.pick(max(40.0, config.reconciler.object_age_max_s + 10.0), 3.0)
    warm_up_s = settings.pick(5.0, 2.0)
    figures: list[Figure] = []
    with work_dir(settings, ITEM) as root:
        for workload in workloads:
            m = await measure(workload, root, warm_up_s, window_s, config)
            per_gib = m.per_gib()
            # At the rate acknowledged (a loaded machine may fall behind the offered one).
            floor = window_floor_puts_per_gib(m.mib_per_s, config.batcher)
            requests_usd, _ = monthly_dollars(per_gib, m.mib_per_s, prices)
            floor_usd, _ = monthly_dollars(PerGib(floor, 0, 0, 0, 0, 0, 0), m.mib_per_s, prices)
            # A machine that fell behind the offered rate stretched the windows: no verdict.
            kept_up = m.mib_per_s >= KEPT_UP * workload.mib_per_s
            behind = "" if kept_up else f" (machine behind: {m.mib_per_s:.1f} MiB/s acknowledged)"
            figures.append(
                figure(
                    ITEM,
                    f"L0 PUTs per GiB vs the batch window's floor, {workload.label}{behind}",
                    "PUTs/GiB",
                    [(per_gib.l0_puts, floor)],
                    target=TARGET_L0 if kept_up else None,
                    sut_label="L0 PUTs",
                    floor_label="one per window",
                    notes=_notes(m, per_gib, prices, config),
                )
            )
            figures.append(
                figure(
                    ITEM,
                    f"L1 PUTs per GiB vs the L0 floor, {workload.label}",
                    "PUTs/GiB",
                    [(per_gib.l1_puts, floor)],
                    sut_label="L1 PUTs",
                    floor_label="L0 floor",
                )
            )
            figures.append(
                figure(
                    ITEM,
                    f"request dollars per month at the acknowledged rate vs the L0 floor's, {workload.label} "
                    "(S3 Standard list prices; read once)",
                    "$/month",
                    [(requests_usd, floor_usd)],
                    sut_label="all requests",
                    floor_label="L0 floor",
                )
            )
            figures.append(
                figure(
                    ITEM,
                    f"readers' GETs per GiB through the L0 cache vs each L0 extent read alone, "
                    f"{workload.label} (one consumer of every partition, read once)",
                    "GETs/GiB",
                    [(per_gib.reader_gets, m.per_gib(uncached=True).reader_gets)],
                    sut_label="cached",
                    floor_label="alone",
                )
            )
        if not settings.quick:
            # The trade-off of growing L1 objects: PUTs saved against how long data waits
            # unreconciled (M(p), and the GC of its L0 objects, trails by that much).
            workload = WORKLOADS[0]
            grown = await measure(workload, root, warm_up_s, window_s, config)
            every = await measure(workload, root, warm_up_s, window_s, per_pass)
            notes = {
                "grown": _notes(grown, grown.per_gib(), prices, config),
                "per_pass": _notes(every, every.per_gib(), prices, per_pass),
            }
            bound = (
                f"{config.reconciler.object_bytes_min // MIB} MiB / {config.reconciler.object_age_max_s:g} s"
            )
            figures.append(
                figure(
                    ITEM,
                    f"L1 PUTs per GiB, objects grown to {bound} vs one per pass, {workload.label}",
                    "PUTs/GiB",
                    [(grown.per_gib().l1_puts, every.per_gib().l1_puts)],
                    sut_label="grown",
                    floor_label="per pass",
                    notes=notes,
                )
            )
            figures.append(
                figure(
                    ITEM,
                    f"data waiting unreconciled (M(p) trails by it), grown to {bound} vs one per pass",
                    "s",
                    [(grown.unreconciled_s, every.unreconciled_s)],
                    sut_label="grown",
                    floor_label="per pass",
                )
            )
    return figures
