"""Item 10: the PostgreSQL control plane — durable placeholders/s through partition actors and
`PostgresLogStore`, beside the raw driver committing the same rows in the same batch sizes; and
the log store's commit latency (one `append` call, queueing included) p50/p99 on PostgreSQL
beside SQLite's at the same load.

- sut:   `PARTITIONS` PartitionActors on one PostgresLogStore; `CALLERS` tasks write
         `Placeholder`s in a closed loop, as item 4 does on SQLite;
- floor: one asyncpg connection doing BEGIN; INSERT ... SELECT FROM unnest(<that many rows>);
         COMMIT back to back into a table shaped like `log` (rows encoded up front): the server
         and the driver, nothing of levelzero. The batch size is the records per commit the
         group commit reached in the SUT run before it.
The server: a throwaway one started for the run (initdb + pg_ctl, default settings except the
port; fsync stays on, so a commit costs what it costs in production on this disk), or the one
named by LEVELZERO_BENCH_POSTGRES_DSN (a user that may create databases). Each run gets a fresh
database. Target: sut >= 50% of raw rows/s.
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
import asyncpg

from levelzero.actors.partition import PartitionActor, WatermarkBoard
from levelzero.core.entries import LogRecord
from levelzero.core.errors import NotLeader
from levelzero.storage.log_rules import log_row
from levelzero.storage.protocols import Append
from levelzero.storage.postgres.store import PostgresLogStore
from levelzero.testing.postgres import start_throwaway
from levelzero.storage.sqlite import SqliteLogStore

from .common import Figure, Settings, Target, figure, interleave, work_dir
from .durable import CALLERS, EPOCH, PARTITIONS, ROW_POOL, make_placeholder, make_record

ITEM = "control"
TARGET = Target(0.50)
DSN_ENV = "LEVELZERO_BENCH_POSTGRES_DSN"
_RAW_TABLE = """CREATE TABLE raw_log (
    pid BIGINT NOT NULL, log_offset BIGINT NOT NULL, term BIGINT NOT NULL,
    base_offset BIGINT NOT NULL, kind TEXT NOT NULL, epoch BIGINT, record_count BIGINT NOT NULL,
    byte_length BIGINT NOT NULL, object_key TEXT, entry BYTEA NOT NULL,
    appended_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (pid, log_offset))"""
_RAW_INSERT = """INSERT INTO raw_log SELECT * FROM unnest($1::bigint[], $2::bigint[],
    $3::bigint[], $4::bigint[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], $9::text[],
    $10::bytea[], $11::float8[])"""


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

    async def append_many(self, appends: Sequence[Append]) -> list[NotLeader | None]:
        started = time.perf_counter()
        refused = await self._inner.append_many(appends)
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


async def actor_placeholders(store: Any, seconds: float) -> tuple[float, float, list[float]]:
    """Placeholders/s through PartitionActors on `store`, its records per commit, and every
    append call's duration."""
    timed = _TimedAppends(store)
    rows = await store.create_topic("bench", PARTITIONS, creation_epoch=EPOCH, now=0.0)
    board = WatermarkBoard()
    actors = [PartitionActor(row, timed, board) for row in rows]  # type: ignore[arg-type]
    async with anyio.create_task_group() as tg:
        for actor in actors:
            await tg.start(actor.run)
        before = store.statistics()
        done = 0
        start = time.perf_counter()
        deadline = start + seconds

        async def caller(i: int) -> None:
            nonlocal done
            actor = actors[i % PARTITIONS]
            n = 0
            while time.perf_counter() < deadline:
                await actor.write(make_placeholder(i * 1_000_000 + n))
                n += 1
            done += n

        async with anyio.create_task_group() as callers_tg:
            for i in range(CALLERS):
                callers_tg.start_soon(caller, i)
        elapsed = time.perf_counter() - start
        after = store.statistics()
        for actor in actors:
            await actor.stop()
    commits = after.commits - before.commits
    per_commit = (after.records - before.records) / commits if commits else 0.0
    return done / elapsed, per_commit, timed.durations_s


async def raw_rows_per_s(dsn: str, batch: int, seconds: float) -> float:
    """Rows/s for BEGIN; INSERT unnest(batch rows); COMMIT in a loop on one connection."""
    pool = [log_row(1, make_record(o), 0.0) for o in range(ROW_POOL)]
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(_RAW_TABLE)
        done = offset = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            rows = [pool[(offset + i) % ROW_POOL] for i in range(batch)]
            columns = [[row[c] for row in rows] for c in range(11)]
            columns[1] = list(range(offset, offset + batch))  # distinct keys
            async with connection.transaction():
                await connection.execute(_RAW_INSERT, *columns)
            offset += batch
            done += batch
        return done / (time.perf_counter() - start)
    finally:
        await connection.close()


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


async def run(settings: Settings) -> list[Figure]:
    seconds = settings.pick(max(2.0, settings.seconds), 0.5)
    rounds = settings.pick(settings.rounds, 1)
    per_commit: list[float] = []
    latencies: list[tuple[list[float], list[float]]] = []  # (postgres, sqlite) per round
    async with _server() as admin:
        with work_dir(settings, ITEM) as root:
            pg_durations: list[list[float]] = []

            async def sut(i: int) -> float:
                async with _fresh_database(admin) as dsn:
                    async with await PostgresLogStore.open(dsn) as store:
                        rate, records_per_commit, durations = await actor_placeholders(store, seconds)
                per_commit.append(records_per_commit)
                pg_durations.append(durations)
                return rate

            async def floor(i: int) -> float:
                assert per_commit
                batch = max(1, round(per_commit[-1]))
                async with _fresh_database(admin) as dsn:
                    raw = await raw_rows_per_s(dsn, batch, seconds)
                # SQLite at the same load, for the latency figures (not part of the ratio).
                async with await SqliteLogStore.open(Path(root) / f"sqlite-{i}.db") as store:
                    _, _, sqlite_durations = await actor_placeholders(store, seconds)
                latencies.append((pg_durations[-1], sqlite_durations))
                return raw

            pairs = await interleave(rounds, sut, floor)
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
                "records_per_commit": [round(x, 1) for x in per_commit],
                "server": "LEVELZERO_BENCH_POSTGRES_DSN" if os.environ.get(DSN_ENV) else "throwaway, fsync on",
            },
        ),
        figure(ITEM, "log store commit latency p50 (one append call), PostgreSQL vs SQLite",
               "ms", p50, sut_label="postgres", floor_label="sqlite",
               notes={"appends": [len(pg) for pg, _ in latencies]}),
        figure(ITEM, "log store commit latency p99 (one append call), PostgreSQL vs SQLite",
               "ms", p99, sut_label="postgres", floor_label="sqlite"),
    ]

