"""Item 14: produce latency with an object store as slow as S3, beside the floor the write path
cannot go below: the batch window, one PUT and one log commit.

A real `Node` at its default settings (batcher linger 250 ms, SQLite log store with synchronous
FULL; reconciler, housekeeper and GC on) over an in-memory object store behind
`LatencyObjectStore` (levelzero/testing/latency_store.py): every PUT and GET waits 20-80 ms
(S3 Standard-like) or 3-7 ms (S3 Express One Zone-like), uniform, seeded. Open-loop producers
send RATE_PER_S produce calls a second (one 1 KiB record each), spread round robin over 1, 64
or 1,024 partitions; each call's latency is taken from submission to acknowledgement.

The process runs with the garbage collector's thresholds of `levelzero run`
(`daemon/gc_tuning.py`), as the scale item does: with CPython's defaults, a full collection of
the 1,024 partitions' heap paused the event loop for 130-470 ms in one round of three, and that
round's p99 read 136-203% of its floor; the daemon never runs that way. The longest collection
of each round is in the notes.

Floor of a round: the linger window + the p99 of the PUT delays the store drew in that round +
the p99 of the round's log commits of placeholders (the appender's `append_many` calls that
carry a produce's placeholders, timed at the log store). A request that opens a window waits
all of it, then its object's PUT, then its placeholders' commit; nothing the node does could
take less. Target: p99 <= floor + 25%. The median's floor (information) is half the window
(arrivals spread evenly over it) + the PUTs' and the commits' medians.
"""

from __future__ import annotations

import gc
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import anyio

from levelzero.actors.node import Node, NodeConfig
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.l0format import Record
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import Append, LogStore, OnDurable
from levelzero.storage.sqlite import SqliteLogStore
from levelzero.testing.latency_store import S3_EXPRESS, S3_STANDARD, Latency, LatencyObjectStore

from levelzero.daemon.gc_tuning import tuned_gc

from .common import Figure, Settings, Target, figure, quantile, work_dir

ITEM = "latency"
VALUE_BYTES = 1024
RATE_PER_S = 400  # produce calls a second, all partitions together
PARTITIONS = (1, 64, 1024)
PROFILES = (S3_STANDARD, S3_EXPRESS)
TARGET = Target(1.25, higher_is_better=False)


class TimedLogStore:
    """The log store, with the appends that carry placeholders timed (the rest passed
    through): the commits a produce waits for. The housekeeper's and the reconciler's appends
    (an `AdvanceEpoch`, a catch-up) share the writer but are no produce's commit; timed with
    them, a round over 1,024 new partitions' ~1,000 one-partition commits of 2-4 ms set the
    floor's commit quantiles."""

    def __init__(self, inner: SqliteLogStore) -> None:
        self._inner = inner
        self.commit_s: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
        started = time.perf_counter()
        await self._inner.append(pid, expected_term, records)
        if _placeholders(records):
            self.commit_s.append(time.perf_counter() - started)

    async def append_many(self, appends: Sequence[Append], on_durable: OnDurable | None = None) -> list[Any]:
        started = time.perf_counter()
        result = await self._inner.append_many(appends, on_durable)
        if any(_placeholders(append.records) for append in appends):
            self.commit_s.append(time.perf_counter() - started)
        return result


def _placeholders(records: Sequence[LogRecord]) -> bool:
    return any(isinstance(record.entry, Placeholder) for record in records)


class CollectionTimer:
    """The longest garbage collection while installed (a pause of the event loop)."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:  # noqa: ARG002 - gc.callbacks' signature
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.longest_s = max(self.longest_s, time.perf_counter() - self._started)

    def __enter__(self) -> CollectionTimer:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


@dataclass(frozen=True, slots=True)
class Round:
    produce_s: list[float]
    put_s: list[float]
    commit_s: list[float]
    collection_max_s: float = 0.0

    def floor(self, q: float, linger_s: float) -> float:
        """The `q` quantile's floor: the window a request waits in (all of it for the p99: the
        request that opens a window; half for the median, arrivals being spread evenly over
        it), then the `q` quantile of the PUTs and of the commits."""
        waited = linger_s if q >= 0.5 + 1e-9 else linger_s / 2
        return waited + quantile(self.put_s, q) + quantile(self.commit_s, q)


async def one_round(root: Path, latency: Latency, partitions: int, seconds: float, seed: int) -> Round:
    config = NodeConfig()
    store = LatencyObjectStore(MemoryObjectStore(), latency, seed=seed)
    value = random.Random(seed).randbytes(VALUE_BYTES)
    latencies: list[float] = []
    async with await SqliteLogStore.open(root / f"log-{seed}.db") as sqlite:
        log_store = TimedLogStore(sqlite)
        node = Node(config, cast(LogStore, log_store), store, rng=random.Random(seed))
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            await node.create_topic("latency", partitions)
            await node.produce("latency", 0, [Record(None, value)])  # the first object is behind us
            store.put_delays_s.clear()
            log_store.commit_s.clear()

            async def send(partition: int) -> None:
                started = time.perf_counter()
                await node.produce("latency", partition, [Record(None, value)])
                latencies.append(time.perf_counter() - started)

            interval = 1 / RATE_PER_S
            began = time.perf_counter()
            with CollectionTimer() as collections:
                async with anyio.create_task_group() as producers:
                    for i in range(round(seconds * RATE_PER_S)):
                        producers.start_soon(send, i % partitions)
                        await anyio.sleep(max(0.0, began + (i + 1) * interval - time.perf_counter()))
            await node.shutdown()
    return Round(latencies, list(store.put_delays_s), list(log_store.commit_s), collections.longest_s)


async def run(settings: Settings) -> list[Figure]:
    seconds = settings.pick(max(5.0, 5 * settings.seconds), 1.0)
    rounds = settings.pick(settings.rounds, 1)
    linger_s = NodeConfig().batcher.linger_ms / 1000
    figures: list[Figure] = []
    seed = 0
    with work_dir(settings, ITEM) as root, tuned_gc():  # the daemon's collector (see above)
        for latency in settings.pick(PROFILES, PROFILES[:1]):
            for partitions in settings.pick(PARTITIONS, (1, 64)):
                results: list[Round] = []
                for _ in range(rounds):
                    seed += 1
                    results.append(await one_round(root, latency, partitions, seconds, seed))
                notes = {
                    "put_ms": latency.put_ms,
                    "get_ms": latency.get_ms,
                    "calls_per_s": RATE_PER_S,
                    "seconds_per_round": seconds,
                    "linger_ms": linger_s * 1000,
                    "put_p99_ms": [round(quantile(r.put_s, 0.99) * 1000, 1) for r in results],
                    "commit_p99_ms": [round(quantile(r.commit_s, 0.99) * 1000, 1) for r in results],
                    "commit_p50_ms": [round(quantile(r.commit_s, 0.5) * 1000, 1) for r in results],
                    "produce_p50_ms": [round(quantile(r.produce_s, 0.5) * 1000, 1) for r in results],
                    "produce_p99_ms": [round(quantile(r.produce_s, 0.99) * 1000, 1) for r in results],
                    "produce_max_ms": [round(max(r.produce_s) * 1000, 1) for r in results],
                    "collection_max_ms": [round(r.collection_max_s * 1000, 1) for r in results],
                }
                for q, label, target in ((0.99, "p99", TARGET), (0.5, "p50", None)):
                    figures.append(
                        figure(
                            ITEM,
                            f"produce latency {label}, {partitions} partitions, {latency.name} "
                            f"(PUT {latency.put_ms[0]:g}-{latency.put_ms[1]:g} ms) vs window + PUT + commit",
                            "ms",
                            [(quantile(r.produce_s, q) * 1000, r.floor(q, linger_s) * 1000) for r in results],
                            target=target,
                            sut_label="produce",
                            floor_label="floor",
                            notes=notes if target is not None else {},
                        )
                    )
    return figures
