"""GC delete throughput and eligible->deleted lag against moto's S3 server.

    python -m levelzero.bench.sweep_gc [--objects 20000] [--lag-steps 8] [--memory-objects 200000]

A wider view than `levelzero bench --only gc` (whose measurements it reuses, from
`levelzero.bench.gc`). Figures (all in one run, same moto server, same keys, tiny bodies):
- memory:        one GC round over `--memory-objects` eligible objects in the memory store —
                 the actor's own cost (scan, batching, bookkeeping) without a network;
- gc catalog:    one catalog round of `GcActor.run_round()` over `--objects` eligible objects
                 spread over the 1000 prefixes like the batcher spreads them, recorded in a
                 SQLite catalog as the batcher records its uploads (the GC's steady state);
- gc sweep:      one sweep round over the same objects (listing + deleting, pipelined);
- gc dry run:    the same listing without deletes (what listing alone costs on this server);
- raw delete:    aiobotocore DeleteObjects of the same keys (re-created), 1000 a request,
                 4 in flight, keys known up front — the floor no GC can beat;
- raw list+del:  the least a lister can do: list the root page by page and delete each page
                 as one request (4 in flight), same keys re-created.
The ratios are reported against both baselines. The target is catalog >= 80% of raw delete.

Lag: the GC loop runs with interval_s 0.5 and 1.0; at a random moment M(p) is raised so that
20 objects become eligible; the time until each is deleted is recorded (median, p90, max),
once with idle_backoff_max_s = interval_s and once with 8 x interval_s.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

import anyio

from levelzero.bench.common import moto_server, quantile, raw_s3_client, s3_config
from levelzero.bench.gc import (
    BUCKET,
    LAG_OBJECTS_PER_STEP,
    create_objects,
    gc_lags,
    gc_round_s,
    make_keys,
    memory_store_round_rate,
    ready_gc,
    record_objects,
    raw_delete_s,
    raw_list_and_delete_s,
)
from levelzero.core.keys import PREFIX_COUNT
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.s3_store import S3ObjectStore
from levelzero.storage.sqlite import SqliteLogStore


async def bench_throughput(url: str, count: int, root: Path) -> None:
    keys = make_keys(count, random.Random(7))
    async with S3ObjectStore(s3_config(url, BUCKET)) as store, raw_s3_client(url) as client:
        async with await SqliteLogStore.open(root / "catalog.db") as catalog:
            catalog_gc = await ready_gc(store, catalog, sweep=False)
            put_s = await create_objects(url, BUCKET, keys)
            print(f"created {count} objects in {put_s:.1f} s ({count / put_s:.0f}/s, not measured below)")
            await record_objects(catalog, keys)
            catalog_s, catalog_report = await gc_round_s(catalog_gc, count)
        sweeper = await ready_gc(store, MemoryLogStore(), sweep=True)
        await create_objects(url, BUCKET, keys)
        dry_s, dry = await gc_round_s(sweeper, count, dry_run=True)
        gc_s, report = await gc_round_s(sweeper, count)
        await create_objects(url, BUCKET, keys)
        raw_s = await raw_delete_s(client, BUCKET, keys)
        await create_objects(url, BUCKET, keys)
        raw_list_s, raw_listed = await raw_list_and_delete_s(client, BUCKET)
        assert raw_listed == count, raw_listed

    gc_rate, raw_rate, raw_list_rate = count / gc_s, count / raw_s, count / raw_list_s
    catalog_rate = count / catalog_s
    print()
    print(f"{'what':<34}{'seconds':>9}{'objects/s':>12}{'requests':>22}")
    print(
        f"{'gc catalog round':<34}{catalog_s:>9.2f}{catalog_rate:>12.0f}"
        f"{catalog_report.list_requests:>13} list {catalog_report.delete_requests:>3} del"
    )
    print(f"{'gc dry run (listing only)':<34}{dry_s:>9.2f}{count / dry_s:>12.0f}{dry.list_requests:>13} list")
    print(
        f"{'gc sweep round (list + delete)':<34}{gc_s:>9.2f}{gc_rate:>12.0f}"
        f"{report.list_requests:>13} list {report.delete_requests:>3} del"
    )
    print(f"{'raw DeleteObjects (keys known)':<34}{raw_s:>9.2f}{raw_rate:>12.0f}{-(-count // 1000):>22} del")
    print(f"{'raw list pages + DeleteObjects':<34}{raw_list_s:>9.2f}{raw_list_rate:>12.0f}")
    print()
    print(f"gc catalog / raw DeleteObjects:    {catalog_rate / raw_rate:6.1%}  (target >= 80%)")
    print(f"gc sweep / raw DeleteObjects:      {gc_rate / raw_rate:6.1%}")
    print(f"gc sweep / raw list + DeleteObjects: {gc_rate / raw_list_rate:6.1%}")
    print(
        f"gc sweep minus its listing time:   {max(gc_s - dry_s, 0.0):.2f} s "
        f"(the deletes overlap the listing; listing is {dry_s / gc_s:.0%} of the round)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--memory-objects", type=int, default=200_000)
    parser.add_argument("--lag-steps", type=int, default=8)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-lag", action="store_true")
    args = parser.parse_args()

    print(
        f"memory store: one GC round over {args.memory_objects} eligible objects: "
        f"{await memory_store_round_rate(args.memory_objects):,.0f} objects/s"
    )
    with tempfile.TemporaryDirectory(prefix="bench-gc-") as tmp:
        async with moto_server(Path(tmp)) as url:
            async with S3ObjectStore(s3_config(url, BUCKET)):
                pass  # creates the bucket
            if not args.skip_throughput:
                print(f"\nmoto at {url}: {args.objects} eligible objects over {PREFIX_COUNT} prefixes")
                await bench_throughput(url, args.objects, Path(tmp))
            if not args.skip_lag:
                steps = f"{LAG_OBJECTS_PER_STEP} objects x {args.lag_steps} steps each"
                print(f"\neligible -> deleted lag ({steps})")
                print(f"{'interval_s':>10}{'idle_backoff_max_s':>20}{'median s':>10}{'p90 s':>8}{'max s':>8}")
                for interval_s in (0.5, 1.0):
                    for factor in (1, 8):
                        lags = await gc_lags(url, interval_s, factor, args.lag_steps, Path(tmp))
                        print(
                            f"{interval_s:>10}{interval_s * factor:>20}{statistics.median(lags):>10.2f}"
                            f"{quantile(lags, 0.9):>8.2f}{max(lags):>8.2f}"
                        )


if __name__ == "__main__":
    anyio.run(main)
