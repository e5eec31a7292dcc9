"""Durable appends/s through SqliteLogStore against raw aiosqlite, same rows, same fsync policy.

    python bench/bench_log_store.py [--seconds 1] [--rounds 3] [--synchronous FULL] [--appenders 64]

For each batch size (records per append call) it measures, for `--seconds` each, `--rounds`
times interleaved (fsync latency drifts on shared disks; the table shows each median):
- raw:        one aiosqlite `executemany` of the batch's rows into the same `log` table + commit,
              back to back (what a single writer without group commit would do);
- single:     one task calling `SqliteLogStore.append` back to back (the store's overhead);
- concurrent: `--appenders` tasks, one partition each, appending at once (group commit).
The ratio column is store / raw at the same batch size; the target is >= 50% at batch 100.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiosqlite
import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from levelzero.core.entries import LogRecord, Placeholder  # noqa: E402
from levelzero.storage.sqlite_log import (  # noqa: E402
    _INSERT_LOG,
    _SCHEMA,
    SqliteLogStore,
    _log_row,
)

BATCH_SIZES = (1, 10, 100)
ROW_POOL = 1000  # distinct pre-encoded rows the raw baseline cycles through


def make_record(log_offset: int) -> LogRecord:
    entry = Placeholder(
        epoch=7,
        object_key=f"level_zero/data/123/{7:018}/0f8e6c1e-5d1b-4d0e-9a53-{log_offset:012}",
        byte_offset=log_offset * 4096,
        byte_length=4096,
        record_count=10,
        checksum=log_offset * 2654435761 % 2**32,
    )
    return LogRecord(log_offset=log_offset, term=1, base_offset=log_offset * 10, entry=entry)


async def bench_raw(path: str, batch: int, seconds: float, synchronous: str) -> float:
    """Rows/s for executemany(batch rows) + commit in a loop; rows are encoded up front, so
    the baseline pays nothing but SQLite and aiosqlite's thread hops."""
    setup = await aiosqlite.connect(path, isolation_level=None)
    await setup.execute("PRAGMA journal_mode = WAL")
    await setup.executescript(_SCHEMA)
    await setup.close()
    connection = await aiosqlite.connect(path)  # sqlite3 opens the transaction implicitly
    try:
        await connection.execute(f"PRAGMA synchronous = {synchronous}")
        pool = [_log_row(1, make_record(o), 0.0) for o in range(ROW_POOL)]
        next_offset = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            rows = [
                (1, offset, *pool[offset % ROW_POOL][2:])
                for offset in range(next_offset, next_offset + batch)
            ]
            await connection.executemany(_INSERT_LOG, rows)
            await connection.commit()
            next_offset += batch
        return next_offset / (time.perf_counter() - start)
    finally:
        await connection.close()


async def bench_store(
    path: str, batch: int, seconds: float, synchronous: str, appenders: int
) -> tuple[float, float]:
    """Records/s through `append` with `appenders` concurrent tasks; also records per commit."""
    store = await SqliteLogStore.open(path, synchronous=synchronous)  # type: ignore[arg-type]
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


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL")
    parser.add_argument("--appenders", type=int, default=64)
    parser.add_argument("--dir", default=None, help="directory for the databases (default: tmp)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(
            f"synchronous={args.synchronous}  seconds/config={args.seconds}  rounds={args.rounds}  "
            f"concurrent appenders={args.appenders}  dir={tmp}"
        )
        header = (
            f"{'batch':>5} | {'raw rows/s':>11} | {'single rec/s':>12} {'ratio':>6} | "
            f"{'concurrent rec/s':>16} {'ratio':>6} {'rec/commit':>10}"
        )
        print(header)
        print("-" * len(header))
        for batch in BATCH_SIZES:
            raws, singles, concurrents, per_commits = [], [], [], []
            for round_index in range(args.rounds):
                tag = f"{batch}-{round_index}-{os.getpid()}"
                raws.append(
                    await bench_raw(f"{tmp}/raw-{tag}.db", batch, args.seconds, args.synchronous)
                )
                single, _ = await bench_store(
                    f"{tmp}/single-{tag}.db", batch, args.seconds, args.synchronous, 1
                )
                concurrent, per_commit = await bench_store(
                    f"{tmp}/concurrent-{tag}.db",
                    batch,
                    args.seconds,
                    args.synchronous,
                    args.appenders,
                )
                singles.append(single)
                concurrents.append(concurrent)
                per_commits.append(per_commit)
            raw = statistics.median(raws)
            single = statistics.median(singles)
            concurrent = statistics.median(concurrents)
            per_commit = statistics.median(per_commits)
            print(
                f"{batch:>5} | {raw:>11,.0f} | {single:>12,.0f} {single / raw:>6.0%} | "
                f"{concurrent:>16,.0f} {concurrent / raw:>6.0%} {per_commit:>10,.0f}"
            )

if __name__ == "__main__":
    anyio.run(main)
