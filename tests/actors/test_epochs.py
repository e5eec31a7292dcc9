"""EpochService (durable, only rises) and EpochCache (TTL, coalesced refresh, invalidate_below).

Time is a fake clock handed to the cache; concurrency is orchestrated with events, never sleeps.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from levelzero.actors.epochs import EpochCache, EpochService
from levelzero.core.errors import InvariantViolation, StorageError
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.protocols import LogStore
from levelzero.storage.sqlite import SqliteLogStore

TTL_S = 10.0


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CountingSource:
    """An epoch source for the cache: counts fetches; `gate` (if set) holds every fetch."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.fetches = 0
        self.gate: anyio.Event | None = None

    async def __call__(self) -> int:
        self.fetches += 1
        value = self.value  # what the service said when asked, even if it moves on meanwhile
        if self.gate is not None:
            await self.gate.wait()
        return value


@asynccontextmanager
async def open_log_store(kind: str, path: Path) -> AsyncIterator[LogStore]:
    """The store is opened and closed in the test's own task (SqliteLogStore's rule)."""
    if kind == "memory":
        yield MemoryLogStore()
        return
    async with await SqliteLogStore.open(path) as store:
        yield store


# ----------------------------------------------------------------------------- EpochService


async def test_advance_increments_by_one_and_is_visible_at_once() -> None:
    service = EpochService(MemoryLogStore())
    assert await service.load() == 1
    assert [await service.advance() for _ in range(3)] == [2, 3, 4]
    assert service.current == await service.get() == 4
    assert service.advances == 3


async def test_memory_store_epoch_survives_a_new_service() -> None:
    store = MemoryLogStore()
    first = EpochService(store)
    await first.load()
    await first.advance()
    await first.advance()
    second = EpochService(store)
    assert await second.load() == 3
    assert await second.advance() == 4
    assert store.cluster_epoch == 4


async def test_sqlite_store_epoch_survives_reopening_the_database(tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    async with open_log_store("sqlite", db) as store:
        service = EpochService(store)
        await service.load()
        for _ in range(4):
            await service.advance()
    async with open_log_store("sqlite", db) as store:
        service = EpochService(store)
        assert await service.load() == 5
        assert await service.advance() == 6


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_stale_service_cannot_move_the_stored_epoch_back(kind: str, tmp_path: Path) -> None:
    async with open_log_store(kind, tmp_path / "log.db") as store:
        stale = EpochService(store)
        await stale.load()  # sees 1
        fresh = EpochService(store)
        await fresh.load()
        for _ in range(3):
            await fresh.advance()  # stored: 4
        with pytest.raises(InvariantViolation):
            await stale.advance()  # would store 2 < 4
        assert stale.current == 1, "a failed advance must not become visible"
        assert await store.get_cluster_epoch() == 4
        with pytest.raises(InvariantViolation):
            await store.set_cluster_epoch(3)
        assert await store.get_cluster_epoch() == 4


# ----------------------------------------------------------------------------- EpochCache


async def test_cache_serves_cached_epoch_until_ttl_then_refreshes() -> None:
    clock = FakeClock()
    source = CountingSource(5)
    cache = EpochCache(source, TTL_S, clock=clock)
    assert cache.cached is None
    assert await cache.get() == 5
    assert source.fetches == 1

    source.value = 6  # the cluster moves on; the cache is stale by design
    clock.now += TTL_S - 0.001
    assert await cache.get() == 5
    assert source.fetches == 1

    clock.now += 0.001  # exactly at the TTL: expired
    assert await cache.get() == 6
    assert source.fetches == 2
    assert cache.refreshes == 2


async def test_concurrent_gets_during_expiry_share_one_fetch() -> None:
    clock = FakeClock()
    source = CountingSource(3)
    cache = EpochCache(source, TTL_S, clock=clock)
    await cache.get()
    clock.now += TTL_S
    source.value = 4
    source.gate = anyio.Event()
    results: list[int] = []

    async def getter(*, task_status: anyio.abc.TaskStatus) -> None:
        # `started` precedes the call, and `get()` runs without yielding until it waits on the
        # fetch (the first caller) or on the refresh in flight (everybody else); so once
        # `tg.start` returns, this getter is parked inside the cache.
        task_status.started()
        results.append(await cache.get())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(10):
                await tg.start(getter)
            assert source.fetches == 2  # the initial fill plus exactly one refresh in flight
            assert results == []
            source.gate.set()
    assert results == [4] * 10
    assert source.fetches == 2
    assert cache.refreshes == 2


async def test_invalidate_below_refreshes_only_when_cached_is_older() -> None:
    clock = FakeClock()
    source = CountingSource(5)
    cache = EpochCache(source, TTL_S, clock=clock)
    await cache.get()
    source.value = 7

    cache.invalidate_below(5)  # cached == 5: not behind
    cache.invalidate_below(4)
    assert await cache.get() == 5
    assert source.fetches == 1
    assert cache.invalidations == 0

    cache.invalidate_below(6)  # a rejection showed the cluster is at least at 6
    assert cache.invalidations == 1
    assert await cache.get() == 7
    assert source.fetches == 2

    cache.invalidate_below(7)
    assert await cache.get() == 7
    assert source.fetches == 2


async def test_slow_refresh_never_moves_the_cached_epoch_back() -> None:
    clock = FakeClock()
    source = CountingSource(9)
    cache = EpochCache(source, TTL_S, clock=clock)
    await cache.get()
    source.value = 8  # an answer older than what the cache already holds (a slow, raced fetch)
    assert await cache.refresh() == 9
    assert cache.cached == 9


async def test_cache_over_the_service_sees_advances_after_ttl() -> None:
    clock = FakeClock()
    service = EpochService(MemoryLogStore())
    await service.load()
    cache = EpochCache(service.get, TTL_S, clock=clock)
    assert await cache.get() == 1
    await service.advance()
    assert await cache.get() == 1
    clock.now += TTL_S
    assert await cache.get() == 2


async def test_a_failed_shared_refresh_reaches_every_waiter_without_a_cached_value():
    gate = anyio.Event()
    calls = 0

    async def failing_fetch() -> int:
        nonlocal calls
        calls += 1
        await gate.wait()
        raise StorageError("epoch store unreachable")

    cache = EpochCache(failing_fetch, ttl_s=10.0, clock=lambda: 0.0)
    errors = []

    async def get() -> None:
        try:
            await cache.get()
        except StorageError as exc:
            errors.append(str(exc))

    async with anyio.create_task_group() as tg:
        tg.start_soon(get)
        tg.start_soon(get)
        await anyio.wait_all_tasks_blocked()
        gate.set()
    assert calls == 1
    assert errors == ["epoch store unreachable"] * 2
