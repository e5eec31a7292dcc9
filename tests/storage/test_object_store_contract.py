"""The ObjectStore contract, pinned for every adapter (memory, local directory, S3).

Each test runs once per store kind through the `object_store` fixture (tests/conftest.py);
the S3 runs carry the `s3` marker.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Iterable

import anyio
import pytest

from levelzero.core.errors import InvalidInput, ObjectNotFound
from levelzero.storage.protocols import (
    DELETE_BATCH_KEYS_MAX,
    LIST_PAGE_KEYS_MAX,
    ObjectStore,
    iter_objects,
)

PUT_WORKERS = 32


async def put_concurrently(
    store: ObjectStore, objects: Iterable[tuple[str, bytes]], workers: int = PUT_WORKERS
) -> None:
    """Put every object with at most `workers` requests in flight."""
    pending = iter(objects)

    async def worker() -> None:
        for key, data in pending:  # one shared iterator: each object is taken once
            await store.put(key, data)

    async with anyio.create_task_group() as tg:
        for _ in range(workers):
            tg.start_soon(worker)


async def listed_keys(
    store: ObjectStore, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
) -> list[str]:
    page = await store.list_page(prefix, start_after, limit)
    return [obj.key for obj in page.objects]


# --------------------------------------------------------------------------- put / get / head


async def test_put_then_get_returns_the_whole_object(object_store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    await object_store.put("level_zero/data/007/000000000000000003/obj", data)
    assert await object_store.get("level_zero/data/007/000000000000000003/obj") == data


async def test_a_bytearray_is_stored_as_it_was_when_put(object_store: ObjectStore) -> None:
    """The batcher builds an object in a bytearray and puts that; what is stored is its bytes
    at the time of the put (a store that kept the buffer would see later changes)."""
    data = bytearray(bytes(range(256)) * 40)
    await object_store.put("level_zero/data/007/000000000000000003/built", data)
    expected = bytes(data)
    data[:4] = b"gone"
    assert await object_store.get("level_zero/data/007/000000000000000003/built") == expected


async def test_put_overwrites_the_object(object_store: ObjectStore) -> None:
    await object_store.put("k", b"first version")
    await object_store.put("k", b"second")
    assert await object_store.get("k") == b"second"
    info = await object_store.head("k")
    assert info is not None and info.size == len(b"second")


async def test_get_reads_byte_ranges(object_store: ObjectStore) -> None:
    await object_store.put("r/obj", b"0123456789")
    assert await object_store.get("r/obj", 0, 4) == b"0123"
    assert await object_store.get("r/obj", 3, 4) == b"3456"
    assert await object_store.get("r/obj", 9, 1) == b"9"
    assert await object_store.get("r/obj", 4) == b"456789"  # to the end
    assert await object_store.get("r/obj", 7, 100) == b"789"  # cut short at the end
    assert await object_store.get("r/obj", 5, 0) == b""
    assert await object_store.get("r/obj", 10) == b""  # starts exactly at the end


async def test_range_starting_beyond_the_end_is_invalid(object_store: ObjectStore) -> None:
    await object_store.put("r/obj", b"0123456789")
    with pytest.raises(InvalidInput, match="beyond the end"):
        await object_store.get("r/obj", 11, 2)


async def test_negative_range_arguments_are_invalid(object_store: ObjectStore) -> None:
    await object_store.put("r/obj", b"0123456789")
    with pytest.raises(InvalidInput, match="negative"):
        await object_store.get("r/obj", -1, 2)
    with pytest.raises(InvalidInput, match="negative"):
        await object_store.get("r/obj", 0, -2)


async def test_empty_object_round_trips(object_store: ObjectStore) -> None:
    await object_store.put("e/empty", b"")
    assert await object_store.get("e/empty") == b""
    assert await object_store.get("e/empty", 0) == b""
    assert await object_store.get("e/empty", 0, 10) == b""
    info = await object_store.head("e/empty")
    assert info is not None and (info.key, info.size) == ("e/empty", 0)
    assert [obj.size for obj in (await object_store.list_page("e/")).objects] == [0]


async def test_head_reports_size_and_modification_time(object_store: ObjectStore) -> None:
    before = time.time()
    await object_store.put("h/obj", b"x" * 1234)
    info = await object_store.head("h/obj")
    assert info is not None
    assert (info.key, info.size) == ("h/obj", 1234)
    # S3 keeps whole seconds; allow for that and a little clock skew, nothing more.
    assert before - 2 <= info.last_modified <= time.time() + 2


async def test_head_of_missing_key_is_none(object_store: ObjectStore) -> None:
    await object_store.put("h/other", b"x")
    assert await object_store.head("h/missing") is None
    assert await object_store.head("h") is None  # a "directory" of keys is not an object


async def test_get_of_missing_key_raises_object_not_found(object_store: ObjectStore) -> None:
    await object_store.put("g/other", b"x")
    with pytest.raises(ObjectNotFound) as caught:
        await object_store.get("g/missing")
    assert caught.value.key == "g/missing"
    assert caught.value.code == "object_not_found"
    with pytest.raises(ObjectNotFound):
        await object_store.get("g/missing", 2, 5)
    with pytest.raises(ObjectNotFound):
        await object_store.get("g/missing", 0, 0)
    with pytest.raises(ObjectNotFound):
        await object_store.get("g")


# ------------------------------------------------------------------------------------ listing

# Characters sorting before '/' ('-', '.') and after it ('0', 'b') around a "directory" `a`:
# key order is not the order of a sorted directory walk.
# (A key is never also a "directory" of other keys: the local store cannot hold both.)
TRICKY_KEYS = ["a/b", "a-b", "a.b", "a/c/d", "a0", "ab", "a/c-e", "a/c/e-f/g", "a/ca", "b"]


async def test_list_returns_keys_in_lexicographic_order(object_store: ObjectStore) -> None:
    await put_concurrently(object_store, ((key, key.encode()) for key in TRICKY_KEYS))
    page = await object_store.list_page("")
    assert [obj.key for obj in page.objects] == sorted(TRICKY_KEYS)
    assert [obj.size for obj in page.objects] == [len(key) for key in sorted(TRICKY_KEYS)]
    assert page.next_start_after is None


async def test_list_filters_by_prefix(object_store: ObjectStore) -> None:
    await put_concurrently(object_store, ((key, b"x") for key in TRICKY_KEYS))
    assert await listed_keys(object_store, "a/") == ["a/b", "a/c-e", "a/c/d", "a/c/e-f/g", "a/ca"]
    assert await listed_keys(object_store, "a/c") == ["a/c-e", "a/c/d", "a/c/e-f/g", "a/ca"]
    assert await listed_keys(object_store, "a/c/") == ["a/c/d", "a/c/e-f/g"]
    assert await listed_keys(object_store, "a") == sorted(k for k in TRICKY_KEYS if k != "b")
    assert await listed_keys(object_store, "a/c/d") == ["a/c/d"]
    assert await listed_keys(object_store, "a/c/e") == ["a/c/e-f/g"]
    assert await listed_keys(object_store, "zzz") == []
    assert await listed_keys(object_store, "a/x/") == []


async def test_list_starts_strictly_after_start_after(object_store: ObjectStore) -> None:
    await put_concurrently(object_store, ((key, b"x") for key in TRICKY_KEYS))
    assert await listed_keys(object_store, "a/", "a/c-e") == ["a/c/d", "a/c/e-f/g", "a/ca"]
    # start_after inside a "directory", and not itself a key
    assert await listed_keys(object_store, "a/", "a/c/d0") == ["a/c/e-f/g", "a/ca"]
    assert await listed_keys(object_store, "a/", "a/c/e-f/a") == ["a/c/e-f/g", "a/ca"]
    assert await listed_keys(object_store, "", "a/z") == ["a0", "ab", "b"]
    # before the prefix: the whole prefix; after it: nothing
    assert await listed_keys(object_store, "a/c", "a/") == ["a/c-e", "a/c/d", "a/c/e-f/g", "a/ca"]
    assert await listed_keys(object_store, "a/", "a0") == []


async def test_list_pages_with_a_limit(object_store: ObjectStore) -> None:
    await put_concurrently(object_store, ((key, b"x") for key in TRICKY_KEYS))
    keys: list[str] = []
    start_after: str | None = None
    pages = 0
    while True:
        page = await object_store.list_page("", start_after, limit=3)
        assert len(page.objects) <= 3
        keys += [obj.key for obj in page.objects]
        pages += 1
        if page.next_start_after is None:
            break
        assert page.next_start_after == page.objects[-1].key
        start_after = page.next_start_after
    assert keys == sorted(TRICKY_KEYS)
    assert pages == 4  # 3 + 3 + 3 + 1


async def test_list_limit_outside_allowed_range_is_invalid(object_store: ObjectStore) -> None:
    with pytest.raises(InvalidInput):
        await object_store.list_page("", limit=0)
    with pytest.raises(InvalidInput):
        await object_store.list_page("", limit=LIST_PAGE_KEYS_MAX + 1)


async def test_listing_pages_across_more_than_1000_keys(object_store: ObjectStore) -> None:
    keys = [f"many/{i:05d}" for i in range(1205)]
    neighbours = [("mano", b"x"), ("n", b"x")]  # outside the prefix, on both sides
    await put_concurrently(object_store, [(key, b"v") for key in keys] + neighbours)

    first = await object_store.list_page("many/")
    assert [obj.key for obj in first.objects] == keys[:1000]
    assert first.next_start_after == keys[999]
    second = await object_store.list_page("many/", first.next_start_after)
    assert [obj.key for obj in second.objects] == keys[1000:]
    assert second.next_start_after is None

    assert [obj.key async for obj in iter_objects(object_store, "many/")] == keys


async def test_iter_objects_yields_objects_under_prefix_after_start(
    object_store: ObjectStore,
) -> None:
    await put_concurrently(object_store, ((key, key.encode()) for key in TRICKY_KEYS))
    seen = [(obj.key, obj.size) async for obj in iter_objects(object_store, "a/c", "a/c-e")]
    assert seen == [("a/c/d", 5), ("a/c/e-f/g", 9), ("a/ca", 4)]
    assert [obj async for obj in iter_objects(object_store, "nothing/")] == []


# ------------------------------------------------------------------------------------ delete


async def test_delete_many_deletes_and_counts_missing_keys_as_deleted(
    object_store: ObjectStore,
) -> None:
    await put_concurrently(object_store, ((key, b"x") for key in ["d/1", "d/2", "d/3"]))
    result = await object_store.delete_many(["d/1", "d/never-existed", "d/3"])
    assert sorted(result.deleted) == ["d/1", "d/3", "d/never-existed"]
    assert result.errors == {}
    assert await listed_keys(object_store, "d/") == ["d/2"]
    with pytest.raises(ObjectNotFound):
        await object_store.get("d/1")
    # Deleting again is harmless: deletes are idempotent.
    again = await object_store.delete_many(["d/1", "d/3"])
    assert (sorted(again.deleted), again.errors) == (["d/1", "d/3"], {})


async def test_delete_many_of_no_keys_deletes_nothing(object_store: ObjectStore) -> None:
    await object_store.put("d/keep", b"x")
    result = await object_store.delete_many([])
    assert (result.deleted, result.errors) == ([], {})
    assert await listed_keys(object_store, "") == ["d/keep"]


async def test_delete_many_with_more_than_1000_keys_is_rejected(object_store: ObjectStore) -> None:
    await object_store.put("d/0000", b"x")
    keys = [f"d/{i:04d}" for i in range(DELETE_BATCH_KEYS_MAX + 1)]
    with pytest.raises(InvalidInput, match="1001 keys"):
        await object_store.delete_many(keys)
    assert await object_store.head("d/0000") is not None  # nothing was deleted


async def test_delete_many_accepts_exactly_1000_keys(object_store: ObjectStore) -> None:
    await put_concurrently(object_store, ((f"d/{i:04d}", b"x") for i in range(0, 1000, 100)))
    result = await object_store.delete_many([f"d/{i:04d}" for i in range(1000)])
    assert len(result.deleted) == 1000 and result.errors == {}
    assert await listed_keys(object_store, "d/") == []


# ---------------------------------------------------------------------------- unsafe keys

UNSAFE_KEYS = [
    "",
    "/etc/passwd",
    "..",
    "../outside",
    "a/../../outside",
    "a/..",
    "a/./b",
    "a//b",
    "dir/",
    "a\\b",
    "a\x00b",
    ".lz-tmp-abc",
    "dir/.lz-tmp-abc",
]


async def rejection_message(call: Awaitable[object]) -> str | None:
    """The InvalidInput message `call` fails with, or None if it went through."""
    try:
        await call
    except InvalidInput as exc:
        return str(exc)
    return None


async def test_unsafe_keys_are_rejected_naming_the_key(object_store: ObjectStore) -> None:
    accepted: list[tuple[str, str]] = []
    unnamed: list[tuple[str, str]] = []
    for key in UNSAFE_KEYS:
        for op, call in (
            ("put", object_store.put(key, b"x")),
            ("get", object_store.get(key)),
            ("head", object_store.head(key)),
            ("delete_many", object_store.delete_many(["fine/key", key])),
        ):
            message = await rejection_message(call)
            if message is None:
                accepted.append((op, key))
            elif repr(key) not in message:
                unnamed.append((op, key))
    assert accepted == []
    assert unnamed == []
    assert await listed_keys(object_store, "") == []
