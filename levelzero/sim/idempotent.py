"""Kafka idempotent producers in the simulation: sequence windows across crashes.

A few producers (deterministic producer ids, epoch 0) send batches of fresh records to
partitions of the first topic through the shipping produce intake (`actors.intake`, the one
intake Kafka's Produce API hands its record sets to): `prepare_producer`, then `submit` with the
batch's identity (producer id, epoch, topic, partition, base sequence), then the lane's answer.
Each producer keeps a window of `in_flight` batches (1..5, Kafka's limit): batch k is sent only
once every batch before k - in_flight is acknowledged (the Kafka client's rule, which the broker's
memory of five batches per producer and partition relies on). It retries a batch that got no
answer (a crash, a pause, a node that lost the partition, its request timeout), and a reply may
be lost after the batch was stored (the connection dropped): the retry repeats the batch exactly.
Every incarnation has its own intake, so a retry after a crash or on another node is recognised
only through the partition's state, which each term rebuilds from the snapshot and the log
(`PartitionState.producers`, applied from the placeholders' producer spans).

Checked:
- **no batch stored twice**: every durable placeholder's producer spans are looked at as they
  become durable; a batch identity durable a second time is a violation at once;
- **in order**: from its first stored batch on, a producer's batches are stored in sequence
  order (Kafka's guarantee; the intake refuses a batch that skips ahead);
- **none lost**: an acknowledged batch's offset holds a durable placeholder naming that batch,
  and its records join the acknowledged records the checks read back at the end (byte for byte);
- every batch is acknowledged before the quiet period may end (it counts as a produce in flight),
  or given up as a Kafka client does: refused as out of order (the intake stores a producer's
  batches in sequence order) while no earlier batch of its producer is on the wire.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any, Protocol

import anyio

from levelzero.actors.intake import Pending, ProduceIntake
from levelzero.actors.node import Node
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import LedElsewhere, LevelZeroError, OutOfOrderSequence
from levelzero.core.l0format import Record
from levelzero.core.producers import following_sequence

from .checks import Truth


class Incarnation(Protocol):
    """What the producers use of a node's incarnation (`world.Incarnation`): named here so
    that this module does not import the world that imports it."""

    node: Node
    intake: ProduceIntake | None
    alive: bool  # False from its crash on (a zombie until reaped)


class World(Protocol):
    """What the producers use of the world (`world.World`)."""

    seed: int
    phase: str
    stats: Any  # world.Stats: the writes' totals
    faults: Any  # faults.SeededFaults: `enabled`
    truth: Truth
    produces_in_flight: int

    @property
    def lives(self) -> dict[str | None, Any]: ...  # node id -> its live `Incarnation`

    def entry(self) -> Any: ...  # a live `Incarnation` a client enters at, or None

    def pid(self, topic: str, partition: int) -> int: ...

    def partition_name(self, pid: int) -> str: ...

    def note(self, text: str) -> None: ...

    def fail(self, invariant: str, message: str) -> None: ...


PRODUCER_ID_BASE = 7_000  # the simulated producers' ids: 7000, 7001, ...
PRODUCERS = (1, 3)  # how many idempotent producers a seed has
IN_FLIGHT = (1, 5)  # batches a producer keeps on the wire (Kafka: at most 5)
SEND_INTERVAL_S = 0.12  # mean, exponential
RECORDS_PER_BATCH_MAX = 3
REPLY_LOST_P = 0.1  # while faults run: a stored batch's answer never reaches the producer
RETRY_BACKOFF_S = 0.1  # Kafka's retry.backoff.ms
# A producer's request timeout, one drawn per producer: often shorter than a pause or a slow
# store, so a batch stored on a node whose reply is held up is sent again, often to another.
REQUEST_TIMEOUTS_S = (0.3, 1.0, 15.0)
REDIRECTS_MAX = 3


@dataclass(eq=False, slots=True)
class Batch:
    producer: int
    topic: str
    partition: int
    base_sequence: int
    records: list[Record]
    timeout_s: float
    attempts: int = 0


@dataclass(slots=True)
class IdempotentStats:
    batches_sent: int = 0
    batches_acked: int = 0
    retries: int = 0
    replies_lost: int = 0
    duplicates_answered: int = 0  # a retry answered with the offset of its stored batch
    batches_given_up: int = 0  # out of order with no earlier batch on the wire (a client's fatal error)


class IdempotentProducers:
    def __init__(self, world: World) -> None:
        self.world = world
        # A stream of its own: the rest of the world draws as it did.
        self.rng = random.Random(f"idempotent-{world.seed}")
        self.stats = IdempotentStats()
        # (pid, producer id, epoch, base sequence) -> data offset it is durable at
        self._durable: dict[tuple[int, int, int, int], int] = {}
        # (pid, producer id, epoch) -> the sequence its next durable batch must have
        self._next: dict[tuple[int, int, int], int] = {}

    # ------------------------------------------------------------------ the check at durability

    def on_durable(self, pid: int, records: list[LogRecord]) -> None:
        for record in records:
            entry = record.entry
            if not isinstance(entry, Placeholder):
                continue
            for span in entry.producers:
                key = (pid, span.producer_id, span.producer_epoch, span.base_sequence)
                offset = record.base_offset + span.first_record
                first = self._durable.setdefault(key, offset)
                if first != offset:
                    self.world.fail(
                        "idempotence",
                        f"{self.world.partition_name(pid)}: producer {span.producer_id} epoch "
                        f"{span.producer_epoch} batch {span.base_sequence} stored twice, at {first} "
                        f"and at {offset}",
                    )
                producer = (pid, span.producer_id, span.producer_epoch)
                expected = self._next.get(producer)
                if expected is not None and span.base_sequence != expected:
                    self.world.fail(
                        "idempotence",
                        f"{self.world.partition_name(pid)}: producer {span.producer_id} batch "
                        f"{span.base_sequence} stored at {offset}, out of order (after the batch "
                        f"ending before {expected})",
                    )
                self._next[producer] = following_sequence(span.base_sequence, span.record_count)

    # ------------------------------------------------------------------ the workload

    async def run(self, end: float) -> None:  # noqa: ARG002 - the loops' one signature
        world = self.world
        topics = [(t, n) for inc in world.lives.values() for t, n in inc.node.topics().items()]
        partitions = max((n for t, n in topics if t == "sim"), default=0)
        if partitions == 0:
            return
        async with anyio.create_task_group() as tg:
            for i in range(self.rng.randint(*PRODUCERS)):
                tg.start_soon(self._producer, PRODUCER_ID_BASE + i, self.rng.randrange(partitions))

    async def _producer(self, producer: int, partition: int) -> None:
        world = self.world
        window = _Window(self.rng.randint(*IN_FLIGHT))
        timeout_s = self.rng.choice(REQUEST_TIMEOUTS_S)
        sequence = 0
        async with anyio.create_task_group() as tg:
            while True:
                await asyncio.sleep(self.rng.expovariate(1.0 / SEND_INTERVAL_S))
                if world.phase == "quiet":
                    return  # (the batches on the wire are retried until acknowledged)
                index = await window.open()
                records = [
                    Record(key=None, value=f"i{world.seed}.{producer}.{sequence + i}".encode())
                    for i in range(self.rng.randint(1, RECORDS_PER_BATCH_MAX))
                ]
                batch = Batch(producer, "sim", partition, sequence, records, timeout_s)
                sequence += len(records)
                self.stats.batches_sent += 1
                world.stats.writes_submitted += 1  # (the world's totals count these writes too)
                world.produces_in_flight += 1
                tg.start_soon(self._send, batch, window, index)

    async def _send(self, batch: Batch, window: _Window, index: int) -> None:
        world = self.world
        try:
            while True:
                batch.attempts += 1
                inc = world.entry()
                offset = None
                if inc is not None and inc.intake is not None:
                    try:
                        offset = await self._attempt(inc, batch)
                    except OutOfOrderSequence:
                        self._refused_out_of_order(batch)
                        if index == window.oldest():
                            # No earlier batch to wait for: as a Kafka client, the producer
                            # gives this batch up (its application is told; nothing acknowledged).
                            self.stats.batches_given_up += 1
                            world.stats.writes_failed += 1
                            world.note(
                                f"idempotent {batch.producer}#{batch.base_sequence} given up: out of order"
                            )
                            return
                        world.note(f"idempotent {batch.producer}#{batch.base_sequence} out of order: retried")
                    except LevelZeroError as exc:
                        world.note(
                            f"{inc} idempotent {batch.producer}#{batch.base_sequence} to "
                            f"{batch.topic}/{batch.partition} failed: {type(exc).__name__}"
                        )
                if offset is not None:
                    if world.faults.enabled and self.rng.random() < REPLY_LOST_P:
                        self.stats.replies_lost += 1
                        world.note(f"idempotent {batch.producer}#{batch.base_sequence}: reply lost")
                    else:
                        self._acked(batch, offset)
                        return
                self.stats.retries += 1
                await asyncio.sleep(RETRY_BACKOFF_S)
        finally:
            world.produces_in_flight -= 1
            window.close(index)

    async def _attempt(self, inc: Incarnation, batch: Batch) -> int:
        """One produce of the batch through `inc`'s intake, following `LedElsewhere` to the
        leader it names (as a Kafka client refreshes its metadata). Its base offset."""
        world = self.world
        identity = (batch.producer, 0, batch.topic, batch.partition, batch.base_sequence)
        hops = 0
        while True:
            intake = inc.intake
            assert intake is not None
            try:
                with anyio.fail_after(batch.timeout_s):
                    offset = await self._produce(intake, batch, identity)
            except TimeoutError:
                raise _TimedOut(f"idempotent produce to {inc} timed out") from None
            except OutOfOrderSequence:
                if not inc.alive:
                    raise _Unanswered(f"{inc} crashed before it answered") from None
                raise
            except LedElsewhere as exc:
                leader = None
                if exc.leader_url is not None:
                    leader = world.lives.get(exc.leader_url.removeprefix("sim://"))
                if leader is None or hops == REDIRECTS_MAX:
                    raise
                hops += 1
                inc = leader
                continue
            if not inc.alive:
                # A crashed process answers nobody: what its tasks decide while they run on as
                # a zombie (until reaped) never reaches the client (judged from its state, which
                # stopped at the crash, a refusal would be a stale one).
                raise _Unanswered(f"{inc} crashed before it answered")
            return offset

    async def _produce(
        self, intake: ProduceIntake, batch: Batch, identity: tuple[int, int, str, int, int]
    ) -> int:
        await intake.prepare_producer(batch.producer, [(batch.topic, batch.partition)])
        outcome: Pending | int = intake.submit(batch.topic, batch.partition, batch.records, identity)
        if isinstance(outcome, int):
            if batch.attempts > 1:
                self.stats.duplicates_answered += 1
            return outcome
        await outcome.done.wait()
        if outcome.error is not None:
            raise outcome.error
        return outcome.base_offset

    def _refused_out_of_order(self, batch: Batch) -> None:
        """A batch already stored is a retry: it is answered with its offset, never refused.
        (Stored in sequence order, it is among its producer's last five stored batches: the
        producer's window keeps at most four later ones on the wire.)"""
        pid = self.world.pid(batch.topic, batch.partition)
        stored = self._durable.get((pid, batch.producer, 0, batch.base_sequence))
        if stored is not None:
            self.world.fail(
                "idempotence",
                f"{batch.topic}/{batch.partition}: producer {batch.producer} batch {batch.base_sequence}, "
                f"stored at {stored}, sent again and refused as out of order",
            )
        if self._next.get((pid, batch.producer, 0)) == batch.base_sequence:
            self.world.fail(
                "idempotence",
                f"{batch.topic}/{batch.partition}: producer {batch.producer} batch {batch.base_sequence} "
                "follows the last one stored, and was refused as out of order (the node's view of the "
                "producer is stale)",
            )

    def _acked(self, batch: Batch, offset: int) -> None:
        world = self.world
        pid = world.pid(batch.topic, batch.partition)
        durable = self._durable.get((pid, batch.producer, 0, batch.base_sequence))
        if durable != offset:
            world.fail(
                "idempotence",
                f"{batch.topic}/{batch.partition}: producer {batch.producer} batch "
                f"{batch.base_sequence} acknowledged at {offset} after {batch.attempts} attempts, "
                + ("never stored" if durable is None else f"stored at {durable}"),
            )
        record = world.truth.placeholder_at(pid, offset)
        assert record is not None and isinstance(record.entry, Placeholder)
        self.stats.batches_acked += 1
        world.stats.writes_acked += 1
        world.stats.records_acked += len(batch.records)
        world.note(
            f"idempotent {batch.producer}#{batch.base_sequence} acked {batch.topic}/{batch.partition}"
            f"@{offset} after {batch.attempts} attempts"
        )
        world.truth.ack(pid, offset, batch.records, record.entry.object_key)


class _Window:
    """A producer's batches on the wire by index: batch k goes out once every batch before
    k - size is acknowledged."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._next = 0
        self._unacked: set[int] = set()
        self._moved = anyio.Event()

    async def open(self) -> int:
        while self._unacked and self._next >= min(self._unacked) + self.size:
            await self._moved.wait()
        index = self._next
        self._next += 1
        self._unacked.add(index)
        return index

    def oldest(self) -> int:
        return min(self._unacked)

    def close(self, index: int) -> None:
        self._unacked.discard(index)
        self._moved.set()
        self._moved = anyio.Event()


class _TimedOut(LevelZeroError):
    """The producer gave up on one attempt (a node that died holds its request forever)."""


class _Unanswered(LevelZeroError):
    """The incarnation that took the attempt crashed before answering: no answer arrives."""
