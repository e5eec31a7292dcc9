"""The fault-injecting wrapper used by the crash tests: seeded, bounded, honest about effects."""

from __future__ import annotations

import pytest

from levelzero.core.errors import InvalidInput, StorageError
from levelzero.testing.faulty_store import FaultSpec, FaultyObjectStore
from levelzero.storage.memory_store import MemoryObjectStore


def test_spec_parses_and_rejects_bad_values():
    assert FaultSpec.parse("error_rate=0.25,latency_ms=3,seed=9") == FaultSpec(0.25, 3.0, 9)
    assert FaultSpec.parse("") == FaultSpec()
    for bad in ("error_rate=1.5", "rate=0.1", "error_rate=x", "latency_ms"):
        with pytest.raises(InvalidInput):
            FaultSpec.parse(bad)


async def test_the_same_seed_fails_the_same_operations():
    async def outcomes(seed: int) -> list[str]:
        store = FaultyObjectStore(MemoryObjectStore(), FaultSpec(error_rate=0.3, seed=seed))
        out = []
        for i in range(40):
            try:
                await store.put(f"k/{i}", b"x")
                out.append("ok")
            except StorageError as exc:
                out.append(str(exc))
        return out

    first, again, other = await outcomes(1), await outcomes(1), await outcomes(2)
    assert first == again
    assert first != other
    assert any("before put" in o for o in first) and any("after put" in o for o in first)


async def test_a_put_failing_after_its_effect_leaves_the_object_and_partial_deletes_keep_keys():
    inner = MemoryObjectStore()
    store = FaultyObjectStore(inner, FaultSpec(error_rate=0.5, seed=3))
    after_effect = 0
    for i in range(30):
        try:
            await store.put(f"k/{i}", b"x")
        except StorageError as exc:
            if "after put" in str(exc):
                after_effect += 1
                assert await inner.head(f"k/{i}") is not None
    assert after_effect > 0
    keys = inner.keys()
    while True:
        try:
            result = await store.delete_many(keys)
            break
        except StorageError:
            continue
    assert result.errors and set(result.deleted).isdisjoint(result.errors)
    assert sorted(inner.keys()) == sorted(result.errors)


async def test_scripted_delete_failures_fail_each_key_under_the_prefix_n_times_then_delete_it():
    inner = MemoryObjectStore()
    store = FaultyObjectStore(inner, FaultSpec())
    for key in ("level_one/a", "level_one/b", "level_zero/c"):
        await inner.put(key, b"x")
    store.fail_deletes("level_one/", 2)
    outcomes = []
    for _ in range(3):
        result = await store.delete_many(["level_one/a", "level_zero/c"])
        outcomes.append((sorted(result.deleted), sorted(result.errors)))
    assert outcomes == [
        (["level_zero/c"], ["level_one/a"]),
        (["level_zero/c"], ["level_one/a"]),
        (["level_one/a", "level_zero/c"], []),
    ]
    assert sorted(inner.keys()) == ["level_one/b"]
    assert store.injected == 2
