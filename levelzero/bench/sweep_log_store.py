"""Durable appends/s through SqliteLogStore against raw aiosqlite, same rows, same fsync policy.

    python -m levelzero.bench.sweep_log_store [--seconds 1] [--rounds 3] [--synchronous FULL] [--appenders 64]

A batch-size sweep beside `levelzero bench --only durable` (whose measurements it reuses, from
`levelzero.bench.durable`). For each batch size (records per append call) it measures, for
`--seconds` each, `--rounds` times interleaved (the table shows each median):
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
import tempfile
from pathlib import Path

import anyio

from levelzero.bench.durable import raw_rows_per_s, store_appends

BATCH_SIZES = (1, 10, 100)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL")
    parser.add_argument("--appenders", type=int, default=64)
    parser.add_argument("--dir", default=None, help="directory for the databases (default: tmp)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
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
                    await raw_rows_per_s(root / f"raw-{tag}.db", batch, args.seconds, args.synchronous)
                )
                single, _ = await store_appends(
                    root / f"single-{tag}.db", batch, args.seconds, args.synchronous, 1
                )
                concurrent, per_commit = await store_appends(
                    root / f"concurrent-{tag}.db",
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
