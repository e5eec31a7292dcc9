"""The primitives every actor uses: a bounded mailbox, a one-shot reply slot, and sending and
receiving without a trip through the event loop when the mailbox can answer at once.

anyio's `send()` and `receive()` checkpoint first, every call: a message that could be handed
over at once still costs the task a turn of the event loop. For an actor that answers in
microseconds that turn was a large share of a round trip; `send_soon` and `Inbox.receive` skip
it when the buffer has room (or a message), and wait the ordinary way when it has not.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

T = TypeVar("T")


class Reply(Generic[T]):
    """A one-shot answer from an actor to the task that asked. The actor never waits on it.

    The event is made only when somebody waits before the answer is there, and `wait()` on an
    answered reply returns without a trip through the event loop: the batcher hands a write to
    every partition of an object and then collects the replies, most of them answered by then."""

    __slots__ = ("_event", "_answered", "_value", "_error")

    def __init__(self) -> None:
        self._event: anyio.Event | None = None
        self._answered = False
        self._value: T | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._answered

    def set(self, value: T) -> None:
        assert not self._answered, "reply answered twice"
        self._value = value
        self._answer()

    def fail(self, error: BaseException) -> None:
        assert not self._answered, "reply answered twice"
        self._error = error
        self._answer()

    def _answer(self) -> None:
        self._answered = True
        if self._event is not None:
            self._event.set()

    async def wait(self) -> T:
        if not self._answered:
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def mailbox(size: int) -> tuple[MemoryObjectSendStream, MemoryObjectReceiveStream]:
    """A bounded stream; `size` is the named bound of the owning actor (never infinite)."""
    assert 0 <= size < 1_000_000, size
    return anyio.create_memory_object_stream(size)


async def send_soon(tx: MemoryObjectSendStream, msg: object) -> None:
    """`tx.send(msg)`, without its checkpoint when the mailbox has room. The sender yields at
    its next await anyway (a caller waits for its reply)."""
    try:
        tx.send_nowait(msg)
    except anyio.WouldBlock:
        await tx.send(msg)


class Inbox:
    """The receiving end of an actor's mailbox. Buffered messages are taken without a trip
    through the event loop; after `burst_max` of them in a row the actor yields once, so a
    mailbox that never empties cannot keep every other task waiting."""

    __slots__ = ("_rx", "_burst_max", "_in_a_row")

    def __init__(self, rx: MemoryObjectReceiveStream, burst_max: int) -> None:
        assert burst_max >= 1, burst_max
        self._rx = rx
        self._burst_max = burst_max
        self._in_a_row = 0

    async def receive(self) -> object:
        """The next message; raises `anyio.EndOfStream` once every sender closed."""
        if self._in_a_row < self._burst_max:
            try:
                msg = self._rx.receive_nowait()
            except anyio.WouldBlock:
                pass
            else:
                self._in_a_row += 1
                return msg
        self._in_a_row = 0
        return await self._rx.receive()
