"""An `ObjectStore` seen through a key prefix, so several levelzero clusters can share a bucket.

Every key the daemon uses (`level_zero/...`, `level_one/...`, the ownership marker) lives under
`prefix`; listings strip it again, so the GC's key parsing and ordering are unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from levelzero.core.errors import InvalidInput
from levelzero.storage.protocols import LIST_PAGE_KEYS_MAX, DeleteResult, ListPage, ObjectInfo, ObjectStore

_PREFIX_RE = re.compile(r"\A(?:[A-Za-z0-9._-]+/)+\Z")


def check_key_prefix(prefix: str) -> str:
    if prefix and (not _PREFIX_RE.match(prefix) or any(p in (".", "..") for p in prefix.split("/")[:-1])):
        raise InvalidInput(
            f"key prefix {prefix!r} must be path segments of letters, digits, '.', '_' or '-', "
            "each ending in '/' (e.g. 'clusters/east/')"
        )
    return prefix


class PrefixedObjectStore:
    def __init__(self, inner: ObjectStore, prefix: str) -> None:
        self.inner = inner
        self.prefix = check_key_prefix(prefix)

    def _strip(self, key: str) -> str:
        assert key.startswith(self.prefix), key
        return key[len(self.prefix) :]

    async def put(self, key: str, data: bytes | bytearray) -> None:
        await self.inner.put(self.prefix + key, data)

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        return await self.inner.get(self.prefix + key, offset, length)

    async def head(self, key: str) -> ObjectInfo | None:
        info = await self.inner.head(self.prefix + key)
        return None if info is None else ObjectInfo(self._strip(info.key), info.size, info.last_modified)

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        after = None if start_after is None else self.prefix + start_after
        page = await self.inner.list_page(self.prefix + prefix, after, limit)
        return ListPage(
            [ObjectInfo(self._strip(o.key), o.size, o.last_modified) for o in page.objects],
            None if page.next_start_after is None else self._strip(page.next_start_after),
        )

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        result = await self.inner.delete_many([self.prefix + k for k in keys])
        return DeleteResult(
            [self._strip(k) for k in result.deleted],
            {self._strip(k): v for k, v in result.errors.items()},
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
