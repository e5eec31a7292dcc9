"""The actors' costs beside their raw baselines: fences/s and produce throughput.

    python bench/bench_actors.py [--seconds 1] [--callers 256] [--produce-mib 256]
                                 [--producers 1024] [--rounds 5] [--no-s3] [--only fence|produce]

Fences (target: partition / bare >= 50%), counted per CPU second of this (single-threaded)
process, so other load on the machine does not move the figures:
- bare:      N tasks, each reading a bounded memory object stream (the partition mailbox's size)
             and answering every message through `levelzero.actors.mailbox.Reply`, doing no work;
- partition: N PartitionActors answering `fence_probe(epoch)` (the fence decision, a read unit
             taken and released, a fence event noted and flushed to a log store that drops it;
             the last column with fence events off);
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
only record values. 1024 producers x 64 KiB fill the batcher's 64 MiB in-flight budget.
"loop CPU ms/MB" is the event-loop thread's CPU time per MB uploaded (worker threads excluded):
the node's Python work per byte, which bounds its throughput once that thread is saturated.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from levelzero.actors.batcher import BatcherConfig  # noqa: E402
from levelzero.actors.housekeeper import HousekeeperConfig  # noqa: E402
from levelzero.actors.mailbox import Reply, mailbox  # noqa: E402
from levelzero.actors.node import Node, NodeConfig  # noqa: E402
from levelzero.actors.partition import MAILBOX_SIZE, PartitionActor, WatermarkBoard  # noqa: E402
from levelzero.actors.reconciler import ReconcilerConfig  # noqa: E402
from levelzero.core.keys import format_l0_key, new_uuid  # noqa: E402
from levelzero.core.l0format import Record  # noqa: E402
from levelzero.storage.local_store import LocalObjectStore  # noqa: E402
from levelzero.storage.memory_log import MemoryLogStore  # noqa: E402
from levelzero.storage.protocols import FenceEventRow, ObjectStore  # noqa: E402
from levelzero.storage.s3_store import S3Config, S3ObjectStore  # noqa: E402
from levelzero.storage.sqlite_log import SqliteLogStore  # noqa: E402

FENCE_PARTITIONS = (1, 64)
FENCE_EPOCH = 3
PRODUCE_PARTITIONS = 16
MOTO_START_TIMEOUT_S = 30.0
MOTO_ACCESS_KEY = "levelzero-bench"


# ------------------------------------------------------------------------------------ fences


class DroppingLogStore(MemoryLogStore):
    """Counts fence events instead of keeping them (a long run would hold millions)."""

    def __init__(self) -> None:
        super().__init__()
        self.fence_events_seen = 0

    async def record_fence_events(self, rows: Sequence[FenceEventRow]) -> None:
        self.fence_events_seen += len(rows)


async def closed_loop(
    callers: int, seconds: float, call: Callable[[int], Awaitable[object]]
) -> float:
    """Calls per CPU second of `callers` tasks each calling `call(i)` back to back for `seconds`
    of wall time. CPU time, not wall time: everything runs on this one thread, and the figure
    must not depend on what else the machine is running."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def caller(i: int) -> None:
        nonlocal done
        n = 0
        while time.perf_counter() < deadline:
            await call(i)
            n += 1
        done += n

    start = time.process_time()
    async with anyio.create_task_group() as tg:
        for i in range(callers):
            tg.start_soon(caller, i)
    return done / (time.process_time() - start)


async def bench_bare(partitions: int, callers: int, seconds: float) -> float:
    async def bare_actor(rx) -> None:  # noqa: ANN001
        async with rx:
            async for reply in rx:
                reply.set(None)

    streams = [mailbox(MAILBOX_SIZE) for _ in range(partitions)]

    async def round_trip(i: int) -> None:
        reply: Reply[None] = Reply()
        await streams[i % partitions][0].send(reply)
        await reply.wait()

    async with anyio.create_task_group() as tg:
        for _, rx in streams:
            tg.start_soon(bare_actor, rx)
        rate = await closed_loop(callers, seconds, round_trip)
        for tx, _ in streams:
            await tx.aclose()
    return rate


async def bench_partitions(
    partitions: int, callers: int, seconds: float, record_fence_events: bool
) -> float:
    store = DroppingLogStore()
    rows = await store.create_topic("bench", partitions, 1, 0.0)
    board = WatermarkBoard()
    actors = [
        PartitionActor(row, store, board, record_fence_events=record_fence_events) for row in rows
    ]
    async with anyio.create_task_group() as tg:
        for actor in actors:
            await tg.start(actor.run)
        for actor in actors:
            await actor.fence_probe(FENCE_EPOCH)  # the one slide: the window is [3, 3] after

        async def probe(i: int) -> None:
            await actors[i % partitions].fence_probe(FENCE_EPOCH)

        rate = await closed_loop(callers, seconds, probe)
        for actor in actors:
            assert actor.view().fence.window_slides == 1
            await actor.stop()
    return rate


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
            bare = await bench_bare(partitions, args.callers, args.seconds)
            fences = await bench_partitions(partitions, args.callers, args.seconds, True)
            quiet = await bench_partitions(partitions, args.callers, args.seconds, False)
            rounds.append((bare, fences, quiet))
        bare, fences, quiet = (median(r[i] for r in rounds) for i in range(3))
        ratio = median(f / b for b, f, _ in rounds)
        quiet_ratio = median(q / b for b, _, q in rounds)
        print(
            f"{partitions:>10} | {bare:>18,.0f} | {fences:>10,.0f} {ratio:>6.0%} | "
            f"{quiet:>19,.0f} {quiet_ratio:>6.0%}"
        )


# ------------------------------------------------------------------------------------ produce


@dataclass(frozen=True)
class ProduceFigures:
    seconds: float
    records: int
    payload_bytes: int
    objects: int
    object_bytes: int
    extents: int
    loop_cpu_s: float  # CPU time of the event-loop thread (worker threads excluded)

    @property
    def loop_ms_per_mb(self) -> float:
        return self.loop_cpu_s * 1e3 / (self.object_bytes / 1e6)

    @property
    def mean_object_bytes(self) -> int:
        return self.object_bytes // max(1, self.objects)


async def bench_node(
    object_store: ObjectStore, db_path: str, args: argparse.Namespace
) -> ProduceFigures:
    config = NodeConfig(
        epoch_bump_interval_s=None,
        batcher=BatcherConfig(),
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
    )
    rng = random.Random(1)
    records = [Record(None, rng.randbytes(args.value_bytes)) for _ in range(args.records)]
    call_bytes = args.records * args.value_bytes
    target = args.produce_mib * 1024 * 1024
    async with await SqliteLogStore.open(db_path) as log_store:
        node = Node(config, log_store, object_store, rng=rng)
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            await node.create_topic("bench", PRODUCE_PARTITIONS)
            sent = 0

            async def producer(i: int) -> None:
                nonlocal sent
                while sent < target:
                    sent += call_bytes
                    await node.produce("bench", i % PRODUCE_PARTITIONS, records)

            start, start_cpu = time.perf_counter(), time.thread_time()
            async with anyio.create_task_group() as producers:
                for i in range(args.producers):
                    producers.start_soon(producer, i)
            elapsed, loop_cpu = time.perf_counter() - start, time.thread_time() - start_cpu
            stats = node.batcher.stats
            figures = ProduceFigures(
                seconds=elapsed,
                records=stats.records_appended,
                payload_bytes=stats.records_appended * args.value_bytes,
                objects=stats.objects_uploaded,
                object_bytes=stats.bytes_uploaded,
                extents=stats.extents_appended,
                loop_cpu_s=loop_cpu,
            )
            assert stats.stale_rejections == 0
            await node.shutdown()
    return figures


async def bench_raw_puts(
    put: Callable[[str, bytes], Awaitable[object]], size: int, count: int, concurrency: int
) -> tuple[float, float]:
    """(bytes/s, event-loop CPU ms per MB) of `count` puts of `size` bytes, `concurrency` at a
    time."""
    rng = random.Random(2)
    data = rng.randbytes(size)
    keys = [
        format_l0_key(rng.randrange(1000), 1, new_uuid(rng.getrandbits(128))) for _ in range(count)
    ]
    next_key = 0

    async def worker() -> None:
        nonlocal next_key
        while next_key < count:
            key = keys[next_key]
            next_key += 1
            await put(key, data)

    start, start_cpu = time.perf_counter(), time.thread_time()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    elapsed, loop_cpu = time.perf_counter() - start, time.thread_time() - start_cpu
    return size * count / elapsed, loop_cpu * 1e3 / (size * count / 1e6)


@dataclass(frozen=True)
class ProduceRound:
    """A node run and, right after it, its raw run: they share the machine's mood."""

    node: ProduceFigures
    raw_bytes_s: float
    raw_loop_ms_per_mb: float

    @property
    def ratio(self) -> float:
        return self.node.object_bytes / self.node.seconds / self.raw_bytes_s


def print_produce_row(where: str, rounds: list[ProduceRound]) -> None:
    """Medians over the rounds; the ratio is the median of the rounds' own ratios (each listed
    last). Loop CPU per MB does not depend on the machine's load the way wall time does."""
    median = statistics.median
    node = sorted((r.node for r in rounds), key=lambda n: n.object_bytes / n.seconds)[
        len(rounds) // 2
    ]
    raw_mb_s = median(r.raw_bytes_s for r in rounds) / 1e6
    print(
        f"{where:>6} | {node.records / node.seconds:>10,.0f} "
        f"{node.payload_bytes / node.seconds / 1e6:>12.1f} "
        f"{node.object_bytes / node.seconds / 1e6:>11.1f} | "
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
        node = await bench_node(node_store(i), f"{db_prefix}-{i}.db", args)
        raw_bytes_s, raw_cpu = await bench_raw_puts(
            raw_put(i), node.mean_object_bytes, node.objects, BatcherConfig().uploads_max
        )
        rounds.append(ProduceRound(node, raw_bytes_s, raw_cpu))
        await between_rounds()
    return rounds


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto(log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_local_port()
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + MOTO_START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with no_proxy.open(f"{url}/moto-api/", timeout=1.0):
                return proc, url
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if proc.poll() is not None:
                raise RuntimeError(f"moto exited: {log_path.read_text()[-2000:]}") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"moto did not answer at {url}")


async def empty_bucket(store: S3ObjectStore) -> None:
    """moto keeps objects in memory: drop each round's before the next."""
    while True:
        page = await store.list_page("")
        if not page.objects:
            return
        await store.delete_many([o.key for o in page.objects])


async def run_produce(args: argparse.Namespace) -> None:
    uploads_max = BatcherConfig().uploads_max
    print(
        f"\nproduce: {args.producers} producers x {args.records} records x {args.value_bytes} B, "
        f"{PRODUCE_PARTITIONS} partitions, {args.produce_mib} MiB payload per round, "
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
        proc, url = start_moto(root / "moto.log")
        try:
            config = S3Config(
                bucket="levelzero-bench",
                endpoint_url=url,
                path_style=True,
                access_key=MOTO_ACCESS_KEY,
                secret_key=MOTO_ACCESS_KEY,
                create_bucket=True,
            )
            client_config = AioConfig(
                max_pool_connections=config.concurrency, s3={"addressing_style": "path"}
            )
            async with (
                S3ObjectStore(config) as s3,
                get_session().create_client(
                    "s3",
                    endpoint_url=url,
                    region_name=config.region,
                    aws_access_key_id=MOTO_ACCESS_KEY,
                    aws_secret_access_key=MOTO_ACCESS_KEY,
                    config=client_config,
                ) as client,
            ):

                async def raw_put(key: str, data: bytes) -> None:
                    await client.put_object(Bucket=config.bucket, Key=key, Body=data)

                rounds = await produce_rounds(
                    args, lambda i: s3, lambda i: raw_put, f"{tmp}/s3-log", lambda: empty_bucket(s3)
                )
            print_produce_row("s3", rounds)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


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
