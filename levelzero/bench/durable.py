"""Item 4: durable produce — placeholders/s through partition actors and `SqliteLogStore` —
beside raw aiosqlite group commit at the same batch size.

- sut:   `PARTITIONS` PartitionActors on one SqliteLogStore (synchronous FULL, WAL: the daemon's
         defaults); `CALLERS` tasks write `Placeholder`s in a closed loop (fence, reserve, append
         through the node's appender — one, shared by the partitions as in `Node`, one
         `append_many` for every partition with records queued — into the store's group commit,
         apply, answer). Records per commit come out of the group commit itself;
- floor: one task doing `executemany(<that many rows>)` + `commit` back to back into the same
         `log` table (rows encoded up front), in the shape the group commit reached in the SUT
         run before it: as many rows a commit, over as many partitions, each partition's rows
         at consecutive offsets after its last ones (the SUT's index pages: a commit touches
         the index leaves of every partition in it). SQLite and aiosqlite's thread hops,
         nothing else.
Wall clock (fsync is most of it), rounds alternating. Target: sut >= 50% of raw rows/s.

`python -m levelzero.bench.sweep_log_store` uses `raw_rows_per_s` and `store_appends` for its batch-size
sweep.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import aiosqlite
import anyio
import msgspec

from levelzero.actors.appender import Appender
from levelzero.actors.partition import PartitionActor
from levelzero.core.leader import WatermarkBoard
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.sqlite import SqliteLogStore
from levelzero.storage.log_rules import log_row
from levelzero.storage.sqlite.schema import INSERT_LOG, SCHEMA
from levelzero.storage.sqlite.store import Synchronous

from .common import Figure, Settings, Target, figure, interleave, work_dir

ITEM = "durable"
PARTITIONS = 64
CALLERS = 256
EPOCH = 1
ROW_POOL = 1000  # distinct pre-encoded rows the raw baseline cycles through
TARGET = Target(0.50)


def make_placeholder(n: int) -> Placeholder:
    return Placeholder(
        epoch=EPOCH,
        object_key=f"level_zero/data/123/{EPOCH:018}/0f8e6c1e-5d1b-4d0e-9a53-{n:012}",
        byte_offset=n * 4096,
        byte_length=4096,
        record_count=10,
        checksum=n * 2654435761 % 2**32,
    )


def make_record(log_offset: int) -> LogRecord:
    entry = make_placeholder(log_offset)
    return LogRecord(log_offset=log_offset, term=1, base_offset=log_offset * 10, entry=entry)


async def raw_rows_per_s(
    path: Path,
    batch: int,
    seconds: float,
    synchronous: str = "FULL",
    *,
    partitions: int = 1,
    partitions_per_batch: int = 1,
) -> float:
    """Rows/s for executemany(batch rows) + commit in a loop, rows encoded up front; the rows
    of a commit go to `partitions_per_batch` of `partitions` partitions (taken in turn), each
    partition's at consecutive log offsets after its previous ones, grouped by partition as
    the store stages an `append_many`."""
    assert 1 <= partitions_per_batch <= partitions, (partitions_per_batch, partitions)
    setup = await aiosqlite.connect(path, isolation_level=None)
    await setup.execute("PRAGMA journal_mode = WAL")
    await setup.executescript(SCHEMA)
    await setup.close()
    connection = await aiosqlite.connect(path)  # sqlite3 opens the transaction implicitly
    try:
        await connection.execute(f"PRAGMA synchronous = {synchronous}")
        pool = [log_row(1, make_record(o), 0.0) for o in range(ROW_POOL)]
        per_batch = min(partitions_per_batch, batch)
        counts = [batch // per_batch + (i < batch % per_batch) for i in range(per_batch)]
        next_offset = [0] * partitions
        done = turn = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            rows: list[tuple[Any, ...]] = []
            for i, count in enumerate(counts):
                pid = (turn + i) % partitions
                first = next_offset[pid]
                for offset in range(first, first + count):
                    row = pool[(done + len(rows)) % ROW_POOL]
                    # (the SUT's base offsets grow with each partition's log, as do these)
                    rows.append((pid + 1, offset, row[2], offset * 10, *row[4:]))
                next_offset[pid] = first + count
            turn += per_batch
            await connection.executemany(INSERT_LOG, rows)
            await connection.commit()
            done += batch
        return done / (time.perf_counter() - start)
    finally:
        await connection.close()


async def store_appends(
    path: Path, batch: int, seconds: float, synchronous: Synchronous, appenders: int
) -> tuple[float, float]:
    """Records/s through `SqliteLogStore.append` from `appenders` tasks (one partition each),
    `batch` records per call; also records per commit."""
    store = await SqliteLogStore.open(path, synchronous=synchronous)
    async with store:
        rows = await store.create_topic("bench", appenders, creation_epoch=1, now=0.0)
        for row in rows:
            await store.begin_term(row.pid, 0, 0)
        before = store.statistics()
        done = 0
        start = time.perf_counter()
        deadline = start + seconds

        async def appender(pid: int) -> None:
            nonlocal done
            next_offset = 1
            while time.perf_counter() < deadline:
                records = [make_record(next_offset + i) for i in range(batch)]
                await store.append(pid, 1, records)
                next_offset += batch
                done += batch

        async with anyio.create_task_group() as tg:
            for row in rows:
                tg.start_soon(appender, row.pid)
        elapsed = time.perf_counter() - start
        after = store.statistics()
    commits = after.commits - before.commits
    return done / elapsed, done / max(1, commits)


class Shape(msgspec.Struct, frozen=True):
    """What the group commit made of a run: records and appends (partitions) per commit."""

    records: float
    appends: float


async def actor_placeholders(
    path: Path | None, partitions: int, callers: int, seconds: float
) -> tuple[float, Shape, float]:
    """Placeholders/s written through PartitionActors on a SqliteLogStore at `path` (None: on a
    MemoryLogStore, which costs the loop next to nothing); the commits' shape (records and
    partitions per commit, which the floor then uses; 0 in memory); and the event-loop
    thread's CPU microseconds per placeholder."""
    async with contextlib.AsyncExitStack() as stack:
        if path is None:
            store: SqliteLogStore | MemoryLogStore = MemoryLogStore()
        else:
            store = await stack.enter_async_context(await SqliteLogStore.open(path))
        rows = await store.create_topic("bench", partitions, creation_epoch=EPOCH, now=0.0)
        board = WatermarkBoard()
        appender = Appender(store)  # the node's: one for all its partitions
        actors = [PartitionActor(row, store, board, appender=appender) for row in rows]
        async with anyio.create_task_group() as tg:
            await tg.start(appender.run)
            for actor in actors:
                await tg.start(actor.run)
            before = _records_and_commits(store)
            done = 0
            start = time.perf_counter()
            cpu_start = time.thread_time()
            deadline = start + seconds

            # Made up front, as the floor's rows are: what is measured is the write, not making its
            # input (a node's batcher makes placeholders; item 5 counts that).
            entries = [make_placeholder(n) for n in range(ROW_POOL)]

            async def caller(i: int) -> None:
                nonlocal done
                actor = actors[i % partitions]
                n = 0
                while time.perf_counter() < deadline:
                    await actor.write(entries[(i * 7 + n) % ROW_POOL])
                    n += 1
                done += n

            async with anyio.create_task_group() as callers_tg:
                for i in range(callers):
                    callers_tg.start_soon(caller, i)
            elapsed = time.perf_counter() - start
            cpu = time.thread_time() - cpu_start
            after = _records_and_commits(store)
            for actor in actors:
                await actor.stop()
            tg.cancel_scope.cancel()  # the appender
    records, appends, commits = (a - b for a, b in zip(after, before, strict=True))
    shape = Shape(records / commits, appends / commits) if commits else Shape(0.0, 0.0)
    return done / elapsed, shape, cpu / max(1, done) * 1e6


def _records_and_commits(store: SqliteLogStore | MemoryLogStore) -> tuple[int, int, int]:
    if isinstance(store, SqliteLogStore):
        statistics = store.statistics()
        return statistics.records, statistics.appends, statistics.commits
    return 0, 0, 0


async def run(settings: Settings) -> list[Figure]:
    seconds = settings.pick(max(2.0, settings.seconds), 0.5)
    rounds = settings.pick(settings.rounds, 1)
    per_commit: list[Shape] = []
    loop_us: list[float] = []
    in_memory: list[tuple[float, float]] = []  # (placeholders/s, loop CPU µs each)
    with work_dir(settings, ITEM) as root:

        async def sut(i: int) -> float:
            rate, records_per_commit, cpu_us = await actor_placeholders(
                root / f"actors-{i}.db", PARTITIONS, CALLERS, seconds
            )
            per_commit.append(records_per_commit)
            loop_us.append(cpu_us)
            return rate

        async def floor(i: int) -> float:
            # The commits' shape the group commit reached in the latest SUT run (round 0 runs
            # the SUT first, so there always is one; with ABBA it is at most one run old).
            assert per_commit
            shape = per_commit[-1]
            batch = max(1, round(shape.records))
            raw = await raw_rows_per_s(
                root / f"raw-{i}.db",
                batch,
                seconds,
                partitions=PARTITIONS,
                partitions_per_batch=max(1, min(PARTITIONS, round(shape.appends))),
            )
            # The same actors on a log store that costs nothing: the actor path's own ceiling.
            # Run after the floor, so the SQLite run and its floor stay neighbours either way.
            memory_rate, _, memory_us = await actor_placeholders(None, PARTITIONS, CALLERS, seconds)
            in_memory.append((memory_rate, memory_us))
            return raw

        pairs = await interleave(rounds, sut, floor)
    return [
        figure(
            ITEM,
            f"durable placeholders/s (actors + SqliteLogStore) vs raw aiosqlite group commit, "
            f"{PARTITIONS} partitions",
            "rows/s",
            pairs,
            target=TARGET,
            sut_label="placeholders",
            floor_label="raw rows",
            notes={
                "partitions": PARTITIONS,
                "callers": CALLERS,
                "seconds": seconds,
                "records_per_commit": [round(x.records, 1) for x in per_commit],
                "partitions_per_commit": [round(x.appends, 1) for x in per_commit],
                "loop_cpu_us_per_placeholder": [round(x, 1) for x in loop_us],
                "synchronous": "FULL",
            },
        ),
        figure(
            ITEM,
            "the same actors on an in-memory log store (no SQLite: the actor path's ceiling) "
            "vs raw aiosqlite group commit",
            "rows/s",
            [(memory_rate, raw) for (memory_rate, _), (_, raw) in zip(in_memory, pairs, strict=True)],
            sut_label="placeholders",
            floor_label="raw rows",
            notes={"loop_cpu_us_per_placeholder": [round(us, 1) for _, us in in_memory]},
        ),
    ]
