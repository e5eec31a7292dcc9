"""The simulated world's storage: the shipping memory stores with seeded latency and faults,
and a gate per node incarnation that models a crash.

- `SeededFaults` is a `FaultPlan` of the memory object store: every operation waits a seeded
  latency (sometimes a slow one: a slow upload outlives window slides and GC rounds), fails
  before its effect or after it (a timeout: the object exists, the caller cannot tell), and a
  DeleteObjects request reports some of its keys failed (kept). `deleting` is told of every key
  a delete removes, before it goes: that is where invariant 1 is checked.
- `SimLogStore` is the memory log store with seeded latency; it tells the truth of every record
  that becomes durable (the ground truth the checks compare against).
- `Link` is one node incarnation's handle on the log store (and, in a cluster, on the control
  plane), through its `Gate`. A crash closes the gate: the process is gone, so nothing it sends
  to the database from then on arrives (its calls wait forever, until the world cancels the
  zombie). Object-store requests already on the wire still land: that is the zombie work of the
  old incarnation. A pause holds the gate shut for a while: what the node sent arrives late.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import anyio.abc
import msgspec

from levelzero.core.entries import LogRecord
from levelzero.core.errors import NotLeader, StorageError
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import FaultPlan, ObjectOp
from levelzero.storage.protocols import (
    Append,
    L1Row,
    L1State,
    MemoryTransactionStore,
    OnDurable,
    PartitionRow,
    ProducerBatchRow,
    TransactionRow,
    TxnRangeRow,
)

from .config import Range, SimConfig


class SeededFaults(FaultPlan):
    """Latency and failures of the object store, drawn from the world's `Random`."""

    def __init__(
        self,
        rng: random.Random,
        cfg: SimConfig,
        scale: float,
        deleting: Callable[[str], None],
        stored: Callable[[str], None],
    ) -> None:
        super().__init__()
        self.rng = rng
        self.cfg = cfg
        self.scale = scale  # the seed's fault intensity
        self.enabled = True  # off in the quiet period
        self.injected = 0
        self._deleting = deleting
        self._stored = stored

    def _chance(self, p: float) -> bool:
        if not self.enabled or self.rng.random() >= p * self.scale:
            return False
        self.injected += 1
        return True

    def _uniform(self, r: Range) -> float:
        return self.rng.uniform(r[0], r[1])

    def delay_s(self, op: ObjectOp, key: str | None) -> float:  # noqa: ARG002 - the store's fault hook
        cfg = self.cfg
        if op == "put" and self._chance(cfg.slow_put_p):
            return self._uniform(cfg.slow_put_s)
        if op == "get" and self._chance(cfg.slow_get_p):
            return self._uniform(cfg.slow_get_s)
        return self._uniform(cfg.object_op_s)

    def before(self, op: ObjectOp, key: str | None) -> None:  # noqa: ARG002 - the store's fault hook
        cfg = self.cfg
        p = {
            "put": cfg.put_error_p / 2,
            "get": cfg.get_error_p,
            "head": cfg.get_error_p,
            "list": cfg.list_error_p,
            "delete_many": cfg.delete_batch_error_p / 2,
        }[op]
        if self._chance(p):
            raise StorageError(f"injected {op} failure")

    def after(self, op: ObjectOp, key: str | None) -> None:
        cfg = self.cfg
        if op == "put":
            assert key is not None
            self._stored(key)
        p = {"put": cfg.put_error_p / 2, "delete_many": cfg.delete_batch_error_p / 2}.get(op, 0.0)
        if p and self._chance(p):
            raise StorageError(f"injected {op} timeout after its effect")

    def delete_error(self, key: str) -> str | None:
        if self._chance(self.cfg.delete_key_error_p):
            return "InternalError"
        self._deleting(key)
        return None


class SimLogStore(MemoryLogStore):
    """The memory log store with seeded latency. Durable records are reported to `durable`,
    L1 objects about to enter DELETE_STARTED to `delete_started`."""

    def __init__(
        self,
        rng: random.Random,
        cfg: SimConfig,
        durable: Callable[[int, list[LogRecord]], None],
        delete_started: Callable[[L1Row], None],
    ) -> None:
        super().__init__()
        self._rng = rng
        self._cfg = cfg
        self._durable = durable
        self._delete_started = delete_started
        self.slow_enabled = True
        # (producer id, topic, partition) -> its last batches, oldest first
        self.producer_rows: dict[tuple[int, str, int], list[ProducerBatchRow]] = {}

    async def latency(self) -> None:
        cfg = self._cfg
        if self.slow_enabled and self._rng.random() < cfg.slow_log_p:
            await asyncio.sleep(self._rng.uniform(*cfg.slow_log_s))
        else:
            await asyncio.sleep(self._rng.uniform(*cfg.log_op_s))

    # -- idempotent producers' last batches (the `ProducerBatchStore` role SQLite and
    # PostgreSQL have, in memory in insertion order: the daemon's intake keeps them durably, and
    # after a restart recognises a retry of a batch whose placeholder the log already dropped)

    async def record_producer_batches(self, rows: Sequence[ProducerBatchRow], keep: int) -> None:
        assert keep >= 1
        for row in rows:
            key = (row.producer_id, row.topic, row.partition)
            kept = [r for r in self.producer_rows.get(key, []) if r.base_sequence != row.base_sequence]
            self.producer_rows[key] = [*kept, row][-keep:]

    async def producer_batches(self, producer_id: int) -> list[ProducerBatchRow]:
        return [
            row
            for (pid, _, _), rows in sorted(self.producer_rows.items())
            if pid == producer_id
            for row in rows
        ]

    async def begin_term(self, pid: int, log_offset: int, base_offset: int, at_least: int = 0) -> LogRecord:
        record = await super().begin_term(pid, log_offset, base_offset, at_least)
        self._durable(pid, [record])
        return record

    async def append_many(
        self, appends: Sequence[Append], on_durable: OnDurable | None = None
    ) -> list[NotLeader | None]:
        # (`append` is `append_many` of one.) Durable records are reported before anyone is
        # told of them.
        def report(index: int, refusal: NotLeader | None) -> None:
            if refusal is None:
                self._durable(appends[index].pid, list(appends[index].records))
            if on_durable is not None:
                on_durable(index, refusal)

        return await super().append_many(appends, report)

    async def l1_transition(self, key: str, from_state: str, to_state: str, now: float) -> bool:
        await anyio.lowlevel.checkpoint()
        row = self.l1.get(key)
        if row is None or row.state != from_state:
            return False
        if to_state == L1State.DELETE_STARTED:
            self._delete_started(row)  # checked at the compare-and-set, nothing in between
        self.l1[key] = msgspec.structs.replace(row, state=to_state, updated_at=now)
        return True


class SimTxnLogStore(SimLogStore, MemoryTransactionStore):
    """`SimLogStore` with the control plane's transaction tables (the `TransactionStore` role
    SQLite and PostgreSQL have), for the seeds with transactional producers only: a store with
    the role changes what other actors do (the compactor reads the partitions' ranges).
    `stored` is told of every coordinator state as it becomes durable."""

    def __init__(
        self,
        rng: random.Random,
        cfg: SimConfig,
        durable: Callable[[int, list[LogRecord]], None],
        delete_started: Callable[[L1Row], None],
        stored: Callable[[TransactionRow], None],
    ) -> None:
        SimLogStore.__init__(self, rng, cfg, durable, delete_started)
        MemoryTransactionStore.__init__(self)
        self._stored = stored

    async def put_transaction(
        self, row: TransactionRow, opened: Sequence[TxnRangeRow] = (), closed: Sequence[TxnRangeRow] = ()
    ) -> None:
        await MemoryTransactionStore.put_transaction(self, row, opened, closed)
        self._stored(row)

    async def delete_topic(self, topic: str, now: float) -> list[PartitionRow]:
        rows = await SimLogStore.delete_topic(self, topic, now)
        self.forget_topic_ranges(topic)  # as the SQL stores' delete does, in its transaction
        return rows


# The methods that take no time in a simulation (event tables, reads of the catalog are still
# delayed: they are awaited by actors and reorder with everything else).
_UNDELAYED = frozenset({"aclose"})


class Gate:
    """What stands between one node incarnation and the database (log store and control plane).

    `close()` is its crash: nothing it sends from then on arrives (its calls wait forever, until
    the world cancels the zombie). `pause()` cuts it off until `resume()`: a stopped process or
    a network partition. A call sent meanwhile arrives at the resume, and a reply waits for it:
    whatever the node decided before the pause reaches the database after it, when another node
    may lead its partitions (the zombie the term check must fence).
    """

    def __init__(self) -> None:
        self.closed = False
        self._resumed: anyio.Event | None = None
        self.pauses = 0

    @property
    def paused(self) -> bool:
        return self._resumed is not None

    def close(self) -> None:
        self.closed = True

    def pause(self) -> None:
        assert self._resumed is None, "already paused"
        self._resumed = anyio.Event()
        self.pauses += 1

    def resume(self) -> None:
        resumed, self._resumed = self._resumed, None
        assert resumed is not None, "not paused"
        resumed.set()

    async def cross(self) -> None:
        while True:
            if self.closed:
                await anyio.sleep_forever()  # the process is gone: this never arrives
            if self._resumed is None:
                return
            await self._resumed.wait()

    async def arrive(self) -> None:
        """A request already sent: held while the link is paused, landing even if its sender
        has crashed since (what is on the wire is not recalled)."""
        while self._resumed is not None:
            await self._resumed.wait()


class Gates:
    """Two gates crossed in turn: a node's link to the control plane is cut by its crash or
    pause (the database's gate) and by a cut of the control plane alone."""

    def __init__(self, *gates: Gate) -> None:
        self._gates = gates

    @property
    def paused(self) -> bool:
        return any(g.paused for g in self._gates)

    @property
    def closed(self) -> bool:
        return any(g.closed for g in self._gates)

    async def cross(self) -> None:
        while True:
            for g in self._gates:
                await g.cross()
            if not self.paused:
                return

    async def arrive(self) -> None:
        while self.paused:
            for g in self._gates:
                await g.arrive()


@dataclass(slots=True)
class Wire:
    """The network between the nodes and the control plane: requests in flight belong to it,
    not to their sender (`tg`, the world's task group). `sent(call)` is told of each request as
    it leaves; `held()` returns when a request whose sender died on the way lands (a statement
    queued behind a row lock, a retransmission: it lands when it lands); `landed(call)` is told
    once a request has taken effect."""

    tg: anyio.abc.TaskGroup
    sent: Callable[[str], None]
    held: Callable[[], Awaitable[None]]
    landed: Callable[[str], None]


class Link:
    """One node incarnation's connection to a shared store (the `SimLogStore`, the memory
    control plane): every call takes the store's seeded latency and crosses the incarnation's
    `Gate` on the way there and back.

    With a `Wire` (the control plane's link has one) a call is a request on the network: once
    sent it lands after its latency whatever becomes of its sender. A request the node sent
    just before it was killed, or gave up waiting for (a timeout), still reaches the control
    plane, maybe after the node's next run registered: the late request of a previous
    incarnation, which must change nothing. Without a wire a call still in its latency when
    its node crashes never arrives (the log store's link: a zombie's late appends are drawn by
    pauses)."""

    def __init__(
        self,
        inner: Any,
        gate: Gate | Gates,
        latency: Callable[..., Awaitable[None]],
        *,
        named: bool = False,
        wire: Wire | None = None,
    ) -> None:
        self._inner = inner
        self._gate = gate
        self._latency = latency
        self._named = named  # `latency` takes the call's name
        self._wire = wire
        self.late = 0  # requests that landed after their sender died

    def __getattr__(self, attr: str) -> Any:
        target = getattr(self._inner, attr)
        if attr.startswith("_") or not callable(target):
            return target
        gate, latency, named, wire = self._gate, self._latency, self._named, self._wire

        if wire is not None and attr not in _UNDELAYED:

            async def call(*args: Any, **kwargs: Any) -> Any:
                if gate.closed:
                    await anyio.sleep_forever()  # the process is gone: it sends nothing
                landed = anyio.Event()
                outcome: list[tuple[bool, Any]] = []

                async def deliver() -> None:
                    try:
                        await latency(attr)
                        await gate.arrive()
                        if gate.closed:  # its sender died on the way
                            await wire.held()
                            self.late += 1
                        outcome.append((True, await target(*args, **kwargs)))
                        wire.landed(attr)
                    except Exception as error:  # noqa: BLE001 - handed to the caller
                        outcome.append((False, error))
                    finally:
                        landed.set()

                wire.tg.start_soon(deliver)
                wire.sent(attr)
                await landed.wait()
                if not outcome:  # the world stopped before it landed
                    await anyio.sleep_forever()
                if gate.paused:  # the reply waits for the resume
                    await gate.cross()
                ok, value = outcome[0]
                if not ok:
                    raise value
                return value

        else:

            async def call(*args: Any, **kwargs: Any) -> Any:
                if attr not in _UNDELAYED:
                    await (latency(attr) if named else latency())
                await gate.cross()
                result = await target(*args, **kwargs)
                if gate.paused:  # the reply waits for the resume (a crash alone loses no reply
                    await gate.cross()  # already sent: the zombie's work goes on)
                return result

        call.__name__ = attr
        setattr(self, attr, call)  # made once: the next lookup finds it without __getattr__
        return call
