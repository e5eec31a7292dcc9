"""Item 16: ListOffsets by time (`Node.offset_for_time`) vs one object GET, with an object store
as slow as S3 Express One Zone (3-7 ms a request).

A real `Node` over a SQLite log store and an in-memory object store behind `LatencyObjectStore`
(levelzero/testing/latency_store.py). One partition holds L1_OBJECTS reconciled objects and
then L0_EXTENTS extents still in L0, RECORDS_PER_EXTENT records each, their timestamps in no
order within an extent and overlapping across extents (seeded). A lookup of a random time walks
the L1 rows and the unreconciled placeholders and reads the one extent that holds the answer.

Floor: one ranged GET of a random extent through the same store, the least a lookup that
answers with a record's offset must do. Target: the median lookup <= 150% of the median GET
(the rest is the metastore and placeholders read from SQLite, and the extent decoded). A
lookup that scanned from the start offset (what ListOffsets by time did before) would read
every extent: L1_OBJECTS + L0_EXTENTS GETs.
"""

from __future__ import annotations

import random
import statistics
import time

import anyio

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import Node, NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.entries import Placeholder
from levelzero.core.l0format import Record
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.sqlite import SqliteLogStore
from levelzero.testing.latency_store import S3_EXPRESS, Latency, LatencyObjectStore

from .common import Figure, Settings, Target, figure, interleave, work_dir

ITEM = "lookup"
L1_OBJECTS = 100
L0_EXTENTS = 100
RECORDS_PER_EXTENT = 20
BASE_MS = 1_700_000_000_000
TARGET = Target(1.5, higher_is_better=False)
NO_LATENCY = Latency("none", put_ms=(0.0, 0.0), get_ms=(0.0, 0.0))


def node_config() -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False, object_age_max_s=0.0),
        housekeeper=HousekeeperConfig(enabled=False),
    )


async def fill(node: Node, rng: random.Random) -> int:
    """The partition's extents (reconciled one by one into L1 objects, then left in L0); the
    latest timestamp written."""
    await node.create_topic("lookup", 1)
    latest = 0
    for i in range(L1_OBJECTS + L0_EXTENTS):
        stamps = [BASE_MS + 1000 * i + rng.randrange(0, 30_000) for _ in range(RECORDS_PER_EXTENT)]
        latest = max(latest, *stamps)
        await node.produce("lookup", 0, [Record(None, b"%d" % t, t) for t in stamps])
        if i < L1_OBJECTS:
            assert await node.reconciler.run_round() == 1
    state = node.partition("lookup", 0).state
    assert state.lro == L1_OBJECTS * RECORDS_PER_EXTENT - 1, state.lro
    return latest


async def run(settings: Settings) -> list[Figure]:
    calls = settings.pick(40, 8)
    rounds = settings.pick(settings.rounds, 1)
    rng = random.Random(16)
    store = LatencyObjectStore(MemoryObjectStore(), NO_LATENCY, seed=16)
    with work_dir(settings, ITEM) as root:
        async with await SqliteLogStore.open(root / "log.db") as log_store:
            node = Node(node_config(), log_store, store, rng=random.Random(16))
            async with anyio.create_task_group() as tg:
                await tg.start(node.run)
                latest = await fill(node, rng)
                actor = node.partition("lookup", 0)
                extents = [
                    r.entry
                    for r in await log_store.read_placeholders(actor.row.pid, 0, L1_OBJECTS + L0_EXTENTS)
                    if isinstance(r.entry, Placeholder)
                ]
                store.latency = S3_EXPRESS
                answered = 0

                async def lookups(_: int) -> float:
                    nonlocal answered
                    taken = []
                    for _ in range(calls):
                        probe = rng.randrange(BASE_MS, latest + 1)
                        started = time.perf_counter()
                        offset, _stamp = await node.offset_for_time("lookup", 0, probe)
                        taken.append(time.perf_counter() - started)
                        answered += offset >= 0
                    return statistics.median(taken) * 1000

                async def gets(_: int) -> float:
                    taken = []
                    for _ in range(calls):
                        p = rng.choice(extents)  # any extent left in L0 or reconciled: its range
                        started = time.perf_counter()
                        await store.get(p.object_key, p.byte_offset, p.byte_length)
                        taken.append(time.perf_counter() - started)
                    return statistics.median(taken) * 1000

                pairs = await interleave(rounds, lookups, gets)
                await node.shutdown()
    assert answered == rounds * calls, answered  # every probe is at or before the latest record
    return [
        figure(
            ITEM,
            f"ListOffsets by time, {L1_OBJECTS} L1 objects + {L0_EXTENTS} L0 extents, "
            f"{S3_EXPRESS.name} (GET {S3_EXPRESS.get_ms[0]:g}-{S3_EXPRESS.get_ms[1]:g} ms), "
            "median vs one GET",
            "ms",
            pairs,
            target=TARGET,
            sut_label="lookup",
            floor_label="one GET",
            notes={"calls_per_round": calls, "records_per_extent": RECORDS_PER_EXTENT},
        )
    ]
