"""GC delete throughput and eligible->deleted lag against moto's S3 server.

    python bench/bench_gc.py [--objects 20000] [--lag-steps 8] [--memory-objects 200000]

Figures (all in one run, same moto server, same keys, tiny bodies):
- memory:        one GC round over `--memory-objects` eligible objects in the memory store —
                 the actor's own cost (scan, batching, bookkeeping) without a network;
- gc round:      one `GcActor.run_round()` over `--objects` eligible objects spread over the
                 1000 prefixes like the batcher spreads them (listing + deleting, pipelined);
- gc dry run:    the same listing without deletes (what listing alone costs on this server);
- raw delete:    aiobotocore DeleteObjects of the same keys (re-created), 1000 a request,
                 4 in flight, keys known up front — the floor no GC can beat;
- raw list+del:  the least a lister can do: list the root page by page and delete each page
                 as one request (4 in flight), same keys re-created.
The ratio gc / raw is reported against both baselines. The target is >= 80% of raw.

Lag: the GC loop runs with interval_s 0.5 and 1.0; at a random moment M(p) is raised so that
20 objects become eligible; the time until each is deleted is recorded (median, p90, max),
once with idle_backoff_max_s = interval_s and once with 8 x interval_s.

Object creation uses unsigned HTTP PUTs (moto accepts them), which is ~2x faster than
signing them with botocore; it is not part of any figure.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import anyio
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from levelzero.actors.gc import GcActor, GcConfig  # noqa: E402
from levelzero.actors.partition import WatermarkBoard  # noqa: E402
from levelzero.core.keys import L0_ROOT, PREFIX_COUNT, format_l0_key, new_uuid  # noqa: E402
from levelzero.storage.memory_log import MemoryLogStore  # noqa: E402
from levelzero.storage.memory_store import MemoryObjectStore  # noqa: E402
from levelzero.storage.protocols import DeleteResult, ObjectStore  # noqa: E402
from levelzero.storage.s3_store import S3Config, S3ObjectStore  # noqa: E402

BUCKET = "levelzero-bench-gc"
ACCESS_KEY, SECRET_KEY = "bench", "bench-secret"
PUT_CONCURRENCY = 16
RAW_DELETES_IN_FLIGHT = 4
LAG_OBJECTS_PER_STEP = 20
MOTO_START_TIMEOUT_S = 30.0


# ------------------------------------------------------------------------------ setup


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def start_moto(log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    async with aiohttp.ClientSession() as session:
        with anyio.fail_after(MOTO_START_TIMEOUT_S):
            while True:
                try:
                    async with session.get(f"{url}/moto-api/"):
                        return proc, url
                except aiohttp.ClientError:
                    await anyio.sleep(0.05)


def s3_config(url: str) -> S3Config:
    return S3Config(
        bucket=BUCKET,
        endpoint_url=url,
        path_style=True,
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        create_bucket=True,
    )


def make_keys(count: int, rng: random.Random, epochs: Sequence[int] = (1, 2, 3)) -> list[str]:
    return [
        format_l0_key(rng.randrange(PREFIX_COUNT), rng.choice(epochs), new_uuid(rng.getrandbits(128)))
        for _ in range(count)
    ]


async def create_objects(url: str, keys: Sequence[str]) -> float:
    """Unsigned PUTs (moto accepts them), bounded concurrency. Returns seconds taken."""
    pending = iter(keys)
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            for key in pending:
                async with session.put(f"{url}/{BUCKET}/{key}", data=b"x") as response:
                    if response.status != 200:
                        raise RuntimeError(f"PUT {key}: HTTP {response.status}")

        async with anyio.create_task_group() as tg:
            for _ in range(PUT_CONCURRENCY):
                tg.start_soon(worker)
    return time.perf_counter() - started


def make_gc(store: ObjectStore, board: WatermarkBoard, **config: object) -> GcActor:
    settings: dict[str, object] = {"grace_s": 0.0}
    settings.update(config)
    return GcActor(
        GcConfig(**settings),  # type: ignore[arg-type]
        store,
        MemoryLogStore(),
        cluster_epoch=lambda: 10**9,
        board=board,
        views=list,
        clock=time.time,
        rng=random.Random(1),
    )


def board_at(mp: int) -> WatermarkBoard:
    board = WatermarkBoard()
    board.register("bench/0")
    board.publish("bench/0", mp)
    return board


# ------------------------------------------------------------------------------ throughput


async def bench_memory(count: int) -> float:
    store = MemoryObjectStore()
    for key in make_keys(count, random.Random(3)):
        await store.put(key, b"x")
    gc = make_gc(store, board_at(3))
    started = time.perf_counter()
    report = await gc.run_round()
    elapsed = time.perf_counter() - started
    assert report.deleted == count and not store.keys(), report
    return count / elapsed


async def raw_delete(client, keys: Sequence[str]) -> float:  # noqa: ANN001
    batches = [keys[i : i + 1000] for i in range(0, len(keys), 1000)]
    limit = anyio.Semaphore(RAW_DELETES_IN_FLIGHT)

    async def one(batch: Sequence[str]) -> None:
        async with limit:
            response = await client.delete_objects(
                Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            assert not response.get("Errors"), response["Errors"][:3]

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for batch in batches:
            tg.start_soon(one, batch)
    return time.perf_counter() - started


async def raw_list_and_delete(client) -> tuple[float, int]:  # noqa: ANN001
    limit = anyio.Semaphore(RAW_DELETES_IN_FLIGHT)
    deleted = 0

    async def one(batch: list[str]) -> None:
        nonlocal deleted
        try:
            response = await client.delete_objects(
                Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
            assert not response.get("Errors"), response["Errors"][:3]
            deleted += len(batch)
        finally:
            limit.release()

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        request = {"Bucket": BUCKET, "Prefix": L0_ROOT, "MaxKeys": 1000}
        while True:
            page = await client.list_objects_v2(**request)
            keys = [item["Key"] for item in page.get("Contents", [])]
            if keys:
                await limit.acquire()
                tg.start_soon(one, keys)
            if not page.get("IsTruncated"):
                break
            request["StartAfter"] = keys[-1]
    return time.perf_counter() - started, deleted


async def bench_throughput(url: str, count: int) -> None:
    rng = random.Random(7)
    keys = make_keys(count, rng)
    session = get_session()
    config = AioConfig(region_name="us-east-1", s3={"addressing_style": "path"}, max_pool_connections=64)
    async with S3ObjectStore(s3_config(url)) as store, session.create_client(
        "s3", endpoint_url=url, aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, config=config
    ) as client:
        put_s = await create_objects(url, keys)
        print(f"created {count} objects in {put_s:.1f} s ({count / put_s:.0f}/s, not measured below)")

        gc = make_gc(store, board_at(3))
        started = time.perf_counter()
        dry = await gc.run_round(dry_run=True)
        dry_s = time.perf_counter() - started
        assert dry.eligible == count, dry

        started = time.perf_counter()
        report = await gc.run_round()
        gc_s = time.perf_counter() - started
        assert report.deleted == count and report.errors == 0, report

        await create_objects(url, keys)
        raw_s = await raw_delete(client, keys)

        await create_objects(url, keys)
        raw_list_s, raw_listed = await raw_list_and_delete(client)
        assert raw_listed == count, raw_listed

    gc_rate, raw_rate, raw_list_rate = count / gc_s, count / raw_s, count / raw_list_s
    print()
    print(f"{'what':<34}{'seconds':>9}{'objects/s':>12}{'requests':>22}")
    print(f"{'gc dry run (listing only)':<34}{dry_s:>9.2f}{count / dry_s:>12.0f}{dry.list_requests:>13} list")
    print(
        f"{'gc round (list + delete)':<34}{gc_s:>9.2f}{gc_rate:>12.0f}"
        f"{report.list_requests:>13} list {report.delete_requests:>3} del"
    )
    print(f"{'raw DeleteObjects (keys known)':<34}{raw_s:>9.2f}{raw_rate:>12.0f}{-(-count // 1000):>22} del")
    print(f"{'raw list pages + DeleteObjects':<34}{raw_list_s:>9.2f}{raw_list_rate:>12.0f}")
    print()
    print(f"gc / raw DeleteObjects:            {gc_rate / raw_rate:6.1%}")
    print(f"gc / raw list + DeleteObjects:     {gc_rate / raw_list_rate:6.1%}")
    overlap_s = max(gc_s - dry_s, 0.0)
    print(
        f"gc round minus its listing time:   {overlap_s:.2f} s "
        f"(the deletes overlap the listing; listing is {dry_s / gc_s:.0%} of the round)"
    )


# ------------------------------------------------------------------------------ lag


class TimedStore:
    """Delegates to an object store and stamps when each key's delete returned."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.deleted_at: dict[str, float] = {}
        self.waiting: set[str] = set()
        self.all_deleted = anyio.Event()

    async def put(self, key: str, data: bytes) -> None:
        await self.inner.put(key, data)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return await self.inner.get(key, offset, length)

    async def head(self, key: str):  # noqa: ANN201
        return await self.inner.head(key)

    async def list_page(self, prefix: str, start_after: str | None = None, limit: int = 1000):  # noqa: ANN201
        return await self.inner.list_page(prefix, start_after, limit)

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        result = await self.inner.delete_many(keys)
        now = time.perf_counter()
        for key in result.deleted:
            self.deleted_at[key] = now
            self.waiting.discard(key)
        if not self.waiting:
            self.all_deleted.set()
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


async def bench_lag(url: str, interval_s: float, backoff_factor: int, steps: int) -> list[float]:
    rng = random.Random(int(interval_s * 100) + backoff_factor)
    lags: list[float] = []
    async with S3ObjectStore(s3_config(url)) as inner:
        store = TimedStore(inner)
        board = board_at(0)
        gc = make_gc(
            store, board, interval_s=interval_s, idle_backoff_max_s=interval_s * backoff_factor
        )
        async with anyio.create_task_group() as tg:
            await tg.start(gc.run)
            for step in range(1, steps + 1):
                keys = make_keys(LAG_OBJECTS_PER_STEP, rng, epochs=(step,))
                await create_objects(url, keys)  # epoch `step` > M = step - 1: kept for now
                store.waiting = set(keys)
                store.all_deleted = anyio.Event()
                # A random phase against the loop (longer gaps let an idle GC back off).
                await anyio.sleep(rng.uniform(0, interval_s * backoff_factor))
                eligible_at = time.perf_counter()
                board.publish("bench/0", step)  # now they are eligible
                with anyio.fail_after(60 + interval_s * backoff_factor * 4):
                    await store.all_deleted.wait()
                lags.extend(store.deleted_at[key] - eligible_at for key in keys)
            tg.cancel_scope.cancel()
    return lags


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--memory-objects", type=int, default=200_000)
    parser.add_argument("--lag-steps", type=int, default=8)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-lag", action="store_true")
    args = parser.parse_args()

    print(f"memory store: one GC round over {args.memory_objects} eligible objects: "
          f"{await bench_memory(args.memory_objects):,.0f} objects/s")
    log_path = Path(tempfile.mkdtemp(prefix="bench-gc-")) / "moto.log"
    proc, url = await start_moto(log_path)
    try:
        async with S3ObjectStore(s3_config(url)):
            pass  # creates the bucket
        if not args.skip_throughput:
            print(f"\nmoto at {url}: {args.objects} eligible objects over {PREFIX_COUNT} prefixes")
            await bench_throughput(url, args.objects)
        if not args.skip_lag:
            print(f"\neligible -> deleted lag ({LAG_OBJECTS_PER_STEP} objects x {args.lag_steps} steps each)")
            print(f"{'interval_s':>10}{'idle_backoff_max_s':>20}{'median s':>10}{'p90 s':>8}{'max s':>8}")
            for interval_s in (0.5, 1.0):
                for factor in (1, 8):
                    lags = await bench_lag(url, interval_s, factor, args.lag_steps)
                    print(
                        f"{interval_s:>10}{interval_s * factor:>20}{statistics.median(lags):>10.2f}"
                        f"{quantile(lags, 0.9):>8.2f}{max(lags):>8.2f}"
                    )
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if os.environ.get("BENCH_KEEP_LOG") is None:
            log_path.unlink(missing_ok=True)


if __name__ == "__main__":
    anyio.run(main)
