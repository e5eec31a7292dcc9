"""Item 10: the PostgreSQL control plane — durable placeholders/s through partition actors and
`PostgresLogStore`, beside the raw driver committing the same rows in the same batch sizes; and
the log store's commit latency (one `append` call, queueing included) p50/p99 on PostgreSQL
beside SQLite's at the same load.

- sut:   `PARTITIONS` PartitionActors on one PostgresLogStore, sharing one `Appender` as a
         node's partitions do (one `append_many` for every partition with records queued);
         `CALLERS` tasks write `Placeholder`s in a closed loop, as item 4 does on SQLite;
- floor: the database work of the same appends with the driver alone: `WRITERS` asyncpg
         connections (the store's writers), each sending the store's fence-and-append statement
         (lock the batch's partition rows, advance those whose term and offset match, insert
         their log rows) back to back on its own half of the partitions, as the store sends an
         append-only batch: the statement alone, a transaction by itself. Once a second each
         writer's batch also carries a fence-event row per partition of its half, as the SUT's
         appender writes the partitions' buffered fence events once a second (the batch is then
         BEGIN; the statement; the events' insert; COMMIT, as the store's mixed batches are).
         In the batch shape the group commit reached in the SUT run before it (records and
         partitions per commit), rows encoded up front. Nothing of levelzero runs: no actors,
         no batching, no Python per record beyond building the arrays.
The server: a throwaway one started for the run (initdb + pg_ctl, default settings except the
port; fsync stays on, so a commit costs what it costs in production on this disk), or the one
named by LEVELZERO_BENCH_POSTGRES_DSN (a user that may create databases). Each run gets a fresh
database. Target: sut >= 70% of raw rows/s.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_process
import asyncpg
import msgspec

from levelzero.actors.appender import FENCE_EVENTS_FLUSH_INTERVAL_S, Appender
from levelzero.actors.partition import PartitionActor
from levelzero.core.leader import WatermarkBoard
from levelzero.core.entries import LogRecord
from levelzero.core.errors import NotLeader
from levelzero.daemon.gc_tuning import tuned_gc
from levelzero.storage.log_rules import log_row
from levelzero.storage.protocols import Append, L0ObjectRow, OnDurable
from levelzero.storage.postgres.base import _FENCE_INSERT, APPEND_BATCH, WRITERS
from levelzero.storage.postgres.store import PostgresLogStore
from levelzero.testing.postgres import start_throwaway
from levelzero.storage.sqlite import SqliteLogStore

from .common import Figure, Settings, Target, figure, frozen_heap, interleave, work_dir
from .durable import CALLERS, EPOCH, PARTITIONS, ROW_POOL, make_placeholder, make_record

ITEM = "control"
TARGET = Target(0.70)
DSN_ENV = "LEVELZERO_BENCH_POSTGRES_DSN"


class _TimedAppends:
    """The store as the actors see it, with each `append` call's duration kept."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.durations_s: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
        started = time.perf_counter()
        await self._inner.append(pid, expected_term, records)
        self.durations_s.append(time.perf_counter() - started)

    async def append_many(
        self, appends: Sequence[Append], on_durable: OnDurable | None = None
    ) -> list[NotLeader | None]:
        started = time.perf_counter()
        refused = await self._inner.append_many(appends, on_durable)
        self.durations_s.append(time.perf_counter() - started)
        return refused


@contextlib.asynccontextmanager
async def _server() -> AsyncIterator[str]:
    """An admin DSN: LEVELZERO_BENCH_POSTGRES_DSN, or a throwaway server's."""
    given = os.environ.get(DSN_ENV)
    if given:
        yield given
        return
    server = await anyio.to_thread.run_sync(start_throwaway)
    try:
        # The tests' servers run with fsync off; a benchmark measures the real commit.
        await anyio.to_thread.run_sync(server.stop)
        server.fsync = True
        await anyio.to_thread.run_sync(server.start)
        yield server.dsn()
    finally:
        await anyio.to_thread.run_sync(server.close)


@contextlib.asynccontextmanager
async def _fresh_database(admin: str) -> AsyncIterator[str]:
    name = f"levelzero_bench_{uuid.uuid4().hex[:12]}"
    connection = await asyncpg.connect(admin)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    try:
        parts = urllib.parse.urlsplit(admin)
        yield urllib.parse.urlunsplit(parts._replace(path="/" + name))
    finally:
        connection = await asyncpg.connect(admin)
        try:
            await connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await connection.close()


class _Shape(msgspec.Struct, frozen=True):
    """What the group commit made of a run: records and appends (partitions) per commit."""

    records: float
    appends: float


async def actor_placeholders(
    store: Any,
    seconds: float,
    topic: str = "bench",
    *,
    start_at: float | None = None,
    catalog: bool = False,
) -> tuple[float, _Shape, list[float]]:
    """Placeholders/s through PartitionActors on `store`, its commits' shape, and every
    append call's duration. `start_at`: a wall-clock time to start at (several processes
    measure together); `catalog`: L0 catalog rows are recorded back to back meanwhile, as a
    node's batcher records one per uploaded object (they ride in the appends' commits)."""
    timed = _TimedAppends(store)
    rows = await store.create_topic(topic, PARTITIONS, creation_epoch=EPOCH, now=0.0)
    board = WatermarkBoard()
    appender = Appender(timed)  # the node's: one for all its partitions (`Node.appender`)
    actors = [PartitionActor(row, timed, board, appender=appender) for row in rows]
    async with anyio.create_task_group() as tg:
        await tg.start(appender.run)
        for actor in actors:
            await tg.start(actor.run)
        if start_at is not None:
            await anyio.sleep(max(0.0, start_at - time.time()))
        before = store.statistics()
        done = 0
        start = time.perf_counter()
        deadline = start + seconds

        # Made up front, as the floor's rows are: what is measured is the write, not making its
        # input (a node's batcher makes placeholders; item 5 counts that).
        entries = [make_placeholder(n) for n in range(ROW_POOL)]

        async def caller(i: int) -> None:
            nonlocal done
            actor = actors[i % PARTITIONS]
            n = 0
            while time.perf_counter() < deadline:
                await actor.write(entries[(i * 7 + n) % ROW_POOL])
                n += 1
            done += n

        async def record_objects() -> None:
            n = 0
            while time.perf_counter() < deadline:
                await store.record_l0_object(
                    L0ObjectRow(f"{topic}/{uuid.uuid4()}", EPOCH, 4096 * 10, time.time(), 10)
                )
                n += 1

        async with anyio.create_task_group() as callers_tg:
            for i in range(CALLERS):
                callers_tg.start_soon(caller, i)
            if catalog:
                callers_tg.start_soon(record_objects)
        elapsed = time.perf_counter() - start
        after = store.statistics()
        for actor in actors:
            await actor.stop()
        tg.cancel_scope.cancel()  # the appender
    commits = max(1, after.commits - before.commits)
    shape = _Shape((after.records - before.records) / commits, (after.appends - before.appends) / commits)
    return done / elapsed, shape, timed.durations_s


async def raw_rows_per_s(dsn: str, batch: int, partitions_per_batch: int, seconds: float) -> float:
    """Rows/s of the store's fence-and-append statement in transactions of `batch` rows over
    `partitions_per_batch` partitions, on WRITERS connections, each on its own partitions."""
    async with await PostgresLogStore.open(dsn) as store:  # the schema and the terms: set-up
        rows = await store.create_topic("bench", PARTITIONS, creation_epoch=EPOCH, now=0.0)
        for row in rows:
            await store.begin_term(row.pid, 0, 0)
    pids = [row.pid for row in rows]
    pool = [log_row(1, make_record(o), 0.0) for o in range(ROW_POOL)]
    next_offset = dict.fromkeys(pids, 1)
    done = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def writer(own: list[int]) -> None:
        nonlocal done
        per_batch = max(1, min(partitions_per_batch, len(own)))
        connection = await asyncpg.connect(dsn)
        try:
            turn = 0
            events_due = start + FENCE_EVENTS_FLUSH_INTERVAL_S
            while time.perf_counter() < deadline:
                chosen = [own[(turn + i) % len(own)] for i in range(per_batch)]
                turn += per_batch
                counts = [batch // per_batch + (i < batch % per_batch) for i in range(per_batch)]
                asks: list[tuple[int, int, int, int]] = []
                log_rows: list[tuple[Any, ...]] = []
                for pid, count in zip(chosen, counts, strict=True):
                    if not count:
                        continue
                    first = next_offset[pid]
                    asks.append((pid, 1, first, first + count))
                    for offset in range(first, first + count):
                        row = pool[(done + len(log_rows)) % ROW_POOL]
                        log_rows.append((pid, offset, *row[2:]))
                    next_offset[pid] = first + count
                columns = (*_columns(asks, 4), log_rows)  # the store's arguments
                if time.perf_counter() < events_due:
                    answer = await connection.fetch(APPEND_BATCH, *columns)
                else:
                    events_due += FENCE_EVENTS_FLUSH_INTERVAL_S
                    events = [(time.time(), pid, 1, EPOCH, "admitted", EPOCH, EPOCH, 4) for pid in own]
                    async with connection.transaction():
                        answer = await connection.fetch(APPEND_BATCH, *columns)
                        await connection.execute(_FENCE_INSERT, *_columns(events, 8))
                assert all(r["accepted"] for r in answer), answer
                done += len(log_rows)
        finally:
            await connection.close()

    async with anyio.create_task_group() as tg:
        for k in range(WRITERS):
            tg.start_soon(writer, pids[k::WRITERS])
    return done / (time.perf_counter() - start)


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [[row[i] for row in rows] for i in range(width)]


NODES = 3
NODE_START_S = 3.0  # the node processes start (import, connect, create their topic) before this


def _node(dsn: str, topic: str, seconds: float, start_at: float) -> float:
    """One simulated node in its own process: its own pool, actors and L0 catalog rows."""

    async def main() -> float:
        async with await PostgresLogStore.open(dsn) as store:
            rate, _, _ = await actor_placeholders(store, seconds, topic, start_at=start_at, catalog=True)
        return rate

    return anyio.run(main)


async def nodes_placeholders(dsn: str, nodes: int, seconds: float) -> float:
    """Placeholders/s of `nodes` node processes on one database, measured over the same
    seconds, each with PARTITIONS partitions of its own topic and CALLERS callers."""
    start_at = time.time() + NODE_START_S
    rates: list[float] = []
    limiter = anyio.CapacityLimiter(nodes)

    async def one(k: int) -> None:
        rates.append(
            await anyio.to_process.run_sync(
                _node, dsn, f"node{k}-{uuid.uuid4().hex[:8]}", seconds, start_at, limiter=limiter
            )
        )

    async with anyio.create_task_group() as tg:
        for k in range(nodes):
            tg.start_soon(one, k)
    return sum(rates)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def run(settings: Settings) -> list[Figure]:
    seconds = settings.pick(max(2.0, settings.seconds), 0.5)
    rounds = settings.pick(settings.rounds, 1)
    per_commit: list[_Shape] = []
    latencies: list[tuple[list[float], list[float]]] = []  # (postgres, sqlite) per round
    async with _server() as admin:
        with work_dir(settings, ITEM) as root:
            pg_durations: list[list[float]] = []

            async def sut(_round: int) -> float:
                async with _fresh_database(admin) as dsn, await PostgresLogStore.open(dsn) as store:
                    rate, records_per_commit, durations = await actor_placeholders(store, seconds)
                per_commit.append(records_per_commit)
                pg_durations.append(durations)
                return rate

            async def floor(i: int) -> float:
                assert per_commit
                shape = per_commit[-1]
                async with _fresh_database(admin) as dsn:
                    raw = await raw_rows_per_s(
                        dsn, max(1, round(shape.records)), max(1, round(shape.appends)), seconds
                    )
                # SQLite at the same load, for the latency figures (not part of the ratio).
                async with await SqliteLogStore.open(Path(root) / f"sqlite-{i}.db") as store:
                    _, _, sqlite_durations = await actor_placeholders(store, seconds)
                latencies.append((pg_durations[-1], sqlite_durations))
                return raw

            # The garbage collector as `levelzero run` sets it (`daemon/gc_tuning.py`: a young
            # generation of 50,000, and the heap frozen once the stores are open), as the scale,
            # latency and upload items run. With Python's defaults, which the daemon does not
            # run, the collector took about a quarter of the actors' CPU a placeholder: a young
            # collection every 700 allocations, and the records of a batch, alive for a commit,
            # promoted into collections of the older generations. The floor runs under the same
            # settings.
            with tuned_gc(), frozen_heap():
                pairs = await interleave(rounds, sut, floor)

            async def three(_round: int) -> float:
                async with _fresh_database(admin) as dsn:
                    return await nodes_placeholders(dsn, NODES, seconds)

            async def one(_round: int) -> float:
                async with _fresh_database(admin) as dsn:
                    return await nodes_placeholders(dsn, 1, seconds)

            scaling = await interleave(rounds, three, one)
    p50 = [(_quantile(pg, 0.5) * 1e3, _quantile(lite, 0.5) * 1e3) for pg, lite in latencies]
    p99 = [(_quantile(pg, 0.99) * 1e3, _quantile(lite, 0.99) * 1e3) for pg, lite in latencies]
    return [
        figure(
            ITEM,
            f"durable placeholders/s (actors + PostgresLogStore) vs raw asyncpg group commit, "
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
                "floor_connections": WRITERS,
                "server": (
                    "LEVELZERO_BENCH_POSTGRES_DSN" if os.environ.get(DSN_ENV) else "throwaway, fsync on"
                ),
            },
        ),
        figure(
            ITEM,
            "log store commit latency p50 (one append call), PostgreSQL vs SQLite",
            "ms",
            p50,
            sut_label="postgres",
            floor_label="sqlite",
            notes={"appends": [len(pg) for pg, _ in latencies]},
        ),
        figure(
            ITEM,
            "log store commit latency p99 (one append call), PostgreSQL vs SQLite",
            "ms",
            p99,
            sut_label="postgres",
            floor_label="sqlite",
        ),
        figure(
            ITEM,
            f"placeholders/s of {NODES} nodes vs 1 on one PostgreSQL (a process each, with L0 catalog rows)",
            "rows/s",
            scaling,
            sut_label=f"{NODES} nodes",
            floor_label="1 node",
            notes={
                "per_node": f"{PARTITIONS} partitions, {CALLERS} callers, L0 rows back to back",
                "nodes": "processes on this machine, each with its own PostgresLogStore",
            },
        ),
    ]
