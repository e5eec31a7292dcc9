"""Item 8: how the cost of fencing and producing grows with the number of partitions.

Fences: fence probes/s beside bare actor round trips/s (as item 3) at 1, 64 and 1024 partitions,
`FENCE_CALLERS` callers spread over them (per CPU second).

Produce: `PRODUCERS` closed-loop producers (`RECORDS_PER_CALL` records of `VALUE_BYTES`) spread
over 1, 64 or 1024 partitions of a real Node (SQLite log store, synchronous FULL; local object
store with fsync), linger `LINGER_MS` so the node, not the linger, sets the pace; acknowledged
records/s for `seconds`. An object holds an extent per partition it carries, and each extent is
one fence and one placeholder: the figure shows what that fan-out costs. Its floor is the same
run at 1 partition (in the same round), and the notes give the event loop's CPU µs per record.
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
from levelzero.core.l0format import Record
from levelzero.storage.local_store import LocalObjectStore
from levelzero.storage.sqlite import SqliteLogStore

from .common import Figure, Settings, figure, work_dir
from .fence import bare_round_trips, fence_probes
from . import scale_idle

ITEM = "scale"
PARTITION_COUNTS = (1, 64, 1024)
FENCE_CALLERS = 1024
PRODUCERS = 1024
RECORDS_PER_CALL = 16
VALUE_BYTES = 100
LINGER_MS = 5.0


@dataclass(frozen=True, slots=True)
class ProduceRun:
    partitions: int
    records_per_s: float
    loop_us_per_record: float
    extents_per_object: float


async def produce_for(seconds: float, partitions: int, root: Path, tag: str) -> ProduceRun:
    config = NodeConfig(
        epoch_bump_interval_s=None,
        batcher=BatcherConfig(linger_ms=LINGER_MS),
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
        gc=GcConfig(enabled=False),
    )
    rng = random.Random(3)
    records = [Record(None, rng.randbytes(VALUE_BYTES)) for _ in range(RECORDS_PER_CALL)]
    async with await SqliteLogStore.open(root / f"{tag}.db") as log_store:
        node = Node(config, log_store, LocalObjectStore(root / f"{tag}-objects"), rng=rng)
        async with anyio.create_task_group() as tg:
            await tg.start(node.run)
            await node.create_topic("scale", partitions)
            deadline = time.perf_counter() + seconds
            acked = 0

            async def producer(i: int) -> None:
                nonlocal acked
                while time.perf_counter() < deadline:
                    await node.produce("scale", i % partitions, records)
                    acked += RECORDS_PER_CALL

            start, start_cpu = time.perf_counter(), time.thread_time()
            async with anyio.create_task_group() as producers:
                for i in range(PRODUCERS):
                    producers.start_soon(producer, i)
            elapsed, loop_cpu = time.perf_counter() - start, time.thread_time() - start_cpu
            stats = node.batcher.stats
            await node.shutdown()
    return ProduceRun(
        partitions=partitions,
        records_per_s=acked / elapsed,
        loop_us_per_record=loop_cpu * 1e6 / max(1, acked),
        extents_per_object=stats.extents_appended / max(1, stats.objects_uploaded),
    )


async def run(settings: Settings) -> list[Figure]:
    rounds = settings.pick(min(settings.rounds, 3), 1)
    fence_seconds = settings.pick(settings.seconds, 0.2)
    produce_seconds = settings.pick(max(2.0, settings.seconds), 0.5)
    counts = PARTITION_COUNTS
    fences: dict[int, list[tuple[float, float]]] = {p: [] for p in counts}
    produce: dict[int, list[ProduceRun]] = {p: [] for p in counts}
    with work_dir(settings, ITEM) as root:
        for r in range(rounds):
            # Rotate the order of partition counts (and SUT/floor) so drift hits all alike.
            order = counts[r % len(counts) :] + counts[: r % len(counts)]
            for p in order:
                if r % 2 == 0:
                    sut = await fence_probes(p, FENCE_CALLERS, fence_seconds)
                    bare = await bare_round_trips(p, FENCE_CALLERS, fence_seconds)
                else:
                    bare = await bare_round_trips(p, FENCE_CALLERS, fence_seconds)
                    sut = await fence_probes(p, FENCE_CALLERS, fence_seconds)
                fences[p].append((sut, bare))
            for p in order:
                produce[p].append(await produce_for(produce_seconds, p, root, f"p{p}-r{r}"))
    figures = [
        figure(
            ITEM,
            f"fences/s vs bare actor round trips/s, {p} partitions",
            "ops/CPU-s",
            fences[p],
            sut_label="fences",
            floor_label="bare",
            notes={"callers": FENCE_CALLERS, "seconds": fence_seconds},
        )
        for p in counts
    ]
    base = counts[0]
    for p in counts[1:]:
        figures.append(
            figure(
                ITEM,
                f"fences/s at {p} partitions vs at {base}",
                "ops/CPU-s",
                [(fences[p][r][0], fences[base][r][0]) for r in range(rounds)],
                sut_label=f"{p}p",
                floor_label=f"{base}p",
            )
        )
    for p in counts[1:]:
        figures.append(
            figure(
                ITEM,
                f"produce records/s at {p} partitions vs at {base} (node, SQLite, local store)",
                "records/s",
                [
                    (produce[p][r].records_per_s, produce[base][r].records_per_s)
                    for r in range(rounds)
                ],
                sut_label=f"{p}p",
                floor_label=f"{base}p",
                notes={
                    "producers": PRODUCERS,
                    "records_per_call": RECORDS_PER_CALL,
                    "value_bytes": VALUE_BYTES,
                    "linger_ms": LINGER_MS,
                    "seconds": produce_seconds,
                    "loop_us_per_record": {
                        q: [round(x.loop_us_per_record, 1) for x in produce[q]] for q in (base, p)
                    },
                    "extents_per_object": {
                        q: [round(x.extents_per_object, 1) for x in produce[q]] for q in (base, p)
                    },
                },
            )
        )
    figures.extend(await scale_idle.run(settings))
    return figures
