"""The actors' costs beside their raw baselines: fences/s and produce throughput.

    python -m levelzero.bench.sweep_actors [--seconds 1] [--callers 256] [--produce-mib 256]
                                 [--producers 1024] [--rounds 5] [--no-s3] [--only fence|produce]

A wider view than `levelzero bench --only fence,upload` (whose measurements it reuses, from
`levelzero.bench.fence` and `levelzero.bench.upload`).

Fences (target: partition / bare >= 50%), counted per CPU second of this (single-threaded)
process, so other load on the machine does not move the figures:
- bare:      N tasks, each reading a bounded memory object stream (the partition mailbox's size,
             with the partition's `Inbox` / `send_soon` discipline) and answering every message
             through `levelzero.actors.mailbox.Reply`, doing no work;
- partition: N PartitionActors taking placeholder writes (`PartitionActor.write`: the fence
             decision, a read unit taken, the append to an in-memory log store that drops it,
             the apply, a fence event noted and flushed; the last column with fence events off);
  `--callers` tasks spread over the N actors call in a closed loop, for N = 1 and N = 64.

Produce (target: node / raw PUT bytes/s >= 70%), wall clock, median of `--rounds` rounds, each
a node run followed at once by its raw run:
- node:      `--producers` tasks call `Node.produce` in a closed loop (`--records` records of
             `--value-bytes` each per call, 16 partitions) until `--produce-mib` of payload is
             acknowledged; SQLite log store (synchronous FULL, the daemon's default), default
             batcher (linger 250 ms, 4 MiB objects, 8 uploads at once, 64 MiB in flight);
             reconciler and housekeeper off (they would read and write the same store);
- raw PUT:   as many objects of the node's mean object size, put with the same concurrency as
             the batcher's `uploads_max`: through LocalObjectStore for the local store, through a
             bare aiobotocore client for S3 (a moto server subprocess, as tests/conftest.py).
The ratio compares bytes/s of uploaded objects (same objects, same store); payload MB/s counts
only record values. "loop CPU ms/MB" is the event-loop thread's CPU time per MB uploaded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from levelzero.actors.batcher import BatcherConfig
from levelzero.bench.common import moto_server, raw_s3_client, s3_config
from levelzero.bench.fence import bare_round_trips, fenced_writes
from levelzero.bench.upload import (
    PARTITIONS,
    ProduceFigures,
    empty_bucket,
    produce_through_node,
    raw_puts,
)
from levelzero.storage.local_store import LocalObjectStore
from levelzero.storage.protocols import ObjectStore
from levelzero.storage.s3_store import S3ObjectStore

FENCE_PARTITIONS = (1, 64)
BUCKET = "levelzero-bench"


async def run_fences(args: argparse.Namespace) -> None:
    print(
        f"\nfences: {args.callers} concurrent callers, {args.seconds} s per figure, "
        f"{args.rounds} rounds (medians; ratio: median of each round's own ratio)"
    )
    header = (
        f"{'partitions':>10} | {'bare round trips/s':>18} | {'fences/s':>10} {'ratio':>6} | "
        f"{'fences/s, no events':>19} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    median = statistics.median
    for partitions in FENCE_PARTITIONS:
        rounds = []
        for _ in range(args.rounds):
            bare = await bare_round_trips(partitions, args.callers, args.seconds)
            fences = await fenced_writes(partitions, args.callers, args.seconds, True)
            quiet = await fenced_writes(partitions, args.callers, args.seconds, False)
            rounds.append((bare, fences, quiet))
        bare, fences, quiet = (median(r[i] for r in rounds) for i in range(3))
        ratio = median(f / b for b, f, _ in rounds)
        quiet_ratio = median(q / b for b, _, q in rounds)
        print(
            f"{partitions:>10} | {bare:>18,.0f} | {fences:>10,.0f} {ratio:>6.0%} | "
            f"{quiet:>19,.0f} {quiet_ratio:>6.0%}"
        )


@dataclass(frozen=True)
class ProduceRound:
    """A node run and, right after it, its raw run: they share the machine's mood."""

    node: ProduceFigures
    raw_bytes_s: float
    raw_loop_ms_per_mb: float

    @property
    def ratio(self) -> float:
        return self.node.object_bytes_per_s / self.raw_bytes_s


def print_produce_row(where: str, rounds: list[ProduceRound]) -> None:
    median = statistics.median
    node = sorted((r.node for r in rounds), key=lambda n: n.object_bytes_per_s)[len(rounds) // 2]
    raw_mb_s = median(r.raw_bytes_s for r in rounds) / 1e6
    print(
        f"{where:>6} | {node.records / node.seconds:>10,.0f} "
        f"{node.payload_bytes / node.seconds / 1e6:>12.1f} "
        f"{node.object_bytes_per_s / 1e6:>11.1f} | "
        f"{node.objects:>7} {node.mean_object_bytes / 1e6:>6.2f} "
        f"{node.extents / node.objects:>7.1f} | {raw_mb_s:>12.1f} | "
        f"{median(r.ratio for r in rounds):>6.0%} | "
        f"{median(r.node.loop_ms_per_mb for r in rounds):>5.2f} "
        f"{median(r.raw_loop_ms_per_mb for r in rounds):>5.2f} | "
        + " ".join(f"{r.ratio:.0%}" for r in rounds)
    )


async def produce_rounds(
    args: argparse.Namespace,
    node_store: Callable[[int], ObjectStore],
    raw_put: Callable[[int], Callable[[str, bytes], Awaitable[object]]],
    db_prefix: str,
    between_rounds: Callable[[], Awaitable[object]],
) -> list[ProduceRound]:
    rounds = []
    for i in range(args.rounds):
        node = await produce_through_node(
            node_store(i),
            Path(f"{db_prefix}-{i}.db"),
            args.produce_mib,
            producers=args.producers,
            records_per_call=args.records,
            value_bytes=args.value_bytes,
        )
        raw_bytes_s, raw_cpu = await raw_puts(
            raw_put(i), node.mean_object_bytes, node.objects, BatcherConfig().uploads_max
        )
        rounds.append(ProduceRound(node, raw_bytes_s, raw_cpu))
        await between_rounds()
    return rounds


async def run_produce(args: argparse.Namespace) -> None:
    uploads_max = BatcherConfig().uploads_max
    print(
        f"\nproduce: {args.producers} producers x {args.records} records x {args.value_bytes} B, "
        f"{PARTITIONS} partitions, {args.produce_mib} MiB payload per round, "
        f"{args.rounds} rounds (medians); raw PUTs {uploads_max} at a time"
    )
    header = (
        f"{'store':>6} | {'records/s':>10} {'payload MB/s':>12} {'object MB/s':>11} | "
        f"{'objects':>7} {'MB/obj':>6} {'ext/obj':>7} | {'raw PUT MB/s':>12} | {'ratio':>6} | "
        f"{'loop CPU ms/MB':>11} | per round\n"
        f"{'':>6} | {'':>10} {'':>12} {'':>11} | {'':>7} {'':>6} {'':>7} | {'':>12} | {'':>6} | "
        f"{'node':>5} {'raw':>5} |"
    )
    print(header)
    print("-" * len(header.splitlines()[0]))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)

        async def drop_local_objects() -> None:
            for path in root.glob("*-objects-*"):
                await anyio.to_thread.run_sync(shutil.rmtree, path)

        rounds = await produce_rounds(
            args,
            lambda i: LocalObjectStore(root / f"node-objects-{i}"),
            lambda i: LocalObjectStore(root / f"raw-objects-{i}").put,  # fresh, like the node's
            f"{tmp}/local-log",
            drop_local_objects,
        )
        print_produce_row("local", rounds)

        if args.no_s3:
            return
        async with (
            moto_server(root) as url,
            S3ObjectStore(s3_config(url, BUCKET)) as s3,
            raw_s3_client(url) as client,
        ):

            async def raw_put(key: str, data: bytes) -> None:
                await client.put_object(Bucket=BUCKET, Key=key, Body=data)

            rounds = await produce_rounds(
                args, lambda _: s3, lambda _: raw_put, f"{tmp}/s3-log", lambda: empty_bucket(s3)
            )
        print_produce_row("s3", rounds)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per fence figure")
    parser.add_argument("--callers", type=int, default=256, help="concurrent fence callers")
    parser.add_argument("--produce-mib", type=int, default=256)
    parser.add_argument("--producers", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5, help="node/raw pairs per store")
    parser.add_argument("--records", type=int, default=64, help="records per produce call")
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--no-s3", action="store_true", help="skip the moto S3 figures")
    parser.add_argument("--only", choices=("fence", "produce"), default=None)
    parser.add_argument("--dir", default=None, help="directory for stores (default: tmp)")
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, anyio on asyncio")
    if args.only in (None, "fence"):
        await run_fences(args)
    if args.only in (None, "produce"):
        await run_produce(args)


if __name__ == "__main__":
    anyio.run(main)
