"""MemoryObjectStore beyond the shared contract: fault injection, injected clock and sleep,
statistics."""

from __future__ import annotations

import dataclasses

import pytest

from levelzero.core.errors import ObjectNotFound, StorageError
from levelzero.storage.memory_store import FaultPlan, MemoryObjectStore


class RecordingSleep:
    """A sleep that returns at once and remembers what it was asked for (virtual time)."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


async def test_fail_next_fails_the_next_count_operations_then_recovers() -> None:
    store = MemoryObjectStore()
    store.faults.fail_next("put", StorageError("injected"), count=2)
    for _ in range(2):
        with pytest.raises(StorageError, match="injected"):
            await store.put("k", b"v")
    assert await store.head("k") is None  # a fault before the effect leaves nothing behind
    await store.put("k", b"v")
    assert await store.get("k") == b"v"
    assert store.statistics().faults == 2


async def test_fail_next_can_target_one_key() -> None:
    store = MemoryObjectStore()
    await store.put("a", b"1")
    await store.put("b", b"2")
    store.faults.fail_next("get", StorageError("injected"), key="b")
    assert await store.get("a") == b"1"
    with pytest.raises(StorageError):
        await store.get("b")
    assert await store.get("b") == b"2"


async def test_fault_after_effect_applies_the_operation_but_raises() -> None:
    store = MemoryObjectStore()
    store.faults.fail_next("put", TimeoutError("response lost"), after_effect=True)
    with pytest.raises(TimeoutError):
        await store.put("k", b"v")
    assert await store.get("k") == b"v"  # the caller could not know it was written


async def test_hook_sees_every_operation_and_can_fail_it() -> None:
    seen: list[tuple[str, str | None]] = []

    def hook(op: str, key: str | None) -> None:
        seen.append((op, key))
        if op == "list" and key == "forbidden/":
            raise StorageError("list refused")

    store = MemoryObjectStore(faults=FaultPlan(hook=hook))
    await store.put("ok/1", b"x")
    await store.get("ok/1")
    await store.head("ok/1")
    await store.list_page("ok/")
    await store.delete_many(["ok/1"])
    with pytest.raises(StorageError, match="list refused"):
        await store.list_page("forbidden/")
    assert seen == [
        ("put", "ok/1"),
        ("get", "ok/1"),
        ("head", "ok/1"),
        ("list", "ok/"),
        ("delete_many", None),
        ("list", "forbidden/"),
    ]


async def test_delays_use_the_injected_sleep() -> None:
    sleep = RecordingSleep()
    store = MemoryObjectStore(sleep=sleep)
    await store.put("k", b"v")
    assert sleep.calls == []  # no delay configured: no sleep at all
    store.faults.set_delay("get", 0.25)
    store.faults.set_delay("delete_many", 1.5)
    await store.get("k")
    await store.put("k", b"w")
    await store.delete_many(["k"])
    assert sleep.calls == [0.25, 1.5]


async def test_delete_many_reports_injected_per_key_failures_and_keeps_those_keys() -> None:
    store = MemoryObjectStore()
    for key in ("d/1", "d/2", "d/3"):
        await store.put(key, b"x")
    store.faults.fail_deletes(["d/2"], error="SlowDown: reduce your request rate", count=1)

    result = await store.delete_many(["d/1", "d/2", "d/3"])
    assert result.deleted == ["d/1", "d/3"]
    assert result.errors == {"d/2": "SlowDown: reduce your request rate"}
    assert store.keys() == ["d/2"]

    retry = await store.delete_many(["d/2"])  # the fault was for one attempt only
    assert (retry.deleted, retry.errors) == (["d/2"], {})
    assert store.keys() == []
    stats = store.statistics()
    assert (stats.delete_requests, stats.deletes, stats.delete_errors) == (2, 3, 1)


async def test_persistent_delete_failure_lasts_until_cleared() -> None:
    store = MemoryObjectStore()
    await store.put("d/1", b"x")
    store.faults.fail_deletes(["d/1"])
    for _ in range(3):
        assert (await store.delete_many(["d/1"])).errors == {"d/1": "InternalError"}
    store.faults.clear()
    assert (await store.delete_many(["d/1"])).deleted == ["d/1"]


async def test_last_modified_comes_from_the_injected_clock() -> None:
    now = [1000.0]
    store = MemoryObjectStore(clock=lambda: now[0])
    await store.put("a", b"x")
    now[0] = 1002.5
    await store.put("b", b"y")
    assert [obj.last_modified for obj in (await store.list_page("")).objects] == [1000.0, 1002.5]
    head = await store.head("b")
    assert head is not None and head.last_modified == 1002.5


async def test_statistics_is_an_immutable_snapshot() -> None:
    store = MemoryObjectStore()
    await store.put("a", b"123")
    await store.put("b", b"45")
    await store.put("a", b"6")  # overwrite: bytes follow the new size
    await store.get("a")
    await store.head("zz")
    await store.list_page("")
    with pytest.raises(ObjectNotFound):
        await store.get("missing")
    snapshot = store.statistics()
    assert dataclasses.astuple(snapshot) == (3, 2, 1, 1, 0, 0, 0, 0, 2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.puts = 0  # type: ignore[misc]
    await store.put("c", b"")
    assert snapshot.puts == 3 and store.statistics().puts == 4


async def test_stored_bytes_are_a_copy_of_the_callers_buffer() -> None:
    store = MemoryObjectStore()
    buffer = bytearray(b"abc")
    await store.put("k", buffer)  # type: ignore[arg-type]
    buffer[0] = ord("z")
    assert await store.get("k") == b"abc"


async def test_objects_survive_aclose_for_simulated_restarts() -> None:
    store = MemoryObjectStore()
    await store.put("k", b"v")
    await store.aclose()
    assert await store.get("k") == b"v"
