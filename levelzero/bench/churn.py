"""Item 1: spurious rejections under epoch churn, windowed fencing vs strict.

A real `Node` (SQLite log store, synchronous FULL; local object store with fsync) with
`PRODUCERS` closed-loop producers over `PARTITIONS` partitions. The cluster epoch advances every
`BUMP_INTERVAL_S`, the node's epoch cache lives `CACHE_TTL_S`, and the batcher lingers
`LINGER_MS` or cuts at `BATCH_BYTES_MAX`, with up to 8 uploads at once: objects cut just before a
bump and just after it are in flight together. Uploads take 0-`UPLOAD_JITTER_MS` ms
(`FaultyObjectStore`, latency only), as S3 PUTs vary, so those objects land in either order,
which is exactly what the window is for (local uploads alone never overtake each other).

Per round, one node per mode, alternating which goes first. Figures:
- rejection rate = stale rejections / fences (every fence decision of every partition),
  windowed beside strict; the ratio says how much of strict's rejecting windowed still does;
- p50 / p99 produce latency (a produce call's wall time, its retries included).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.gc import GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.errors import LevelZeroError
from levelzero.core.fence import FenceMode
from levelzero.core.l0format import Record
from levelzero.testing.faulty_store import FaultSpec, FaultyObjectStore
from levelzero.storage.local_store import LocalObjectStore
from levelzero.storage.sqlite import SqliteLogStore

from .common import Figure, Settings, Target, figure, interleave, quantile, work_dir

ITEM = "churn"
PARTITIONS = 16
PRODUCERS = 128
RECORDS_PER_CALL = 10
VALUE_BYTES = 100
BUMP_INTERVAL_S = 0.3
CACHE_TTL_S = 0.1
LINGER_MS = 30.0
BATCH_BYTES_MAX = 32 * 1024  # several objects in flight at once, not one per linger
UPLOAD_JITTER_MS = 100.0  # object-store latency varies (S3: tens to hundreds of ms)
# Expectation (DESIGN.md, seed 000): windowed rejects (almost) nothing that strict rejects.
TARGET = Target(0.10, higher_is_better=False)


@dataclass(frozen=True, slots=True)
class ChurnRun:
    mode: str
    seconds: float
    produces: int
    failed_produces: int
    fences: int
    rejections: int
    retries: int
    epoch_bumps: int
    objects: int
    p50_ms: float
    p99_ms: float

    @property
    def rejection_rate(self) -> float:
        return self.rejections / max(1, self.fences)


def node_config(mode: FenceMode) -> NodeConfig:
    return NodeConfig(
        fencing_mode=mode,
        epoch_cache_ttl_s=CACHE_TTL_S,
        epoch_bump_interval_s=BUMP_INTERVAL_S,
        batcher=BatcherConfig(linger_ms=LINGER_MS, batch_bytes_max=BATCH_BYTES_MAX),
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
        gc=GcConfig(enabled=False),
    )


async def churn_run(mode: FenceMode, seconds: float, root: Path, seed: int) -> ChurnRun:
    rng = random.Random(seed)
    records = [Record(None, rng.randbytes(VALUE_BYTES)) for _ in range(RECORDS_PER_CALL)]
    latencies: list[float] = []
    failed = 0
    async with await SqliteLogStore.open(root / f"{mode}-{seed}.db") as log_store:
        objects = FaultyObjectStore(
            LocalObjectStore(root / f"{mode}-{seed}-objects"),
            FaultSpec(latency_ms=UPLOAD_JITTER_MS, seed=seed),
        )
        node = Node(node_config(mode), log_store, objects, rng=rng)
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            await node.create_topic("churn", PARTITIONS)
            bumps_before = node.epochs.advances
            deadline = time.perf_counter() + seconds

            async def producer(i: int) -> None:
                nonlocal failed
                while time.perf_counter() < deadline:
                    started = time.perf_counter()
                    try:
                        await node.produce("churn", i % PARTITIONS, records)
                    except LevelZeroError:
                        failed += 1
                        continue
                    latencies.append(time.perf_counter() - started)

            async with anyio.create_task_group() as producers:
                for i in range(PRODUCERS):
                    producers.start_soon(producer, i)
            views = node.views()
            stats = node.batcher.stats
            run = ChurnRun(
                mode=str(mode),
                seconds=seconds,
                produces=len(latencies),
                failed_produces=failed,
                fences=sum(
                    v.fence.new_epoch_fences + v.fence.same_epoch_fences + v.fence.stale_rejections
                    for v in views
                ),
                rejections=sum(v.fence.stale_rejections for v in views),
                retries=stats.stale_retries,
                epoch_bumps=node.epochs.advances - bumps_before,
                objects=stats.objects_uploaded,
                p50_ms=quantile(latencies, 0.5) * 1e3 if latencies else 0.0,
                p99_ms=quantile(latencies, 0.99) * 1e3 if latencies else 0.0,
            )
            await node.shutdown()
    assert run.rejections == stats.stale_rejections, (run, stats)
    return run


async def run(settings: Settings) -> list[Figure]:
    seconds = settings.pick(max(4.0, settings.seconds), 1.5)
    rounds = settings.pick(min(settings.rounds, 3), 1)
    with work_dir(settings, ITEM) as root:
        pairs = await interleave(
            rounds,
            lambda i: churn_run(FenceMode.WINDOWED, seconds, root, i),
            lambda i: churn_run(FenceMode.STRICT, seconds, root, i),
        )

    def totals(index: int) -> dict[str, int]:
        runs = [p[index] for p in pairs]
        return {
            name: sum(getattr(r, name) for r in runs)
            for name in (
                "produces",
                "failed_produces",
                "fences",
                "rejections",
                "retries",
                "epoch_bumps",
                "objects",
            )
        }

    notes = {
        "partitions": PARTITIONS,
        "producers": PRODUCERS,
        "records_per_call": RECORDS_PER_CALL,
        "value_bytes": VALUE_BYTES,
        "bump_interval_s": BUMP_INTERVAL_S,
        "cache_ttl_s": CACHE_TTL_S,
        "linger_ms": LINGER_MS,
        "seconds_per_run": seconds,
        "windowed": totals(0),
        "strict": totals(1),
    }
    return [
        figure(
            ITEM,
            "stale rejections per fence, windowed vs strict (epoch bump every 300 ms)",
            "rejections/fence",
            [(w.rejection_rate, s.rejection_rate) for w, s in pairs],
            target=TARGET,
            sut_label="windowed",
            floor_label="strict",
            notes=notes,
        ),
        figure(
            ITEM,
            "p50 produce latency, windowed vs strict",
            "ms",
            [(w.p50_ms, s.p50_ms) for w, s in pairs],
            sut_label="windowed",
            floor_label="strict",
        ),
        figure(
            ITEM,
            "p99 produce latency, windowed vs strict",
            "ms",
            [(w.p99_ms, s.p99_ms) for w, s in pairs],
            sut_label="windowed",
            floor_label="strict",
        ),
    ]
