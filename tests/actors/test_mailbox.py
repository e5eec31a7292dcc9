"""The partition actor's primitives: `Mailbox`, `Reply` and `Wakeup` never take a turn of the
event loop they do not need, wait when they must, and stay correct under cancellation."""

from __future__ import annotations

import anyio
import pytest

from levelzero.actors.mailbox import Mailbox, Reply, Wakeup
from levelzero.testing.virtual_time import in_virtual_time


async def _other_ran(ran: list[str]) -> None:
    ran.append("other")


@in_virtual_time
async def test_send_with_room_does_not_yield() -> None:
    box: Mailbox[int] = Mailbox(2)
    ran: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_other_ran, ran)
        await box.send(1)
        box.send_nowait(2)
        assert ran == [], "a send with room took a turn of the event loop"
        with pytest.raises(anyio.WouldBlock):
            box.send_nowait(3)
    assert [await box.receive(), await box.receive()] == [1, 2]


@in_virtual_time
async def test_senders_wait_for_room_and_are_let_in_first_come_first_served() -> None:
    box: Mailbox[str] = Mailbox(1)
    await box.send("first")
    order: list[str] = []

    async def sender(name: str) -> None:
        await box.send(name)
        order.append(name)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sender, "second")
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(sender, "third")
            await anyio.wait_all_tasks_blocked()
            assert order == []
            with pytest.raises(anyio.WouldBlock):  # nobody jumps the queue
                box.send_nowait("jumper")
            assert [await box.receive() for _ in range(3)] == ["first", "second", "third"]
    assert order == ["second", "third"]


@in_virtual_time
async def test_a_cancelled_sender_leaves_the_line_and_the_next_gets_the_slot() -> None:
    box: Mailbox[str] = Mailbox(1)
    await box.send("first")
    impatient = anyio.CancelScope()

    async def impatient_sender() -> None:
        with impatient:
            await box.send("impatient")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(impatient_sender)
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(box.send, "patient")
            await anyio.wait_all_tasks_blocked()
            impatient.cancel()
            await anyio.wait_all_tasks_blocked()
            assert [await box.receive(), await box.receive()] == ["first", "patient"]
    assert impatient.cancelled_caught
    assert len(box) == 0


@in_virtual_time
async def test_receive_takes_buffered_messages_at_once_and_yields_after_burst_max() -> None:
    box: Mailbox[int] = Mailbox(8, burst_max=2)
    for i in range(5):
        box.send_nowait(i)
    ran: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_other_ran, ran)
        assert [await box.receive(), await box.receive()] == [0, 1]
        assert ran == [], "buffered messages took a turn of the event loop"
        assert await box.receive() == 2  # the burst is over: this one yields first
        assert ran == ["other"]
        assert [await box.receive(), await box.receive()] == [3, 4]


@in_virtual_time
async def test_receive_waits_for_a_message() -> None:
    box: Mailbox[str] = Mailbox(4)

    async def send_later() -> None:
        await anyio.sleep(0.01)
        await box.send("late")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(send_later)
            assert await box.receive() == "late"


@in_virtual_time
async def test_close_returns_the_unreceived_and_refuses_later_sends() -> None:
    box: Mailbox[int] = Mailbox(1)
    box.send_nowait(1)
    refused: list[BaseException] = []

    async def blocked_sender() -> None:
        try:
            await box.send(2)
        except anyio.BrokenResourceError as error:
            refused.append(error)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocked_sender)
            await anyio.wait_all_tasks_blocked()
            assert box.close() == [1]
    assert len(refused) == 1, "a sender waiting for room was left hanging"
    with pytest.raises(anyio.BrokenResourceError):
        box.send_nowait(3)
    with pytest.raises(anyio.EndOfStream):
        await box.receive()


@in_virtual_time
async def test_a_waiting_receiver_ends_when_the_mailbox_closes() -> None:
    box: Mailbox[int] = Mailbox(1)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def receiver() -> None:
                with pytest.raises(anyio.EndOfStream):
                    await box.receive()

            tg.start_soon(receiver)
            await anyio.wait_all_tasks_blocked()
            box.close()


@in_virtual_time
async def test_an_answered_reply_is_taken_without_a_turn_of_the_event_loop() -> None:
    ran: list[str] = []
    answered: Reply[int] = Reply()
    answered.set(7)
    failed: Reply[int] = Reply()
    failed.fail(ValueError("no"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(_other_ran, ran)
        assert await answered.wait() == 7
        with pytest.raises(ValueError, match="no"):
            await failed.wait()
        assert ran == [], "an answered reply took a turn of the event loop"
    assert ran == ["other"] and answered.done and failed.done


async def _wait_into(reply: Reply[str], got: list[str]) -> None:
    got.append(await reply.wait())


@in_virtual_time
async def test_waiters_before_the_answer_all_get_it_and_a_second_answer_is_a_bug() -> None:
    reply: Reply[str] = Reply()
    got: list[str] = []

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_wait_into, reply, got)
            tg.start_soon(_wait_into, reply, got)
            await anyio.wait_all_tasks_blocked()
            assert got == [] and not reply.done
            reply.set("yes")
    assert got == ["yes", "yes"]
    with pytest.raises(AssertionError, match="answered twice"):
        reply.fail(RuntimeError("late"))


@in_virtual_time
async def test_one_cancelled_waiter_does_not_cancel_the_others() -> None:
    reply: Reply[str] = Reply()
    got: list[str] = []

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            with anyio.move_on_after(0.01):
                async with anyio.create_task_group() as doomed:
                    doomed.start_soon(_wait_into, reply, got)
                    await anyio.sleep(1)
            tg.start_soon(_wait_into, reply, got)
            await anyio.wait_all_tasks_blocked()
            reply.set("kept")  # answering after a waiter was cancelled is fine
    assert got == ["kept"]


@in_virtual_time
async def test_wakeup_is_level_triggered() -> None:
    wakeup = Wakeup()
    ran: list[str] = []
    wakeup.set()
    async with anyio.create_task_group() as tg:
        tg.start_soon(_other_ran, ran)
        await wakeup.wait()  # raised while nobody waited: returns at once
        assert ran == []
    wakeup.clear()
    assert not wakeup.is_set()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def raise_later() -> None:
                await anyio.sleep(0.01)
                wakeup.set()

            tg.start_soon(raise_later)
            await wakeup.wait()
    with anyio.move_on_after(0.01) as scope:  # a wait can be cancelled, and waited on again
        wakeup.clear()
        await wakeup.wait()
    assert scope.cancelled_caught
    wakeup.set()
    await wakeup.wait()


@in_virtual_time
async def test_after_the_senders_end_what_is_buffered_is_received_then_end_of_stream() -> None:
    """`end()` is the senders' close (the batcher's shutdown): nothing buffered is lost, a
    waiting receiver and a waiting sender are woken, later sends are refused."""
    box: Mailbox[str] = Mailbox(1)
    box.send_nowait("buffered")
    refused: list[type[BaseException]] = []

    async def blocked_sender() -> None:
        try:
            await box.send("too late")
        except anyio.ClosedResourceError as error:
            refused.append(type(error))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(blocked_sender)
            await anyio.wait_all_tasks_blocked()
            box.end()
        assert refused == [anyio.ClosedResourceError]
        with pytest.raises(anyio.ClosedResourceError):
            box.send_nowait("later")
        assert box.receive_nowait() == "buffered"
        with pytest.raises(anyio.EndOfStream):
            box.receive_nowait()
        with pytest.raises(anyio.EndOfStream):
            await box.receive()

    waiting: Mailbox[str] = Mailbox(1)
    ended: list[str] = []

    async def receiver() -> None:
        try:
            await waiting.receive()
        except anyio.EndOfStream:
            ended.append("end of stream")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(receiver)
            await anyio.wait_all_tasks_blocked()
            waiting.end()
    assert ended == ["end of stream"]
