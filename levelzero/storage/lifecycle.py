"""The closing half of a log store's lifecycle, the same for SQLite and PostgreSQL: a store runs
a writer task (in a task group it was given, or in one it owns when opened with `open`), and
closing it finishes every queued write, stops the writer, ends the owned task group, then
releases what the store holds (`_release`: files and lock, or the pool), even when stopping
failed."""

from __future__ import annotations

from types import TracebackType
from typing import Self

import anyio
import anyio.abc


class StoreLifecycle:
    """`async with store:` and `aclose()` for a store with `_stop_writer` and `_release`."""

    _closed: bool
    _owned_task_group: anyio.abc.TaskGroup | None

    async def _stop_writer(self) -> None:
        raise NotImplementedError

    async def _release(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Finish every queued write, stop the writer, then release the store (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            with anyio.CancelScope(shield=True):
                await self._stop_writer()
            if self._owned_task_group is not None:
                task_group, self._owned_task_group = self._owned_task_group, None
                await task_group.__aexit__(None, None, None)
        finally:
            with anyio.CancelScope(shield=True):
                await self._release()
