"""The GC round against S3 (moto, or LEVELZERO_TEST_S3_ENDPOINT): more than one delete batch
and more than one list page, objects at or below M deleted, above M kept."""

from __future__ import annotations

import random
import time

import anyio
import pytest

from levelzero.actors.gc import GcActor, GcConfig
from levelzero.actors.partition import WatermarkBoard
from levelzero.core.keys import L0_ROOT, format_l0_key, new_uuid, parse_l0_key
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.protocols import iter_objects
from levelzero.storage.s3_store import S3Config, S3ObjectStore

pytestmark = pytest.mark.s3

PUT_WORKERS = 32


async def put_all(store: S3ObjectStore, keys: list[str]) -> None:
    pending = iter(keys)

    async def worker() -> None:
        for key in pending:  # one shared iterator: each key is put once
            await store.put(key, b"x")

    async with anyio.create_task_group() as tg:
        for _ in range(PUT_WORKERS):
            tg.start_soon(worker)


async def test_a_round_against_s3_deletes_more_than_1000_keys_at_or_below_m(s3_config: S3Config) -> None:
    rng = random.Random(11)
    eligible = [
        format_l0_key(rng.randrange(4), 1 + i % 3, new_uuid(rng.getrandbits(128))) for i in range(1100)
    ]
    above = [format_l0_key(p, 4, new_uuid(rng.getrandbits(128))) for p in range(4) for _ in range(25)]
    async with S3ObjectStore(s3_config) as store:
        await put_all(store, eligible + above)
        board = WatermarkBoard()
        board.register("t/0")
        board.publish("t/0", 3)
        log_store = MemoryLogStore()
        gc = GcActor(
            GcConfig(grace_s=0.0, list_concurrency_max=2),
            store,
            log_store,
            cluster_epoch=lambda: 10,
            board=board,
            views=list,
            clock=time.time,
            rng=random.Random(1),
        )

        dry = await gc.run_round(dry_run=True)
        assert sorted(dry.would_delete) == sorted(eligible)

        report = await gc.run_round()

        left = [obj.key async for obj in iter_objects(store, L0_ROOT)]
        assert sorted(left) == sorted(above)
        assert (report.m, report.deleted, report.errors, report.backlog) == (3, 1100, 0, 0)
        assert report.delete_requests == 2  # 1000 + 100
        assert report.max_deleted_epoch == 3
        assert all(parse_l0_key(k).epoch == 4 for k in left)
        assert [row.deleted for row in log_store.gc_rounds] == [0, 1100]
