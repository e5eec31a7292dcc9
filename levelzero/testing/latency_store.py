"""An `ObjectStore` wrapper that delays every request like a remote object store does: each PUT
and GET waits a latency drawn uniformly from its range (e.g. 20-80 ms like S3 Standard, ~5 ms
like S3 Express One Zone), seeded. The delays it drew are kept, so a benchmark can compute its
floor from the latencies its requests actually met."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from levelzero.storage.protocols import LIST_PAGE_KEYS_MAX, DeleteResult, ListPage, ObjectInfo, ObjectStore


@dataclass(frozen=True, slots=True)
class Latency:
    """Uniform latency ranges in milliseconds; other requests (HEAD, LIST, DeleteObjects) take
    the GET range."""

    name: str
    put_ms: tuple[float, float]
    get_ms: tuple[float, float]

    def __post_init__(self) -> None:
        for low, high in (self.put_ms, self.get_ms):
            assert 0 <= low <= high, (low, high)


S3_STANDARD = Latency("S3 Standard-like", put_ms=(20.0, 80.0), get_ms=(20.0, 80.0))
S3_EXPRESS = Latency("S3 Express One Zone-like", put_ms=(3.0, 7.0), get_ms=(3.0, 7.0))


class LatencyObjectStore:
    def __init__(self, inner: ObjectStore, latency: Latency, seed: int = 0) -> None:
        self.inner = inner
        self.latency = latency
        self._rng = random.Random(seed)
        self.put_delays_s: list[float] = []

    async def _wait(self, span_ms: tuple[float, float]) -> float:
        delay = self._rng.uniform(*span_ms) / 1000
        await anyio.sleep(delay)
        return delay

    async def put(self, key: str, data: bytes | bytearray) -> None:
        self.put_delays_s.append(await self._wait(self.latency.put_ms))
        await self.inner.put(key, data)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        await self._wait(self.latency.get_ms)
        return await self.inner.get(key, offset, length)

    async def head(self, key: str) -> ObjectInfo | None:
        await self._wait(self.latency.get_ms)
        return await self.inner.head(key)

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        await self._wait(self.latency.get_ms)
        return await self.inner.list_page(prefix, start_after, limit)

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        await self._wait(self.latency.get_ms)
        return await self.inner.delete_many(keys)

    async def aclose(self) -> None:
        await self.inner.aclose()
