"""The two primitives every actor uses: a bounded mailbox and a one-shot reply slot."""

from __future__ import annotations

from typing import Generic, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

T = TypeVar("T")


class Reply(Generic[T]):
    """A one-shot answer from an actor to the task that asked. The actor never waits on it."""

    __slots__ = ("_event", "_value", "_error")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._value: T | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._event.is_set()

    def set(self, value: T) -> None:
        assert not self._event.is_set(), "reply answered twice"
        self._value = value
        self._event.set()

    def fail(self, error: BaseException) -> None:
        assert not self._event.is_set(), "reply answered twice"
        self._error = error
        self._event.set()

    async def wait(self) -> T:
        await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def mailbox(size: int) -> tuple[MemoryObjectSendStream, MemoryObjectReceiveStream]:
    """A bounded stream; `size` is the named bound of the owning actor (never infinite)."""
    assert 0 <= size < 1_000_000, size
    return anyio.create_memory_object_stream(size)
