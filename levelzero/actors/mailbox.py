"""The primitives every partition actor uses: a bounded mailbox, a one-shot reply slot and a
wake-up flag, each as cheap as a wait can be, because a placeholder passes through all three.

Why not anyio's own: anyio's `send()` and `receive()` take a turn of the event loop on every
call, even when a message could be handed over at once, and an `anyio.Event` on asyncio is two
`asyncio.Event`s and three layers of calls per wait. A durable placeholder needs about four
waits; together they were the largest share of the event loop's time per placeholder. These
primitives wait on a bare future of the running loop (levelzero runs on asyncio or uvloop, both
through anyio), never take a turn they do not need, and keep anyio's behaviour where it matters:
cancellation through anyio's cancel scopes, `anyio.WouldBlock` / `anyio.BrokenResourceError` /
`anyio.EndOfStream` for the same situations.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar, cast

import anyio
import anyio.lowlevel

T = TypeVar("T")


def loop_time() -> float:
    """The running loop's clock: what `anyio.current_time()` returns on asyncio, without
    looking up the async backend on every call (it was 4% of the loop's time per placeholder)."""
    return asyncio.get_running_loop().time()


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():  # a cancelled waiter is done already
        waiter.set_result(None)


class Reply(Generic[T]):
    """A one-shot answer from an actor to the task that asked. The actor never waits on it.

    `wait()` on an answered reply returns without a turn of the event loop (a write is often
    answered on its sender's task, before the sender waits). Each waiter has its own future, so
    one waiter's cancellation is its own."""

    __slots__ = ("_waiters", "_answered", "_value", "_error")

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] | None = None
        self._answered = False
        self._value: T | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._answered

    def set(self, value: T) -> None:
        assert not self._answered, "reply answered twice"
        self._value = value
        # `_answer`, inline (a reply per placeholder): most often one waiter, or none yet
        self._answered = True
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            for waiter in waiters:
                if not waiter.done():  # `_wake`, inline: a cancelled waiter is done already
                    waiter.set_result(None)

    def fail(self, error: BaseException) -> None:
        assert not self._answered, "reply answered twice"
        self._error = error
        self._answer()

    def _answer(self) -> None:
        self._answered = True
        if self._waiters is not None:
            for waiter in self._waiters:
                _wake(waiter)
            self._waiters = None

    async def wait(self) -> T:
        if not self._answered:
            waiter = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = [waiter]
            else:
                self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if self._waiters is not None:  # cancelled before the answer: leave the list
                    self._waiters.remove(waiter)
                raise
        if self._error is not None:
            raise self._error
        return cast(T, self._value)  # answered without an error: the value given, a T


class Flag:
    """A one-way flag any number of tasks may wait on (`anyio.Event`'s use here, without the
    deque every asyncio.Event allocates: a node holds one per partition)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            _wake(waiter)

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if self._set:
            await anyio.lowlevel.checkpoint()
            return
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)


class Wakeup:
    """A flag one task waits on and others raise: level-triggered, so a raise while the task
    was busy is seen at its next `wait()`, which then returns without a turn of the loop."""

    __slots__ = ("_raised", "_waiter")

    def __init__(self) -> None:
        self._raised = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._raised = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():  # `_wake`, inline (raised per write)
            waiter.set_result(None)

    def is_set(self) -> bool:
        return self._raised

    def clear(self) -> None:
        self._raised = False

    async def wait(self) -> None:
        """Until raised (returns at once if it is); one waiter at a time."""
        if self._raised:
            return
        assert self._waiter is None, "a Wakeup has one waiter"
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class Mailbox(Generic[T]):
    """A bounded FIFO with one receiving actor and any number of senders.

    `send_nowait` raises `anyio.WouldBlock` when the mailbox is full; `send` waits for room
    (senders are let in first come, first served). `receive` takes a buffered message without a
    turn of the event loop; after `burst_max` of them in a row it yields once, so a mailbox that
    never empties cannot keep every other task waiting. `close()` (the receiver is done) makes
    every later send raise `anyio.BrokenResourceError` and returns what was never received, so
    the actor can answer it; a receive after that raises `anyio.EndOfStream`. `end()` is the
    senders' side of it: later sends raise `anyio.ClosedResourceError`, and the receiver takes
    what is buffered, then gets `anyio.EndOfStream`."""

    __slots__ = (
        "buffered",
        "_size",
        "_burst_max",
        "_in_a_row",
        "_receiver",
        "_senders",
        "_closed",
        "_ended",
    )

    def __init__(self, size: int, burst_max: int | None = None) -> None:
        assert 1 <= size < 1_000_000, size  # a named bound of the owning actor, never infinite
        # Deques only while in use: a receiver that waits on an empty mailbox drops them (an
        # idle actor's mailbox costs no deque; a node keeps an actor per partition). Read-only
        # outside: falsy when nothing is buffered (`not box.buffered` costs no call).
        self.buffered: deque[T] | tuple[()] = ()
        self._size = size
        self._burst_max = size if burst_max is None else burst_max
        assert self._burst_max >= 1, burst_max
        self._in_a_row = 0
        self._receiver: asyncio.Future[None] | None = None
        self._senders: deque[asyncio.Future[None]] | tuple[()] = ()
        self._closed = False
        self._ended = False

    def __len__(self) -> int:
        return len(self.buffered)

    def send_nowait(self, msg: T) -> None:
        if self._closed:
            raise anyio.BrokenResourceError
        if self._ended:
            raise anyio.ClosedResourceError
        if len(self.buffered) >= self._size or self._senders:  # nobody jumps the queue
            raise anyio.WouldBlock
        if not self.buffered:
            self.buffered = deque()
        self.buffered.append(msg)
        receiver = self._receiver
        if receiver is not None and not receiver.done():  # `_wake`, inline (per message)
            receiver.set_result(None)

    async def send(self, msg: T) -> None:
        """`send_nowait`, waiting for room when the mailbox is full."""
        let_in = False  # woken for a freed slot: first in line, whoever waits behind
        while True:
            if self._closed:
                raise anyio.BrokenResourceError
            if self._ended:
                raise anyio.ClosedResourceError
            if len(self.buffered) < self._size and (let_in or not self._senders):
                if not self.buffered:
                    self.buffered = deque()
                self.buffered.append(msg)
                _wake(self._receiver)
                return
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if not self._senders:
                self._senders = deque()
            if let_in:
                self._senders.appendleft(waiter)  # the slot was taken meanwhile: stay first
            else:
                self._senders.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter in self._senders:
                    self._senders.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._let_next_sender_in()  # let in, then cancelled: pass the slot on
                raise
            let_in = True

    async def receive(self) -> T:
        """The next message; raises `anyio.EndOfStream` once the mailbox is closed."""
        while True:
            if self.buffered:
                if self._in_a_row >= self._burst_max:
                    self._in_a_row = 0
                    await anyio.lowlevel.checkpoint()
                    continue
                self._in_a_row += 1
                msg = self.buffered.popleft()
                self._let_next_sender_in()
                return msg
            if self._closed or self._ended:
                raise anyio.EndOfStream
            self._in_a_row = 0
            self.buffered = ()  # empty: its deque goes while the actor waits
            if not self._senders:
                self._senders = ()
            assert self._receiver is None, "a Mailbox has one receiver"
            self._receiver = asyncio.get_running_loop().create_future()
            try:
                await self._receiver
            finally:
                self._receiver = None

    def receive_nowait(self) -> T:
        """The next buffered message; `anyio.WouldBlock` if there is none (`anyio.EndOfStream`
        once the senders ended)."""
        if not self.buffered:
            raise anyio.EndOfStream if self._ended else anyio.WouldBlock
        msg = self.buffered.popleft()
        if not self.buffered:
            self.buffered = ()
        self._let_next_sender_in()
        return msg

    def close(self) -> list[T]:
        """No more messages: wake everybody waiting; return the messages never received."""
        self._closed = True
        left = list(self.buffered)
        self.buffered = ()
        self._wake_everybody()
        return left

    def end(self) -> None:
        """The senders are done: what is buffered is still received, then `EndOfStream`."""
        self._ended = True
        self._wake_everybody()

    def _wake_everybody(self) -> None:
        """The receiver and every waiting sender (each sees why on waking)."""
        _wake(self._receiver)
        while self._senders:
            _wake(self._senders.popleft())

    def _let_next_sender_in(self) -> None:
        while self._senders and len(self.buffered) < self._size:
            waiter = self._senders.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
