"""The control plane's wire in the simulation (levelzero/sim/faults.py `Wire`): a request once
sent lands whatever becomes of its sender, so a killed node's late requests reach the control
plane after its next run registered, where they must change nothing."""

from __future__ import annotations

import random

import anyio

from levelzero.sim.faults import Gate, Gates, Link, Wire
from levelzero.sim.loop import run_deterministic


class Store:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    async def release(self, name: str) -> str:
        self.calls.append((name, anyio.current_time()))
        return f"released {name}"


def test_a_request_lands_though_its_sender_gave_up_or_died_on_the_way() -> None:
    landed: list[str] = []
    sent: list[str] = []

    async def main() -> tuple[list[tuple[str, float]], Link]:
        store = Store()
        gate = Gate()

        async def latency(call: str) -> None:
            await anyio.sleep(1.0)

        async def held() -> None:
            await anyio.sleep(5.0)  # a dead sender's request lands 5 s after its latency

        async with anyio.create_task_group() as tg:
            link = Link(
                store,
                Gates(gate, Gate()),
                latency,
                named=True,
                wire=Wire(tg, sent.append, held, landed.append),
            )
            assert await link.release("answered") == "released answered"  # at t = 1
            with anyio.move_on_after(0.5):  # the caller gives up at t = 1.5 ...
                await link.release("timed out")
            # ... the request still lands at t = 2, though nobody waits for it
            await anyio.sleep(1.0)
            assert [n for n, _ in store.calls] == ["answered", "timed out"]

            async def killed() -> None:
                await link.release("killed")

            tg.start_soon(killed)
            await anyio.sleep(0.5)
            gate.close()  # the process dies at t = 3 with its request on the wire
            await anyio.sleep(10.0)
            tg.cancel_scope.cancel()  # the dead sender's task waits for a reply forever
        return store.calls, link

    calls, link = run_deterministic(main(), random.Random(0))
    assert calls == [("answered", 1.0), ("timed out", 2.0), ("killed", 8.5)]  # 2.5 + 1 + 5
    assert link.late == 1
    assert sent == ["release"] * 3 and landed == ["release"] * 3


def test_a_dead_process_sends_nothing_and_a_paused_link_holds_requests_until_its_resume() -> None:
    async def main() -> list[tuple[str, float]]:
        store = Store()
        gate, control_gate = Gate(), Gate()

        async def latency(call: str) -> None:
            await anyio.sleep(0.1)

        async def held() -> None:
            pass

        async with anyio.create_task_group() as tg:
            link = Link(
                store,
                Gates(gate, control_gate),
                latency,
                named=True,
                wire=Wire(tg, lambda _: None, held, lambda _: None),
            )
            control_gate.pause()

            async def resume() -> None:
                await anyio.sleep(2.0)
                control_gate.resume()

            tg.start_soon(resume)
            assert await link.release("paused") == "released paused"  # lands at the resume
            gate.close()
            with anyio.move_on_after(3.0):
                await link.release("after death")  # never sent
        return store.calls

    assert run_deterministic(main(), random.Random(0)) == [("paused", 2.0)]
