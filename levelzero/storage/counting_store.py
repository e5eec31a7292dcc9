"""An `ObjectStore` wrapper that counts requests and bytes by class, at the object-store boundary:
what a user of S3 is billed for (requests by type, bytes stored).

Classes follow the keys the daemon writes: L0 objects (`level_zero/`), L1 objects
(`level_one/`), anything else (topic records, the ownership marker). A `put` is one request (the
adapter uploads in one PutObject: no multipart parts); a `get` is one GetObject whether whole or
ranged; a `list_page` one ListObjectsV2; a `delete_many` one DeleteObjects whatever the number
of keys. `snapshot()` returns an immutable copy; the difference of two snapshots is the cost of
what ran between them. Requests made inside `role(name)` are also counted apart under that name
(a reader's, beside the reconciler's running at the same time).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields

from levelzero.core.keys import L0_ROOT, L1_ROOT
from levelzero.storage.protocols import LIST_PAGE_KEYS_MAX, DeleteResult, ListPage, ObjectInfo, ObjectStore


@dataclass(frozen=True, slots=True)
class RequestCounts:
    """Requests and bytes by class; `-` gives the counts between two snapshots."""

    l0_puts: int = 0
    l0_put_bytes: int = 0
    l1_puts: int = 0
    l1_put_bytes: int = 0
    other_puts: int = 0
    other_put_bytes: int = 0
    l0_gets: int = 0
    l0_get_bytes: int = 0
    l1_gets: int = 0
    l1_get_bytes: int = 0
    other_gets: int = 0
    other_get_bytes: int = 0
    heads: int = 0
    lists: int = 0
    listed_keys: int = 0
    delete_requests: int = 0
    deleted_keys: int = 0

    def __sub__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def puts(self) -> int:
        return self.l0_puts + self.l1_puts + self.other_puts

    @property
    def gets(self) -> int:
        return self.l0_gets + self.l1_gets + self.other_gets


def key_class(key: str) -> str:
    """ "l0", "l1" or "other", from the key's root."""
    if key.startswith(L0_ROOT):
        return "l0"
    if key.startswith(L1_ROOT):
        return "l1"
    return "other"


# Who a request is counted for: set around a caller's requests with `CountingObjectStore.role`.
# A context variable, so it follows the caller's own task (and the calls it awaits) and no
# other: the node's background tasks (reconciler, GC) were started in contexts without it.
_ROLE: ContextVar[str] = ContextVar("levelzero_counting_role", default="")


class CountingObjectStore:
    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self._counts: dict[str, dict[str, int]] = {}

    @staticmethod
    @contextmanager
    def role(name: str) -> Iterator[None]:
        """Count the requests this task makes meanwhile under `name` (see `snapshot`)."""
        token = _ROLE.set(name)
        try:
            yield
        finally:
            _ROLE.reset(token)

    def snapshot(self, role: str | None = None) -> RequestCounts:
        """The counts so far: of every request, or of those made under `role` ("" for those
        made under none)."""
        if role is not None:
            return RequestCounts(**self._counts.get(role, {}))
        total = dict.fromkeys((f.name for f in fields(RequestCounts)), 0)
        for counts in self._counts.values():
            for name, value in counts.items():
                total[name] += value
        return RequestCounts(**total)

    def _add(self, name: str, value: int = 1) -> None:
        counts = self._counts.setdefault(_ROLE.get(), {})
        counts[name] = counts.get(name, 0) + value

    async def put(self, key: str, data: bytes | bytearray) -> None:
        cls = key_class(key)
        self._add(f"{cls}_puts")  # billed whether it succeeds or not
        await self.inner.put(key, data)
        self._add(f"{cls}_put_bytes", len(data))

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        cls = key_class(key)
        self._add(f"{cls}_gets")  # billed whether it succeeds or not
        data = await self.inner.get(key, offset, length)
        self._add(f"{cls}_get_bytes", len(data))
        return data

    async def head(self, key: str) -> ObjectInfo | None:
        self._add("heads")
        return await self.inner.head(key)

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        self._add("lists")
        page = await self.inner.list_page(prefix, start_after, limit)
        self._add("listed_keys", len(page.objects))
        return page

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        self._add("delete_requests")
        result = await self.inner.delete_many(keys)
        self._add("deleted_keys", len(result.deleted))
        return result

    async def aclose(self) -> None:
        await self.inner.aclose()


__all__ = ["CountingObjectStore", "RequestCounts", "key_class"]
