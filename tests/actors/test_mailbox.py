"""The mailbox primitives: `send_soon` and `Inbox` skip the event-loop turn that anyio's
`send()` / `receive()` take on every call, and fall back to waiting when they must."""

from __future__ import annotations

import anyio
import pytest

from levelzero.actors.mailbox import Inbox, Reply, mailbox, send_soon


async def test_send_soon_does_not_yield_when_the_mailbox_has_room() -> None:
    tx, rx = mailbox(2)
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        await send_soon(tx, 1)
        await send_soon(tx, 2)
        assert ran == [], "a send with room took a turn of the event loop"
    assert ran == ["other"]
    assert [rx.receive_nowait(), rx.receive_nowait()] == [1, 2]


async def test_send_soon_waits_for_room_when_the_mailbox_is_full() -> None:
    tx, rx = mailbox(1)
    await send_soon(tx, "first")
    sent = anyio.Event()

    async def sender() -> None:
        await send_soon(tx, "second")
        sent.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sender)
            await anyio.wait_all_tasks_blocked()
            assert not sent.is_set()
            assert await rx.receive() == "first"
            await sent.wait()
    assert rx.receive_nowait() == "second"


async def test_inbox_takes_buffered_messages_at_once_and_yields_after_burst_max() -> None:
    tx, rx = mailbox(8)
    for i in range(5):
        tx.send_nowait(i)
    inbox = Inbox(rx, burst_max=2)
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        assert [await inbox.receive(), await inbox.receive()] == [0, 1]
        assert ran == [], "buffered messages took a turn of the event loop"
        assert await inbox.receive() == 2  # the burst is over: this one yields first
        assert ran == ["other"]
        assert [await inbox.receive(), await inbox.receive()] == [3, 4]


async def test_inbox_waits_for_a_message_and_ends_with_the_stream() -> None:
    tx, rx = mailbox(0)
    inbox = Inbox(rx, burst_max=4)

    async def reply_later(reply: Reply[int]) -> None:
        await send_soon(tx, reply)
        await tx.aclose()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            reply: Reply[int] = Reply()
            tg.start_soon(reply_later, reply)
            assert await inbox.receive() is reply
            with pytest.raises(anyio.EndOfStream):
                await inbox.receive()


async def test_an_answered_reply_is_taken_without_a_turn_of_the_event_loop() -> None:
    ran: list[str] = []

    async def other() -> None:
        ran.append("other")

    answered: Reply[int] = Reply()
    answered.set(7)
    failed: Reply[int] = Reply()
    failed.fail(ValueError("no"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        assert await answered.wait() == 7
        with pytest.raises(ValueError, match="no"):
            await failed.wait()
        assert ran == [], "an answered reply took a turn of the event loop"
    assert ran == ["other"] and answered.done and failed.done


async def test_waiters_before_the_answer_all_get_it_and_a_second_answer_is_a_bug() -> None:
    reply: Reply[str] = Reply()
    got: list[str] = []

    async def waiter() -> None:
        got.append(await reply.wait())

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert got == [] and not reply.done
            reply.set("yes")
    assert got == ["yes", "yes"]
    with pytest.raises(AssertionError, match="answered twice"):
        reply.fail(RuntimeError("late"))
