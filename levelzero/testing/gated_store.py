"""An object store for tests of the read paths: counts requests (`CountingObjectStore`), keeps
every GET's range, and can hold GETs at a gate or fail the next few, so that a test decides
which reads are in flight at once and which of them fail."""

from __future__ import annotations

import anyio

from levelzero.core.errors import StorageError
from levelzero.storage.counting_store import CountingObjectStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import ObjectStore


class GatedStore(CountingObjectStore):
    """Counts GETs (and keeps their ranges in `ranges`); while `gate` is set, a GET waits for
    it; while `fail_next` is above zero, a GET (once through the gate) fails with an injected
    `StorageError` and counts it down. Over a fresh `MemoryObjectStore` unless given one."""

    def __init__(self, inner: ObjectStore | None = None) -> None:
        super().__init__(MemoryObjectStore() if inner is None else inner)
        self.gate: anyio.Event | None = None
        self.fail_next = 0
        self.ranges: list[tuple[str, int, int | None]] = []

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        self.ranges.append((key, offset, length))
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_next:
            self.fail_next -= 1
            raise StorageError("injected: the GET failed")
        return await super().get(key, offset, length)
