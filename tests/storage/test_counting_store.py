"""The counting wrapper counts each request once, by key class, with the bytes it moved."""

from __future__ import annotations

from levelzero.core.keys import format_l0_key, format_l1_key
from levelzero.storage.counting_store import CountingObjectStore, RequestCounts
from levelzero.storage.memory_store import MemoryObjectStore


async def test_requests_and_bytes_are_counted_by_class_and_snapshots_subtract():
    store = CountingObjectStore(MemoryObjectStore())
    l0 = format_l0_key(7, 3, "a" * 32)
    l1 = format_l1_key("t", 0, 0, 9, 1, "b" * 32)
    await store.put(l0, b"x" * 100)
    before = store.snapshot()
    await store.put(l1, b"y" * 40)
    await store.put("levelzero/topics/t", b"{}")
    assert await store.get(l0, 10, 20) == b"x" * 20
    assert await store.get(l1) == b"y" * 40
    assert await store.head(l1) is not None
    page = await store.list_page("level_zero/")
    assert [o.key for o in page.objects] == [l0]
    result = await store.delete_many([l0, l1])
    assert sorted(result.deleted) == sorted([l0, l1])
    assert before == RequestCounts(l0_puts=1, l0_put_bytes=100)
    assert store.snapshot() - before == RequestCounts(
        l1_puts=1,
        l1_put_bytes=40,
        other_puts=1,
        other_put_bytes=2,
        l0_gets=1,
        l0_get_bytes=20,
        l1_gets=1,
        l1_get_bytes=40,
        heads=1,
        lists=1,
        listed_keys=1,
        delete_requests=1,
        deleted_keys=2,
    )
    assert (store.snapshot().puts, store.snapshot().gets) == (3, 2)


async def test_requests_made_under_a_role_are_counted_apart_and_in_the_total():
    store = CountingObjectStore(MemoryObjectStore())
    key = format_l0_key(1, 1, "c" * 32)
    await store.put(key, b"abc")
    with store.role("reader"):
        assert await store.get(key) == b"abc"
        await store.get(key, 1, 1)
    await store.get(key)
    assert store.snapshot("reader") == RequestCounts(l0_gets=2, l0_get_bytes=4)
    assert store.snapshot("") == RequestCounts(l0_puts=1, l0_put_bytes=3, l0_gets=1, l0_get_bytes=3)
    assert store.snapshot().l0_gets == 3
    assert store.snapshot("nobody") == RequestCounts()
