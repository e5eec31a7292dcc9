"""Item 16: compaction throughput vs the raw read + write of the same L1 bytes.

Each round writes a compacted partition whose keys are 1% of its records (a changelog with many
updates per key), reconciles it into L1 objects on a local-directory object store, then times
the compactor's pass over them (read, key map, keep the latest per key, write the new object,
the control plane's commit, the superseded objects' deletes). The floor reads the same L1
objects and writes their bytes back to new keys (no decoding, no key map): what any rewrite of
that data costs on the same store. Both in MB/s of L1 bytes read; the target is >= 50%. The
space after compaction (new bytes over old) is a note.
"""

from __future__ import annotations

import time
from pathlib import Path

from levelzero.actors.batcher import BatcherConfig
from levelzero.actors.compactor import CompactorConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.node import NodeConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.core.keys import L1_ROOT
from levelzero.core.l0format import Record
from levelzero.storage.local_store import LocalObjectStore
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.testing.nodes import running_node

from .common import Figure, Settings, Target, figure, interleave, work_dir

ITEM = "compaction"
TARGET = Target(0.5)
VALUE_BYTES = 100
RECORDS_PER_PRODUCE = 1000
DISTINCT_KEYS_PERCENT = 1


def _config() -> NodeConfig:
    return NodeConfig(
        epoch_bump_interval_s=None,
        epoch_cache_ttl_s=0.0,
        batcher=BatcherConfig(linger_ms=1),
        reconciler=ReconcilerConfig(enabled=False, object_bytes_min=0, object_age_max_s=0.0),
        housekeeper=HousekeeperConfig(enabled=False),
        compactor=CompactorConfig(enabled=False),
    )


async def _l1_bytes(store: LocalObjectStore) -> int:
    total = 0
    for key in [o.key async for o in _listed(store)]:
        total += len(await store.get(key))
    return total


async def _listed(store: LocalObjectStore):  # noqa: ANN202 - an async iterator of listed objects
    from levelzero.storage.protocols import iter_objects

    async for obj in iter_objects(store, L1_ROOT):
        yield obj


async def _round(directory: Path, records: int, compact: bool) -> tuple[float, float]:
    """(MB/s of L1 bytes read, bytes after over bytes before) of one pass, or of the floor."""
    objects = LocalObjectStore(directory, fsync=False)
    keys = max(1, records * DISTINCT_KEYS_PERCENT // 100)
    async with running_node(_config(), MemoryLogStore(), objects) as node:
        await node.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
        for start in range(0, records, RECORDS_PER_PRODUCE):
            batch = [
                Record(b"key-%06d" % (i % keys), b"v" * VALUE_BYTES, timestamp_ms=0)
                for i in range(start, min(records, start + RECORDS_PER_PRODUCE))
            ]
            await node.produce("c", 0, batch)
        await node.reconciler.run_round()
        actor = node.partition("c", 0)
        rows = await node.l1.refresh(actor)
        before = sum(r.size for r in rows)
        began = time.perf_counter()
        if compact:
            assert await node.compactor.compact_partition(actor)
        else:
            for row in rows:
                data = await objects.get(row.key)
                await objects.put(row.key.replace("/c/", "/floor/", 1), data)
        elapsed = time.perf_counter() - began
        after = await _l1_bytes(objects) if compact else before
    return before / elapsed / 1e6, after / before


async def run(settings: Settings) -> list[Figure]:
    records = settings.pick(200_000, 20_000)
    space: list[float] = []
    with work_dir(settings, ITEM) as root:

        async def sut(i: int) -> float:
            rate, ratio = await _round(root / f"sut-{i}", records, compact=True)
            space.append(ratio)
            return rate

        async def floor(i: int) -> float:
            rate, _ = await _round(root / f"floor-{i}", records, compact=False)
            return rate

        pairs = await interleave(settings.pick(settings.rounds, 2), sut, floor)
    return [
        figure(
            ITEM,
            f"compaction of {records} records, {DISTINCT_KEYS_PERCENT}% distinct keys",
            "MB/s",
            pairs,
            target=TARGET,
            sut_label="compactor",
            floor_label="raw read + write",
            notes={"space_after_over_before": round(min(space), 4), "records": records},
        )
    ]
