"""The GC item's setup server (`levelzero.testing.moto`: moto's application plus one endpoint that creates
many objects at once) and the item itself in quick mode. No timing is asserted."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest

from levelzero.bench import main
from levelzero.bench.common import moto_server, s3_config
from levelzero.bench.gc import catalog_order, create_objects, gc_round_s, make_keys, ready_gc, record_objects
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import DeleteResult
from levelzero.storage.s3_store import S3ObjectStore
from levelzero.storage.sqlite import SqliteLogStore
from levelzero.testing.moto import FILL_PATH

pytestmark = pytest.mark.s3


async def test_fill_creates_objects_that_s3_requests_then_see(tmp_path: Path) -> None:
    keys = sorted(make_keys(1500, random.Random(5)))
    async with moto_server(tmp_path) as url:
        async with S3ObjectStore(s3_config(url, "fill-test")) as store:
            seconds = await create_objects(url, "fill-test", keys)
            assert seconds > 0
            listed: list[str] = []
            start_after = None
            while True:
                page = await store.list_page("level_zero/", start_after)
                listed += [o.key for o in page.objects]
                if page.next_start_after is None:
                    break
                start_after = page.next_start_after
            assert listed == keys
            assert await store.get(keys[0]) == b"x"
            deleted = await store.delete_many(keys[:1000])  # the same server deletes them
            assert deleted.errors == {} and len(deleted.deleted) == 1000
            assert (await store.list_page("level_zero/", limit=1000)).objects[0].key == keys[1000]

        async with aiohttp.ClientSession() as session:
            cases = [
                ("GET", None, 405, "POST a JSON body"),
                ("POST", b"not json", 400, "bad fill request"),
                ("POST", json.dumps({"bucket": "b", "keys": "k"}).encode(), 400, "keys a list"),
                (
                    "POST",
                    json.dumps({"bucket": "no-such-bucket", "keys": ["a"]}).encode(),
                    500,
                    "fill failed",
                ),
            ]
            for method, body, status, text in cases:
                async with session.request(method, url + FILL_PATH, data=body) as response:
                    assert response.status == status
                    assert text in await response.text()


def test_quick_gc_item_reports_catalog_sweep_and_lag_figures(tmp_path: Path) -> None:
    results_path = tmp_path / "results.json"
    code = main(["--quick", "--only", "gc", "--results", str(results_path), "--dir", str(tmp_path)])
    assert code == 0
    figures = json.loads(results_path.read_text(encoding="utf-8"))["items"]["gc"]["figures"]
    names = [f["name"] for f in figures]
    assert names[0].startswith("GC deletes/s (catalog round)")
    catalog = figures[0]
    assert catalog["sut"] > 0 and catalog["floor"] > 0 and catalog["target"]["bound"] == 0.8
    assert catalog["notes"]["objects"] == 1000 and catalog["notes"]["gc_delete_requests"] == 1
    assert sum("GC lag" in name for name in names) == 1


class BatchesSeen(MemoryObjectStore):
    """A memory store that keeps the keys of every delete request, as asked."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[list[str]] = []

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        self.requests.append(list(keys))
        return await super().delete_many(keys)


async def test_the_raw_floor_sends_the_delete_requests_of_a_catalog_round(tmp_path: Path) -> None:
    """The floor deletes the same keys in the same requests as the GC's catalog round (moto's
    CPU depends on the order keys are deleted in): the keys in catalog order, 1,000 a request."""
    keys = make_keys(2500, random.Random(3))
    store = BatchesSeen()
    async with await SqliteLogStore.open(tmp_path / "catalog.db") as catalog:
        gc = await ready_gc(store, catalog, sweep=False)
        for key in keys:
            await store.put(key, b"x")
        await record_objects(catalog, keys)
        await gc_round_s(gc, len(keys))
    floor = catalog_order(keys)
    assert sorted(floor) == sorted(keys) and floor != keys
    assert sorted(store.requests) == [floor[i : i + 1000] for i in range(0, len(floor), 1000)]
