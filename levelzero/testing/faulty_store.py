"""An `ObjectStore` wrapper that injects seeded errors and latency, for crash and chaos tests.

Wraps any store (S3 included) so the real daemon can be attacked end to end. A failed `put` may
fail *after* its effect (the object exists, the caller was told it failed: a lost response);
`delete_many` fails keys individually, like a partial DeleteObjects. Enabled in the daemon only
through the `LEVELZERO_TEST_FAULTS` environment variable, e.g.
`error_rate=0.05,latency_ms=3,seed=7`, and announced loudly in the log.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import anyio

from levelzero.core.errors import InvalidInput, StorageError
from levelzero.storage.protocols import LIST_PAGE_KEYS_MAX, DeleteResult, ListPage, ObjectInfo, ObjectStore


@dataclass(frozen=True, slots=True)
class FaultSpec:
    error_rate: float = 0.0
    latency_ms: float = 0.0
    seed: int = 0

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """`error_rate=0.05,latency_ms=3,seed=7` (any subset)."""
        values: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, raw = part.partition("=")
            if not sep or name not in ("error_rate", "latency_ms", "seed"):
                raise InvalidInput(
                    f"fault spec {text!r}: expected name=value with names error_rate, latency_ms, seed"
                )
            try:
                values[name] = float(raw)
            except ValueError:
                raise InvalidInput(f"fault spec {text!r}: {name} must be a number") from None
        spec = cls(
            error_rate=values.get("error_rate", 0.0),
            latency_ms=values.get("latency_ms", 0.0),
            seed=int(values.get("seed", 0)),
        )
        if not 0.0 <= spec.error_rate < 1.0 or not 0.0 <= spec.latency_ms <= 10_000:
            raise InvalidInput(f"fault spec {text!r}: error_rate in [0, 1), latency_ms in [0, 10000]")
        return spec


class FaultyObjectStore:
    def __init__(self, inner: ObjectStore, spec: FaultSpec) -> None:
        self.inner = inner
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self.injected = 0
        self._delete_prefix: str | None = None
        self._delete_failures_per_key = 0
        self._delete_failed: dict[str, int] = {}

    def fail_deletes(self, prefix: str, times: int) -> None:
        """Scripted, on top of the seeded faults: each key under `prefix` is reported failed by
        its first `times` deletes (and kept), then deleted: a delete that fails N times."""
        assert times >= 1, times
        self._delete_prefix = prefix
        self._delete_failures_per_key = times
        self._delete_failed.clear()

    def _scripted_delete_failure(self, key: str) -> bool:
        if self._delete_prefix is None or not key.startswith(self._delete_prefix):
            return False
        failed = self._delete_failed.get(key, 0)
        if failed >= self._delete_failures_per_key:
            return False
        self._delete_failed[key] = failed + 1
        return True

    async def _before(self, op: str) -> None:
        if self.spec.latency_ms:
            await anyio.sleep(self._rng.uniform(0, self.spec.latency_ms) / 1000)
        if self._rng.random() < self.spec.error_rate:
            self.injected += 1
            raise StorageError(f"injected fault before {op}")

    def _after(self, op: str) -> None:
        if self._rng.random() < self.spec.error_rate:
            self.injected += 1
            raise StorageError(f"injected fault after {op} (the effect happened)")

    async def put(self, key: str, data: bytes | bytearray) -> None:
        await self._before("put")
        await self.inner.put(key, data)
        self._after("put")

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        await self._before("get")
        return await self.inner.get(key, offset, length)

    async def head(self, key: str) -> ObjectInfo | None:
        await self._before("head")
        return await self.inner.head(key)

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        await self._before("list")
        return await self.inner.list_page(prefix, start_after, limit)

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        await self._before("delete_many")
        failing = {k for k in keys if self._rng.random() < self.spec.error_rate}
        failing.update(k for k in keys if self._scripted_delete_failure(k))
        self.injected += len(failing)
        result = await self.inner.delete_many([k for k in keys if k not in failing])
        errors = dict(result.errors)
        errors.update({k: "InternalError: injected fault" for k in failing})
        return DeleteResult(deleted=result.deleted, errors=errors)

    async def aclose(self) -> None:
        await self.inner.aclose()
