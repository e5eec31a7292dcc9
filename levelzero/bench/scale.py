"""Item 8: how the cost of fencing and producing grows with the number of partitions.

Fences: fence probes/s beside bare actor round trips/s (as item 3) at 1, 64 and 1024 partitions,
`FENCE_CALLERS` callers spread over them (per CPU second).

Produce: `PRODUCERS` closed-loop producers (`RECORDS_PER_CALL` records of `VALUE_BYTES`) spread
over 1, 64, 1,024 or 10,000 partitions of a real Node (SQLite log store, synchronous FULL; local
object store with fsync), linger `LINGER_MS` so the node, not the linger, sets the pace;
acknowledged records/s for `seconds`. Spread evenly, producer i writes to partitions i,
i + PRODUCERS, i + 2 PRODUCERS, ... in turn, so every partition takes writes; skewed, 1% of the
partitions take 90% of the writes (each call picks hot or cold at random). An object holds an
extent per partition it carries, and each extent is one fence and one placeholder: the figures
show what that fan-out costs. Each one's floor is the same run at 1 partition, measured next
to it (before it in even rounds, after it in odd ones);
targets: >= 60% at 1,024 partitions, >= 40% at 10,000, and fences at 1,024 partitions >= 60% of
the bare round trip (issue 24). A fence no longer takes an actor round trip at all (a write is
handled on its sender's task), so it can beat that floor. The notes give the event
loop's CPU µs per record and the extents per object.
"""

from __future__ import annotations

import gc
import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.gc import GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import PARTITIONS_PER_TOPIC_MAX, Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.l0format import Record
from levelzero.daemon.gc_tuning import tuned_gc
from levelzero.storage.local_store import LocalObjectStore
from levelzero.storage.sqlite import SqliteLogStore

from .common import Figure, Settings, Target, figure, timed_tasks, work_dir
from .fence import bare_round_trips, fenced_writes
from . import scale_idle

ITEM = "scale"
PARTITION_COUNTS = (1, 64, 1024)  # fences, and produce spread evenly
PRODUCE_COUNTS = (1, 64, 1024, 10_000)
SKEWED_PARTITIONS = 10_000
SKEW_HOT_SHARE = 0.01  # of the partitions, which take
SKEW_HOT_WRITES = 0.90  # of the writes
PRODUCE_TARGETS = {1024: Target(0.60), 10_000: Target(0.40)}
FENCE_TARGETS = {1024: Target(0.60)}  # of the bare actor round trip at the same count
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
    skewed: bool = False


def _partition_picker(i: int, partitions: int, skewed: bool) -> Callable[[], int]:
    """Producer i's next partition: evenly (i, i + PRODUCERS, ... in turn) or skewed."""
    if skewed:
        rng = random.Random(i)
        hot = max(1, int(partitions * SKEW_HOT_SHARE))

        def pick_skewed() -> int:
            if rng.random() < SKEW_HOT_WRITES:
                return rng.randrange(hot)
            return rng.randrange(hot, partitions)

        return pick_skewed
    step = itertools.count(i, PRODUCERS)
    return lambda: next(step) % partitions


async def produce_for(
    seconds: float, partitions: int, root: Path, tag: str, *, skewed: bool = False
) -> ProduceRun:
    config = NodeConfig(
        epoch_bump_interval_s=None,
        batcher=BatcherConfig(linger_ms=LINGER_MS),
        reconciler=ReconcilerConfig(enabled=False),
        housekeeper=HousekeeperConfig(enabled=False),
        gc=GcConfig(enabled=False),
    )
    rng = random.Random(3)
    records = [Record(None, rng.randbytes(VALUE_BYTES)) for _ in range(RECORDS_PER_CALL)]
    # Each run starts from a collected heap. A finished run's node (10,000 partitions: some
    # 150,000 objects) is cyclic garbage that only a full collection frees, and the daemon's
    # thresholds make those rare: left there, it slowed every later run of the process (1,024
    # partitions measured 1.46 -> 1.90 µs of loop per record over eight runs; 1.31-1.61,
    # without a trend, collected between runs). A daemon builds its node once.
    gc.collect()
    with tuned_gc():  # the garbage collector as `levelzero run` sets it (daemon/gc_tuning.py)
        async with await SqliteLogStore.open(root / f"{tag}.db") as log_store:
            node = Node(config, log_store, LocalObjectStore(root / f"{tag}-objects"), rng=rng)
            async with anyio.create_task_group() as tg:
                await tg.start(node.run)
                # A topic holds at most PARTITIONS_PER_TOPIC_MAX: 10,000 partitions are 3 topics.
                topics = [f"scale-{t}" for t in range(-(-partitions // PARTITIONS_PER_TOPIC_MAX))]
                for t, topic in enumerate(topics):
                    first = t * PARTITIONS_PER_TOPIC_MAX
                    await node.create_topic(topic, min(PARTITIONS_PER_TOPIC_MAX, partitions - first))
                deadline = time.perf_counter() + seconds
                acked = 0

                async def producer(i: int) -> None:
                    nonlocal acked
                    pick = _partition_picker(i, partitions, skewed)
                    while time.perf_counter() < deadline:
                        g = pick()
                        await node.produce(
                            topics[g // PARTITIONS_PER_TOPIC_MAX], g % PARTITIONS_PER_TOPIC_MAX, records
                        )
                        acked += RECORDS_PER_CALL

                elapsed, loop_cpu = await timed_tasks(PRODUCERS, producer)
                stats = node.batcher.stats
                await node.shutdown()
    return ProduceRun(
        partitions=partitions,
        records_per_s=acked / elapsed,
        loop_us_per_record=loop_cpu * 1e6 / max(1, acked),
        extents_per_object=stats.extents_appended / max(1, stats.objects_uploaded),
        skewed=skewed,
    )


async def run(settings: Settings) -> list[Figure]:
    rounds = settings.pick(min(settings.rounds, 3), 1)
    fence_seconds = settings.pick(settings.seconds, 0.2)
    produce_seconds = settings.pick(max(2.0, settings.seconds), 0.5)
    counts = PARTITION_COUNTS
    fences: dict[int, list[tuple[float, float]]] = {p: [] for p in counts}
    # Each produce figure: (run, its own 1-partition floor measured next to it) per round.
    suts: list[tuple[int, bool]] = [(p, False) for p in PRODUCE_COUNTS[1:]]
    suts.append((SKEWED_PARTITIONS, True))
    produce: dict[tuple[int, bool], list[tuple[ProduceRun, ProduceRun]]] = {s: [] for s in suts}
    with work_dir(settings, ITEM) as root:
        for r in range(rounds):
            # Rotate the order of partition counts (and SUT/floor) so drift hits all alike.
            order = counts[r % len(counts) :] + counts[: r % len(counts)]
            for p in order:
                if r % 2 == 0:
                    sut = await fenced_writes(p, FENCE_CALLERS, fence_seconds)
                    bare = await bare_round_trips(p, FENCE_CALLERS, fence_seconds)
                else:
                    bare = await bare_round_trips(p, FENCE_CALLERS, fence_seconds)
                    sut = await fenced_writes(p, FENCE_CALLERS, fence_seconds)
                fences[p].append((sut, bare))
            # Each run next to its own floor, floor first in even rounds and second in odd
            # ones: this machine's speed drifts by a fifth within a minute, and one floor per
            # round, seconds away from the later runs, made the ratios swing with it.
            for p, skew in suts[r % len(suts) :] + suts[: r % len(suts)]:
                tag = f"{'s' if skew else 'p'}{p}-r{r}"
                if r % 2 == 0:
                    floor_run = await produce_for(produce_seconds, 1, root, f"{tag}-floor")
                sut_run = await produce_for(produce_seconds, p, root, tag, skewed=skew)
                if r % 2 == 1:
                    floor_run = await produce_for(produce_seconds, 1, root, f"{tag}-floor")
                produce[(p, skew)].append((sut_run, floor_run))
    figures = [
        figure(
            ITEM,
            f"fences/s vs bare actor round trips/s, {p} partitions",
            "ops/CPU-s",
            fences[p],
            target=FENCE_TARGETS.get(p),
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
    for (p, skew), pairs in produce.items():
        label = f"{p:,} partitions, 1% taking 90%" if skew else f"{p:,} partitions"
        figures.append(
            figure(
                ITEM,
                f"produce records/s at {label} vs at {base} (node, SQLite, local store)",
                "records/s",
                [(sut.records_per_s, floor.records_per_s) for sut, floor in pairs],
                target=None if skew else PRODUCE_TARGETS.get(p),
                sut_label=f"{p}p",
                floor_label=f"{base}p",
                notes={
                    "producers": PRODUCERS,
                    "records_per_call": RECORDS_PER_CALL,
                    "value_bytes": VALUE_BYTES,
                    "linger_ms": LINGER_MS,
                    "seconds": produce_seconds,
                    "loop_us_per_record": {
                        "floor": [round(floor.loop_us_per_record, 1) for _, floor in pairs],
                        "sut": [round(sut.loop_us_per_record, 1) for sut, _ in pairs],
                    },
                    "extents_per_object": {
                        "floor": [round(floor.extents_per_object, 1) for _, floor in pairs],
                        "sut": [round(sut.extents_per_object, 1) for sut, _ in pairs],
                    },
                },
            )
        )
    figures.extend(await scale_idle.run(settings))
    return figures
