"""Item 5: L0 upload MB/s through the node beside raw aiobotocore PUTs of equal-sized objects.

- sut:   `PRODUCERS` tasks call `Node.produce` in a closed loop (`RECORDS` records of
         `VALUE_BYTES` each per call, `PARTITIONS` partitions) until `produce_mib` of payload is
         acknowledged; SQLite log store (synchronous FULL), the default batcher (linger 250 ms,
         4 MiB objects, 8 uploads at once, 64 MiB in flight), S3ObjectStore on a moto server;
         reconciler, housekeeper and GC off (they would compete for the same store); the
         garbage collector set as `levelzero run` sets it (thresholds, heap frozen);
- floor: as many objects of the node's mean object size, PUT through a bare aiobotocore client
         with the batcher's upload concurrency, against the same moto server.
The ratio compares bytes/s of uploaded objects (same objects, same server): what the node's
batching, fencing and placeholder commits cost on top of the PUTs. Target: >= 70%.
"Loop CPU ms/MB" (in the notes) is the event-loop thread's CPU time per MB uploaded.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.gc import GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.keys import format_l0_key, new_uuid
from levelzero.daemon.gc_tuning import tuned_gc
from levelzero.core.l0format import Record
from levelzero.storage.protocols import ObjectStore
from levelzero.storage.s3_store import S3ObjectStore
from levelzero.storage.sqlite import SqliteLogStore

from .common import (
    Figure,
    Settings,
    Target,
    figure,
    frozen_heap,
    interleave,
    moto_server,
    raw_s3_client,
    s3_config,
    timed_tasks,
    work_dir,
)

ITEM = "upload"
PARTITIONS = 16
PRODUCERS = 1024
RECORDS = 64
VALUE_BYTES = 1024
BUCKET = "levelzero-bench-upload"
TARGET = Target(0.70)


@dataclass(frozen=True, slots=True)
class ProduceFigures:
    seconds: float
    records: int
    payload_bytes: int
    objects: int
    object_bytes: int
    extents: int
    loop_cpu_s: float  # CPU time of the event-loop thread (worker threads excluded)

    @property
    def object_bytes_per_s(self) -> float:
        return self.object_bytes / self.seconds

    @property
    def loop_ms_per_mb(self) -> float:
        return self.loop_cpu_s * 1e3 / (self.object_bytes / 1e6)

    @property
    def mean_object_bytes(self) -> int:
        return self.object_bytes // max(1, self.objects)


async def produce_through_node(
    object_store: ObjectStore,
    db_path: Path,
    produce_mib: float,
    *,
    producers: int = PRODUCERS,
    records_per_call: int = RECORDS,
    value_bytes: int = VALUE_BYTES,
    partitions: int = PARTITIONS,
    batcher: BatcherConfig | None = None,
) -> ProduceFigures:
    """Closed-loop producers through a Node until `produce_mib` of payload is acknowledged."""
    config = NodeConfig(
        epoch_bump_interval_s=None,
        batcher=batcher or BatcherConfig(),
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
        gc=GcConfig(enabled=False),
    )
    rng = random.Random(1)
    records = [Record(None, rng.randbytes(value_bytes)) for _ in range(records_per_call)]
    call_bytes = records_per_call * value_bytes
    target = int(produce_mib * 1024 * 1024)
    async with await SqliteLogStore.open(db_path) as log_store:
        node = Node(config, log_store, object_store, rng=rng)
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            await node.create_topic("bench", partitions)
            sent = 0

            async def producer(i: int) -> None:
                nonlocal sent
                while sent < target:
                    sent += call_bytes
                    await node.produce("bench", i % partitions, records)

            elapsed, loop_cpu = await timed_tasks(producers, producer)
            stats = node.batcher.stats
            figures = ProduceFigures(
                seconds=elapsed,
                records=stats.records_appended,
                payload_bytes=stats.records_appended * value_bytes,
                objects=stats.objects_uploaded,
                object_bytes=stats.bytes_uploaded,
                extents=stats.extents_appended,
                loop_cpu_s=loop_cpu,
            )
            assert stats.stale_rejections == 0
            await node.shutdown()
    return figures


async def raw_puts(
    put: Callable[[str, bytes], Awaitable[object]], size: int, count: int, concurrency: int
) -> tuple[float, float]:
    """(bytes/s, event-loop CPU ms per MB) of `count` puts of `size` bytes, `concurrency` at a
    time, with L0-shaped keys."""
    rng = random.Random(2)
    data = rng.randbytes(size)
    keys = [format_l0_key(rng.randrange(1000), 1, new_uuid(rng.getrandbits(128))) for _ in range(count)]
    next_key = 0

    async def worker(_: int) -> None:
        nonlocal next_key
        while next_key < count:
            key = keys[next_key]
            next_key += 1
            await put(key, data)

    elapsed, loop_cpu = await timed_tasks(concurrency, worker)
    return size * count / elapsed, loop_cpu * 1e3 / (size * count / 1e6)


async def empty_bucket(store: ObjectStore) -> None:
    """moto keeps objects in memory: drop each round's before the next."""
    while True:
        page = await store.list_page("")
        if not page.objects:
            return
        await store.delete_many([o.key for o in page.objects])


async def run(settings: Settings) -> list[Figure]:
    # 512 MiB a round: about 2 s a side on a quiet host (128 MiB rounds were half a second,
    # where the first object's encoding and the last one's commit, a fixed few tens of ms a
    # round, and whatever else ran in that half second moved a round by 10-20 points).
    produce_mib = settings.pick(512, 4)
    rounds = settings.pick(settings.rounds, 1)
    uploads_max = BatcherConfig().uploads_max
    nodes: list[ProduceFigures] = []
    raw_cpu: list[float] = []
    with work_dir(settings, ITEM) as root:
        async with (
            moto_server(root) as url,
            S3ObjectStore(s3_config(url, BUCKET)) as s3,
            raw_s3_client(url) as client,
        ):

            async def raw_put(key: str, data: bytes) -> None:
                await client.put_object(Bucket=BUCKET, Key=key, Body=data)

            runs = itertools.count()

            async def sut(_round: int) -> float:
                node = await produce_through_node(s3, root / f"log-{next(runs)}.db", produce_mib)
                nodes.append(node)
                await empty_bucket(s3)
                return node.object_bytes_per_s / 1e6

            async def floor(_round: int) -> float:
                # Shaped like the node's objects: its last run's mean size and count (the SUT
                # runs first in round 0, and ABBA keeps the shape fresh).
                node = nodes[-1]
                rate, cpu = await raw_puts(raw_put, node.mean_object_bytes, node.objects, uploads_max)
                raw_cpu.append(cpu)
                await empty_bucket(s3)
                return rate / 1e6

            # The garbage collector as `levelzero run` sets it: its thresholds
            # (`daemon/gc_tuning.py`), and the heap frozen once the stores are open
            # (`freeze_heap`). The item's node ran with Python's defaults, which the daemon
            # does not: a full collection walked the S3 clients' service models about once a
            # round (~70 ms of a stopped event loop). The floor runs under the same settings.
            with tuned_gc(), frozen_heap():
                # One unmeasured pair first: moto's first large PUTs and the first SQLite
                # files of the run are slower than the rest, and would land in round 0 only.
                await interleave(1, sut, floor)
                nodes.clear()
                raw_cpu.clear()
                pairs = await interleave(rounds, sut, floor)
    middle = sorted(nodes, key=lambda n: n.object_bytes_per_s)[len(nodes) // 2]
    return [
        figure(
            ITEM,
            "L0 upload MB/s through the node vs raw aiobotocore PUTs (moto)",
            "MB/s",
            pairs,
            target=TARGET,
            sut_label="node",
            floor_label="raw PUT",
            notes={
                "producers": PRODUCERS,
                "records_per_call": RECORDS,
                "value_bytes": VALUE_BYTES,
                "partitions": PARTITIONS,
                "produce_mib_per_round": produce_mib,
                "uploads_at_once": uploads_max,
                "objects": middle.objects,
                "mean_object_mb": round(middle.mean_object_bytes / 1e6, 3),
                "extents_per_object": round(middle.extents / max(1, middle.objects), 1),
                "records_per_s": round(middle.records / middle.seconds),
                "loop_cpu_ms_per_mb_node": [round(n.loop_ms_per_mb, 2) for n in nodes],
                "loop_cpu_ms_per_mb_raw": [round(c, 2) for c in raw_cpu],
            },
        )
    ]
