"""Kafka transactions in the simulation (issues 35 and 36): transactional producers driving the
shipping transaction coordinator, and read_committed consumers checking what it promises.

In a share of single-node seeds (drawn from a stream of their own, so that every other seed runs
exactly as before) each incarnation of the node gets the shipping Kafka API (`kafka.handlers.
Handlers` over the node and its produce intake: the transaction coordinator, the Produce and
Fetch APIs, each partition's transaction index) with the coordinator's clock on the virtual wall
clock, and the world's log store gets the control plane's transaction tables (the
`TransactionStore` role, behind the incarnation's gate like the rest of the database). One or
two transactional producers send what a Kafka client sends, as kio requests handed to the
handlers (the one layer left out is the frame codec): InitProducerId with a transactional id,
AddPartitionsToTxn over 1-3 partitions of the first topic, transactional Produce batches (idempotent,
sequence per partition), EndTxn commit or abort. Around them: producer restarts (InitProducerId
again: the epoch bumps, the previous incarnation is fenced and its open transaction aborted),
produce requests given up while still queued (the restart races them), a producer stalled past its
transaction timeout (the coordinator aborts), crashes of the node right before EndTxn and right
after PREPARE_COMMIT/PREPARE_ABORT is durable (before the markers), on top of the world's
crashes and faults. In half of these seeds (a stream of their own) a client sends DeleteRecords,
often just past an unfinished transaction's first record or a recent marker. In half of them (a
stream of their own too) the producers write to a compacted topic of their own instead
(`cleanup.policy=compact`, a short `min.compaction.lag.ms`, a low `min.cleanable.dirty.ratio`),
keyed from a small key space, made and compacted as `compaction.py`'s topic is: the shipping
compactor's passes run under the transactions, aborts, crashes and faults, cleaning below the
last stable offset (no DeleteRecords there: Kafka refuses them on a compacted topic).

The truth is the partitions' durable logs: every placeholder of a partition a transaction touched
is decoded from its object as it becomes durable, so each transactional record is known with the
marker that ends it (the first marker of its producer after it in the partition: a commit, an
abort, or none yet). Checked:

- **read_committed** — a read_committed Fetch (from any offset, boundary offsets often), its
  aborted-transactions list applied as a Kafka consumer applies it, never delivers a record of
  an aborted transaction nor of one whose marker is not durable yet; the last stable offset it
  reports never passes the first record of an unfinished transaction, and never moves back;
- **progress** — a read_committed Fetch from an offset below the last stable offset it reports
  returns at least one batch (a record or a control batch) below it, so a consumer always
  advances to the last stable offset (an empty answer is fetched again at once, a few times:
  a read racing the reconciler or a transaction's end may answer nothing once). A compaction
  that cleaned away the commit marker just below an open transaction broke it;
- **outcome** — after the quiet period (every transaction ended: its producer's EndTxn, a
  restart or its timeout), a read_committed scan of each partition from its start offset
  delivers every record of every committed transaction and none of an aborted one (on a
  compacted topic, every key's latest committed record, and none of an aborted transaction);
  a transaction whose EndTxn was answered commit (abort) is committed (aborted);
- **4** — nothing is left open: no open range in the store, no transaction prepared, no
  record without its marker;
- **DeleteRecords** — the start offset it answers never passes the first record of a
  transaction whose marker is not durable (a restart completing it reads its range for the
  marker).
"""

from __future__ import annotations

import asyncio
import random
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import anyio.abc
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from levelzero.actors.intake import ProduceIntake
from levelzero.actors.node import Node, NodeConfig
from levelzero.core.entries import LogRecord, Placeholder
from levelzero.core.errors import LevelZeroError
from levelzero.core.l0format import Record, decode_extent
from levelzero.core.txn_marks import txn_kind
from levelzero.kafka import records as kr
from levelzero.kafka.handlers import Handlers
from levelzero.kafka.metadata import KafkaSettings
from levelzero.kafka.protocol import Request, make
from levelzero.kafka.transactions import (
    KIND_ABORT,
    KIND_COMMIT,
    KIND_DATA,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    read_committed_batches,
)
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import TransactionRow

from .compaction import create_topic, leaked_l1, with_compactor

SHARE = 0.2  # of single-node seeds (a transactional seed costs ~40% more CPU)
TOPIC = "sim"
PRODUCERS = (1, 2)
PARTITIONS_PER_TXN = (1, 3)
BATCHES_PER_TXN = (1, 4)
RECORDS_PER_BATCH = (1, 3)
COMMIT_P = 0.7
TIMEOUTS_MS = (1_500, 3_000, 8_000)  # one drawn per producer
REQUEST_TIMEOUTS_S = (0.4, 1.0, 3.0)  # one drawn per producer: often shorter than a slow store
TXN_INTERVAL_S = 0.15  # mean, exponential: between a producer's transactions
RESTART_P = 0.08  # a producer restarts in mid-transaction (InitProducerId again)
RESTART_IN_FLIGHT_P = 0.08  # ... with its batches still on the wire
STALL_P = 0.04  # ... or stalls past its transaction timeout before EndTxn
CRASH_BEFORE_END_P = 0.05  # the node crashes right before EndTxn is sent
CRASH_AFTER_PREPARE_P = 0.15  # ... or right after PREPARE_* is durable (before the markers)
BACKOFF_S = 0.1  # Kafka's retry.backoff.ms
END_ATTEMPTS_MAX = 6
READ_INTERVAL_S = 0.1
DELETE_RECORDS_SHARE = 0.5  # of transactional seeds (a stream of their own): a DeleteRecords client
DELETE_RECORDS_INTERVAL_S = 0.5  # mean, exponential: between its requests
READ_BYTES = 4096
PRODUCER_ID_SPACING = 1_000_000  # a node incarnation's producer ids begin at number * this
VALUE = "t{seed}.{producer}.{txn}.{k}"
# In a share of transactional seeds (a stream of their own) the producers write to a compacted
# topic of their own instead, keyed from a small key space.
COMPACTED_SHARE = 0.5
COMPACTED_TOPIC = "txc"
COMPACTED_KEY = "x{}"
# mean, exponential, one drawn per seed: a transaction kept open before EndTxn (a stream
# processor's commit interval), long enough that the reconciler and the compactor's passes
# reach just below it
COMPACTED_OPEN_S = (0.5, 2.0, 4.0)
PROGRESS_TRIES = 3  # an empty read_committed answer below its LSO is fetched again, at most so often

_REQUESTS: dict[tuple[int, int], tuple[Any, Any]] = {}


def read_committed_fetch(topic: str, partition: int, offset: int, max_bytes: int) -> dict[str, Any]:
    """The fields of a read_committed Fetch v11 of one partition at `offset`, answered at once
    (`make` them into `_schema(1, 11)`'s request class)."""
    _, module = _schema(1, 11)
    return dict(
        replica_id=-1,
        max_wait=0,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=1,
        session_id=0,
        session_epoch=-1,
        rack_id="",
        topics=(
            make(
                module.FetchTopic,
                topic=topic,
                partitions=(
                    make(
                        module.FetchPartition,
                        partition=partition,
                        current_leader_epoch=-1,
                        fetch_offset=offset,
                        log_start_offset=-1,
                        partition_max_bytes=max_bytes,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def _schema(api_key: int, version: int) -> tuple[Any, Any]:
    """(request class, its module) of a kio request schema."""
    found = _REQUESTS.get((api_key, version))
    if found is None:
        cls = load_request_schema(api_key, version)
        found = _REQUESTS[(api_key, version)] = (cls, sys.modules[cls.__module__])
    return found


def drawn(seed: int, nodes: int) -> bool:
    """Whether the seed has transactional producers (a stream of its own)."""
    return nodes == 1 and random.Random(f"transactions-{seed}").random() < SHARE


def compacted(seed: int) -> bool:
    """Whether a transactional seed's topic is compacted (a stream of its own)."""
    return random.Random(f"transactions-compacted-{seed}").random() < COMPACTED_SHARE


class Incarnation(Protocol):
    """What the workload uses of a node's incarnation (`world.Incarnation`): named here so that
    this module does not import the world that imports it."""

    number: int
    node: Node
    intake: ProduceIntake | None
    kafka: Any  # its `Handlers`, or None
    alive: bool
    tg: anyio.abc.TaskGroup | None


class World(Protocol):
    seed: int
    phase: str
    objects: MemoryObjectStore
    truth: Any  # checks.Truth: acknowledged records
    log_store: Any  # faults.SimLogStore (with the transaction tables here)
    produces_in_flight: int
    stats: Any  # world.Stats: the writes' totals

    @property
    def lives(self) -> Mapping[str | None, Any]: ...

    def entry(self) -> Any: ...

    def pid(self, topic: str, partition: int) -> int: ...

    def partition_name(self, pid: int) -> str: ...

    def wall(self) -> float: ...

    def note(self, text: str) -> None: ...

    def fail(self, invariant: str, message: str) -> None: ...

    async def crash(self, inc: Any) -> None: ...


@dataclass(slots=True)
class Run:
    """One transaction's records in one partition as the durable log holds them: from its
    producer's first record after its previous marker up to its marker (none yet: unfinished)."""

    producer_id: int
    offsets: list[int] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    outcome: int | None = None  # KIND_COMMIT or KIND_ABORT once its marker is durable
    marker: int = -1


@dataclass(slots=True)
class PartitionTruth:
    runs: list[Run] = field(default_factory=list)
    current: dict[int, Run] = field(default_factory=dict)  # producer id -> its unfinished run
    by_offset: dict[int, Run] = field(default_factory=dict)
    lso: int = -1  # the highest last stable offset a fetch reported

    def first_unfinished(self) -> int | None:
        return min((r.offsets[0] for r in self.current.values()), default=None)


@dataclass(slots=True)
class Txn:
    """One transaction as its producer saw it."""

    tid: str
    number: int
    producer_id: int
    epoch: int
    partitions: list[int]
    values: list[bytes] = field(default_factory=list)  # of the produce requests answered
    sent: int = 0  # records sent (each value is unique)
    answered: bool | None = None  # EndTxn answered: commit (True) or abort (False)


@dataclass(slots=True)
class TxnStats:
    transactions: int = 0
    committed: int = 0  # EndTxn commit answered
    aborted: int = 0  # EndTxn abort answered
    restarts: int = 0
    stalls: int = 0
    fenced: int = 0
    crashes: int = 0
    reads: int = 0
    records_read: int = 0
    aborted_skipped: int = 0  # records a read_committed consumer skipped (aborted list)
    deletes: int = 0  # DeleteRecords answered
    deletes_held: int = 0  # ... with the start offset held below the offset asked
    compacted: int = 0  # seeds whose transactional topic is compacted
    compactions: int = 0  # compaction passes accepted (of every topic) in those seeds
    refetched: int = 0  # empty read_committed answers below their LSO, fetched again


class TransactionSim:
    def __init__(self, world: World, enabled: bool) -> None:
        self.world = world
        self.enabled = enabled
        self.rng = random.Random(f"transactions-workload-{world.seed}")
        # DeleteRecords requests: a stream of their own, so the rest of the workload draws as
        # it did without them
        self.delete_rng = random.Random(f"transactions-delete-records-{world.seed}")
        self.deleting = enabled and self.delete_rng.random() < DELETE_RECORDS_SHARE
        # A compacted topic: a stream of its own too (its keys drawn from it as well)
        self.compacted_rng = crng = random.Random(f"transactions-compacted-{world.seed}")
        self.compacted = enabled and crng.random() < COMPACTED_SHARE  # as `compacted(seed)`
        # No DeleteRecords on the compacted topic: levelzero refuses them there, as Kafka does
        # (POLICY_VIOLATION: its cleanup.policy lacks `delete`)
        self.deleting = self.deleting and not self.compacted
        self.topic = COMPACTED_TOPIC if self.compacted else TOPIC
        self.stats = TxnStats(compacted=int(self.compacted))
        if self.compacted:
            self.keys = crng.choice((1, 2, 4, 8))
            self.partitions = crng.choice((1, 2, 3))
            self.topic_configs = {
                "cleanup.policy": "compact",
                "min.compaction.lag.ms": str(crng.choice((0, 0, 100))),
                "min.cleanable.dirty.ratio": str(crng.choice((0.01, 0.05, 0.2))),
            }
            self.compactor_interval_s = crng.choice((0.1, 0.2, 0.5))
            self.object_bytes_max = crng.choice((1024, 4096, 64 * 1024 * 1024))
            self.open_s = crng.choice(COMPACTED_OPEN_S)
        self.truth: dict[int, PartitionTruth] = {}  # pid -> what its durable log holds
        self.txns: list[Txn] = []
        self._producing = 0  # producers still running
        self._tg: anyio.abc.TaskGroup | None = None  # the workload's: requests on the wire

    # ------------------------------------------------------------------ the world's hooks

    def owns(self, topic: str) -> bool:
        """The compacted transactional topic: the world's own producers and readers leave it
        alone (its reads have gaps)."""
        return self.compacted and topic == COMPACTED_TOPIC

    def node_config(self, config: NodeConfig) -> NodeConfig:
        """The compactor's task on, for the compacted topic (as the compaction seeds' is: kept
        if the seed has one)."""
        if not self.compacted or config.compactor.enabled:
            return config
        return with_compactor(config, self.compactor_interval_s, self.object_bytes_max)

    def absorb(self, inc: Incarnation) -> None:
        if self.compacted:
            prefix = f"{COMPACTED_TOPIC}/"
            statuses = inc.node.compactor.partitions.items()
            self.stats.compactions += sum(c.passes for name, c in statuses if name.startswith(prefix))

    def on_incarnation(self, inc: Incarnation) -> None:
        """The shipping Kafka API on the incarnation (its producer ids its own, as a real
        node's are by its start time)."""
        if not self.enabled:
            return
        assert inc.intake is not None
        inc.intake._next_producer_id = inc.number * PRODUCER_ID_SPACING
        handlers = Handlers(inc.node, KafkaSettings("sim", 9092), inc.intake)
        handlers.transactions.clock = self.world.wall
        inc.kafka = handlers

    def on_transaction(self, row: TransactionRow) -> None:
        """A coordinator's state became durable: right after PREPARE_*, sometimes the node
        crashes (before the markers are written)."""
        if row.state in (PREPARE_COMMIT, PREPARE_ABORT) and self.rng.random() < CRASH_AFTER_PREPARE_P:
            self._crash(f"{row.transactional_id} {row.state} durable")

    def on_durable(self, pid: int, records: list[LogRecord]) -> None:
        truth = self.truth.get(pid)
        if truth is None:
            return  # no transaction touched it
        world = self.world
        for record in records:
            entry = record.entry
            if not isinstance(entry, Placeholder):
                continue
            stored = world.objects._objects.get(entry.object_key)
            if stored is None:
                continue  # (the leak and reachability checks speak of it)
            raw = stored[0][entry.byte_offset : entry.byte_offset + entry.byte_length]
            decoded = decode_extent(raw, entry.checksum, entry.record_count, entry.object_key)
            for i, r in enumerate(decoded):
                found = txn_kind(r.headers)
                if found is None:
                    continue
                producer_id, kind = found
                offset = record.base_offset + i
                if kind == KIND_DATA:
                    run = truth.current.get(producer_id)
                    if run is None:
                        run = truth.current[producer_id] = Run(producer_id)
                        truth.runs.append(run)
                    run.offsets.append(offset)
                    run.values.append(r.value or b"")
                    run.keys.append(r.key)
                    truth.by_offset[offset] = run
                else:
                    run = truth.current.pop(producer_id, None)
                    if run is not None:  # (else a second marker: harmless)
                        run.outcome, run.marker = kind, offset
                    world.note(
                        f"txn marker {'commit' if kind == KIND_COMMIT else 'abort'} of {producer_id} "
                        f"at {world.partition_name(pid)}@{offset}"
                    )

    def settled(self) -> bool:
        if not self.enabled:
            return True
        store = self.world.log_store
        return (
            self._producing == 0
            and not self._leaked()
            and not any(t.current for t in self.truth.values())
            and not any(not r.aborted for r in store._ranges.values())
            and not any(r.state in (PREPARE_COMMIT, PREPARE_ABORT) for r in store._transactions.values())
        )

    def _leaked(self) -> list[str]:
        return leaked_l1(self.world, COMPACTED_TOPIC, self.partitions) if self.compacted else []

    def leftovers(self) -> list[str]:
        if not self.enabled or self.settled():
            return []
        leaked = self._leaked()
        if leaked:
            return [f"{len(leaked)} L1 objects of {COMPACTED_TOPIC} leaked: {leaked[:5]}"]
        store = self.world.log_store
        open_ranges = [r for r in store._ranges.values() if not r.aborted]
        unfinished = {
            self.world.partition_name(pid): sorted(r.offsets[0] for r in t.current.values())
            for pid, t in self.truth.items()
            if t.current
        }
        return [
            f"transactions: {self._producing} producers running, open ranges {open_ranges}, "
            f"records without a marker from {unfinished}, coordinator states "
            f"{[(r.transactional_id, r.state) for r in store._transactions.values()]}"
        ]

    # ------------------------------------------------------------------ requests

    async def _call(
        self,
        api_key: int,
        version: int,
        timeout_s: float,
        order: tuple[anyio.Event | None, anyio.Event] | None = None,
        **body: Any,
    ) -> Any | None:
        """One request through a live node's Kafka API (None: no answer within `timeout_s`).
        `order`: a produce's (after, submitted), as the listener orders one connection's."""
        inc = self.world.entry()
        if inc is None or inc.kafka is None or inc.tg is None:
            return None
        cls, _ = _schema(api_key, version)
        request = Request(api_key, version, 0, "sim", make(cls, **body))
        answers: list[Any] = []
        answered = anyio.Event()

        async def serve() -> None:
            # In the incarnation's task group: a crash ends the request with the process (a
            # request the client gave up on goes on, as on a real node).
            try:
                answers.append(await inc.kafka.handle(request, *(order or ())))
            except LevelZeroError as exc:
                self.world.note(f"{inc} api {api_key} failed: {type(exc).__name__}")
            finally:
                answered.set()

        inc.tg.start_soon(serve)
        with anyio.move_on_after(timeout_s):
            await answered.wait()
        return answers[0] if answers else None

    # ------------------------------------------------------------------ the producers

    async def run(self, end: float) -> None:  # noqa: ARG002 - the loops' one signature
        if not self.enabled:
            return
        world = self.world
        if self.compacted and not await create_topic(
            world, self.topic, self.partitions, self.topic_configs, in_node=True
        ):
            return
        partitions = max(
            (n for inc in world.lives.values() for t, n in inc.node.topics().items() if t == self.topic),
            default=0,
        )
        if partitions == 0:
            return
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._reader)
            if self.deleting:
                tg.start_soon(self._deleter)
            for i in range(self.rng.randint(*PRODUCERS)):
                self._producing += 1
                tg.start_soon(self._producer, i, partitions)

    async def _producer(self, index: int, partitions: int) -> None:
        try:
            await self._produce_transactions(index, partitions)
        finally:
            self._producing -= 1

    async def _produce_transactions(self, index: int, partitions: int) -> None:
        world = self.world
        rng = self.rng
        tid = f"sim-txn-{index}"
        timeout_ms = rng.choice(TIMEOUTS_MS)
        request_s = rng.choice(REQUEST_TIMEOUTS_S)
        ident = (-1, -1)  # the producer id and epoch it holds (KIP-360 re-initialisation)
        ready = False
        number = 0
        while world.phase != "quiet":
            await asyncio.sleep(rng.expovariate(1.0 / TXN_INTERVAL_S))
            if not ready:
                got = await self._init(tid, timeout_ms, request_s, ident)
                if got is None:
                    continue
                ident, ready = got, True
                sequences: dict[int, int] = {}
            number += 1
            txn = Txn(
                tid,
                number,
                ident[0],
                ident[1],
                sorted(rng.sample(range(partitions), min(rng.randint(*PARTITIONS_PER_TXN), partitions))),
            )
            self.txns.append(txn)
            self.stats.transactions += 1
            for p in txn.partitions:
                self.truth.setdefault(world.pid(self.topic, p), PartitionTruth())
            code = await self._add_partitions(txn, request_s)
            if code != ErrorCode.none:
                ready = code not in (
                    ErrorCode.producer_fenced,
                    ErrorCode.invalid_producer_epoch,
                    ErrorCode.invalid_producer_id_mapping,
                )
                if ready:  # the transaction may be ongoing: end it (an abort)
                    ready = await self._end(txn, False, request_s)
                continue
            # The batches pipelined (a client keeps up to five requests on the wire), submitted
            # in order (as one connection's produce requests are); the producer waits for their
            # answers, or, sometimes, restarts at once with them still on the wire.
            answered: list[anyio.Event] = []
            results: list[bool] = []
            after: anyio.Event | None = None
            assert self._tg is not None
            for _ in range(rng.randint(*BATCHES_PER_TXN)):
                done, submitted = anyio.Event(), anyio.Event()
                answered.append(done)
                self._tg.start_soon(
                    self._produce,
                    txn,
                    rng.choice(txn.partitions),
                    sequences,
                    request_s,
                    after,
                    submitted,
                    done,
                    results,
                )
                after = submitted
            in_flight = rng.random() < RESTART_IN_FLIGHT_P
            if not in_flight:
                for done in answered:
                    await done.wait()
            if in_flight or not all(results) or rng.random() < RESTART_P:
                # The producer restarts (after a produce failed or went unanswered, or with its
                # batches on the wire): InitProducerId bumps the epoch, fences this one, and
                # aborts the transaction.
                self.stats.restarts += 1
                world.note(
                    f"{tid} restarts in transaction {number}"
                    + (" (batches on the wire)" if in_flight else "")
                )
                ready = False
                continue
            commit = rng.random() < COMMIT_P
            if world.phase == "faults" and rng.random() < STALL_P:
                self.stats.stalls += 1
                world.note(f"{tid} stalls past its transaction timeout")
                await asyncio.sleep(timeout_ms / 1000 + 1.5)
            if self.compacted:  # open a while (a stream processor's commit interval): passes run under it
                await asyncio.sleep(self.compacted_rng.expovariate(1.0 / self.open_s))
            if rng.random() < CRASH_BEFORE_END_P:
                self._crash(f"{tid} about to end transaction {number}")
            ready = await self._end(txn, commit, request_s)
        # The workload ends: a producer that last restarted (or gave up an ending) starts once
        # more, as its next run would, which aborts what it left open (else the coordinator's
        # timeout does, later).
        for _ in range(3 if number and not ready else 0):
            if await self._init(tid, timeout_ms, request_s, ident) is not None:
                break
            await asyncio.sleep(BACKOFF_S)

    async def _init(
        self, tid: str, timeout_ms: int, request_s: float, ident: tuple[int, int]
    ) -> tuple[int, int] | None:
        answer = await self._call(
            22,
            3,
            request_s,
            transactional_id=tid,
            transaction_timeout=timeout_ms,
            producer_id=ident[0],
            producer_epoch=ident[1],
        )
        if answer is None:
            return None
        if answer.error_code == ErrorCode.producer_fenced:
            self.stats.fenced += 1
            answer = await self._call(
                22,
                3,
                request_s,
                transactional_id=tid,
                transaction_timeout=timeout_ms,
                producer_id=-1,
                producer_epoch=-1,
            )
            if answer is None:
                return None
        if answer.error_code != ErrorCode.none:
            self.world.note(f"{tid} InitProducerId: {answer.error_code.name}")
            return None
        self.world.note(f"{tid} initialised: producer {answer.producer_id} epoch {answer.producer_epoch}")
        return int(answer.producer_id), int(answer.producer_epoch)

    async def _add_partitions(self, txn: Txn, request_s: float) -> ErrorCode:
        _, module = _schema(24, 3)
        while True:
            answer = await self._call(
                24,
                3,
                request_s,
                v3_and_below_transactional_id=txn.tid,
                v3_and_below_producer_id=txn.producer_id,
                v3_and_below_producer_epoch=txn.epoch,
                v3_and_below_topics=(
                    make(module.AddPartitionsToTxnTopic, name=self.topic, partitions=tuple(txn.partitions)),
                ),
            )
            if answer is None:
                return ErrorCode.request_timed_out
            codes = {
                p.partition_error_code
                for t in answer.results_by_topic_v3_and_below
                for p in t.results_by_partition
            }
            code = next(iter(codes)) if len(codes) == 1 else ErrorCode.unknown_server_error
            if code in (ErrorCode.concurrent_transactions, ErrorCode.coordinator_not_available):
                await asyncio.sleep(BACKOFF_S)
                if self.world.phase == "quiet":
                    return code
                continue
            return code

    async def _produce(
        self,
        txn: Txn,
        partition: int,
        sequences: dict[int, int],
        request_s: float,
        after: anyio.Event | None,
        submitted: anyio.Event,
        done: anyio.Event,
        results: list[bool],
    ) -> None:
        """One transactional batch, submitted once `after` is (then `submitted`); its result
        (acknowledged: True) in `results`, then `done`."""
        ok = False
        try:
            ok = await self._produce_batch(txn, partition, sequences, request_s, after, submitted)
        finally:
            submitted.set()
            results.append(ok)
            done.set()

    async def _produce_batch(
        self,
        txn: Txn,
        partition: int,
        sequences: dict[int, int],
        request_s: float,
        after: anyio.Event | None,
        submitted: anyio.Event,
    ) -> bool:
        world = self.world
        _, module = _schema(0, 8)
        count = self.rng.randint(*RECORDS_PER_BATCH)
        first = txn.sent
        txn.sent += count
        values = [
            VALUE.format(
                seed=world.seed, producer=txn.tid, txn=f"{txn.epoch}.{txn.number}", k=first + k
            ).encode()
            for k in range(count)
        ]
        keys: list[bytes | None] = [None] * count
        if self.compacted:
            keys = [COMPACTED_KEY.format(self.compacted_rng.randrange(self.keys)).encode() for _ in values]
        sequence = sequences.get(partition, 0)
        data = kr.encode_batch(
            0,
            [
                kr.KafkaRecord(k, int(world.wall() * 1000), key, v)
                for k, (key, v) in enumerate(zip(keys, values, strict=True))
            ],
            producer_id=txn.producer_id,
            producer_epoch=txn.epoch,
            base_sequence=sequence,
            attributes=kr.ATTR_TRANSACTIONAL,
        )
        sequences[partition] = sequence + count  # (a batch not answered ends this epoch)
        world.stats.writes_submitted += 1
        world.produces_in_flight += 1
        try:
            answer = await self._call(
                0,
                8,
                request_s,
                (after, submitted),
                transactional_id=txn.tid,
                acks=-1,
                timeout=30_000,
                topic_data=(
                    make(
                        module.TopicProduceData,
                        name=self.topic,
                        partition_data=(make(module.PartitionProduceData, index=partition, records=data),),
                    ),
                ),
            )
        finally:
            world.produces_in_flight -= 1
        if answer is None:
            world.stats.writes_failed += 1
            world.note(f"{txn.tid} produce to {self.topic}/{partition} unanswered")
            return False
        (result,) = answer.responses[0].partition_responses
        if result.error_code != ErrorCode.none:
            world.stats.writes_failed += 1
            world.note(f"{txn.tid} produce to {self.topic}/{partition}: {result.error_code.name}")
            return False
        pid = world.pid(self.topic, partition)
        offset = int(result.base_offset)
        placeholder = world.truth.placeholder_at(pid, offset)
        if placeholder is None:
            world.fail(
                "3",
                f"{txn.tid}: transactional records acknowledged at {self.topic}/{partition}@{offset}, "
                "not durable",
            )
        assert placeholder is not None and isinstance(placeholder.entry, Placeholder)
        world.stats.writes_acked += 1  # (the world's totals count these writes too)
        if not self.compacted:  # (a compacted topic's records go: its rules are the outcome's)
            world.truth.ack(pid, offset, [Record(None, v) for v in values], placeholder.entry.object_key)
            world.stats.records_acked += len(values)  # (each read back at the end)
        txn.values.extend(values)
        return True

    async def _end(self, txn: Txn, commit: bool, request_s: float) -> bool:
        """EndTxn until answered (the producer keeps its id and epoch: True), fenced, or given up
        (the coordinator's timeout aborts the transaction)."""
        for _ in range(END_ATTEMPTS_MAX):
            answer = await self._call(
                26,
                3,
                request_s,
                transactional_id=txn.tid,
                producer_id=txn.producer_id,
                producer_epoch=txn.epoch,
                committed=commit,
            )
            if answer is None or answer.error_code in (
                ErrorCode.coordinator_not_available,
                ErrorCode.concurrent_transactions,
            ):
                await asyncio.sleep(BACKOFF_S)
                continue
            if answer.error_code == ErrorCode.none:
                txn.answered = commit
                if commit:
                    self.stats.committed += 1
                else:
                    self.stats.aborted += 1
                self.world.note(f"{txn.tid} transaction {txn.number} {'committed' if commit else 'aborted'}")
                return True
            self.world.note(f"{txn.tid} EndTxn: {answer.error_code.name}")
            if answer.error_code in (ErrorCode.producer_fenced, ErrorCode.invalid_producer_epoch):
                self.stats.fenced += 1
            return False
        return False

    def _crash(self, why: str) -> None:
        world = self.world
        if world.phase != "faults":
            return
        inc = world.lives.get(None)
        if inc is None or inc.kafka is None or not inc.alive:
            return
        world.note(f"crash injected: {why}")
        self.stats.crashes += 1

        async def crash() -> None:
            if world.lives.get(None) is inc and inc is not None and inc.alive:
                await world.crash(inc)

        tg = world._tg  # type: ignore[attr-defined]
        assert tg is not None
        tg.start_soon(crash)

    # ------------------------------------------------------------------ the reads

    async def _reader(self) -> None:
        world = self.world
        while world.phase != "quiet":
            await asyncio.sleep(self.rng.expovariate(1.0 / READ_INTERVAL_S))
            if not self.truth:
                continue
            pid = self.rng.choice(sorted(self.truth))
            truth = self.truth[pid]
            state = world.truth.shadow.get(pid)
            if state is None:
                continue
            choices = [state.start_offset, state.high_watermark - 1, max(truth.lso, state.start_offset)]
            for run in truth.current.values():
                choices.append(run.offsets[0])
            if self.compacted:  # just below the LSO and the open transactions, where a pass cleans to
                choices.append(max(truth.lso - 1, state.start_offset))
                choices += [max(r.offsets[0] - 1, state.start_offset) for r in truth.current.values()]
            offset = (
                self.rng.choice(choices)
                if self.rng.random() < 0.6
                else self.rng.randint(state.start_offset, max(state.high_watermark - 1, state.start_offset))
            )
            await self._read(pid, max(offset, 0))

    async def _deleter(self) -> None:
        """DeleteRecords, often just past the first record of an unfinished transaction or
        just past a marker (a prepared transaction's, its completion perhaps not stored): the
        start offset never passes the first offset of a transaction open in the partition, so
        a restart completing it finds its records and marker (read_committed and the outcome
        checks speak of the rest)."""
        world, rng = self.world, self.delete_rng
        while world.phase != "quiet":
            await asyncio.sleep(rng.expovariate(1.0 / DELETE_RECORDS_INTERVAL_S))
            if not self.truth:
                continue
            pid = rng.choice(sorted(self.truth))
            truth = self.truth[pid]
            state = world.truth.shadow.get(pid)
            if state is None or state.high_watermark <= state.start_offset:
                continue
            choices = [r.offsets[0] + 1 for r in truth.current.values()]
            choices += [r.marker + 1 for r in truth.runs[-3:] if r.marker >= 0]
            if choices and rng.random() < 0.8:
                offset = rng.choice(choices)
            else:
                offset = rng.randint(state.start_offset, state.high_watermark)
            await self._delete(pid, min(offset, state.high_watermark))

    async def _delete(self, pid: int, offset: int) -> None:
        """One DeleteRecords, checked: the start offset it answers is never past the first
        record of a transaction whose marker is not durable (retention may have moved it past
        the offset asked; the world's retention check bounds it by the offsets asked)."""
        world = self.world
        row = world.log_store.partitions[pid]
        _, module = _schema(21, 2)
        first_unfinished = self.truth[pid].first_unfinished()
        below = world.truth.delete_records_below
        below[pid] = max(below.get(pid, 0), offset)
        answer = await self._call(
            21,
            2,
            5.0,
            timeout=5000,
            topics=(
                make(
                    module.DeleteRecordsTopic,
                    name=row.topic,
                    partitions=(
                        make(module.DeleteRecordsPartition, partition_index=row.partition, offset=offset),
                    ),
                ),
            ),
        )
        if answer is None:
            return
        (result,) = answer.topics[0].partitions
        if result.error_code != ErrorCode.none:
            return
        self.stats.deletes += 1
        low = int(result.low_watermark)
        name = world.partition_name(pid)
        world.note(f"DeleteRecords {name} below {offset}: the start offset {low}")
        if low < offset:
            self.stats.deletes_held += 1
        unfinished = self.truth[pid].first_unfinished()
        if first_unfinished is not None and unfinished == first_unfinished and low > first_unfinished:
            world.fail(
                "txn",
                f"{name}: DeleteRecords moved the start offset to {low}, past {first_unfinished}, "
                "a record of a transaction whose marker is not durable",
            )

    async def _read(self, pid: int, offset: int) -> tuple[int, int, list[bytes]] | ErrorCode | None:
        """One read_committed Fetch at `offset`, checked: (next offset, last stable offset,
        the transactional values delivered), the error it answered, or None (no answer).
        The progress rule: an answer from below the last stable offset it reports holds a batch
        below it. An empty one is fetched again at once, a few times (a read of L0 the
        reconciler overtook, or a transaction ending during the fetch, answers nothing once)."""
        for _ in range(PROGRESS_TRIES):
            got = await self._read_once(pid, offset)
            if not isinstance(got, tuple):
                return got
            next_offset, lso, start, delivered = got
            if next_offset > offset or offset >= lso or offset < start:
                return next_offset, lso, delivered
            self.stats.refetched += 1
            self.world.note(
                f"read_committed {self.world.partition_name(pid)}@{offset}: nothing below LSO {lso}"
            )
        self.world.fail(
            "txn",
            f"progress: {self.world.partition_name(pid)}: a read_committed fetch at {offset} answers "
            f"no record below the last stable offset {lso} it reports ({PROGRESS_TRIES} tries): a "
            "consumer there never reaches it",
        )
        raise AssertionError  # (fail raised)

    async def _read_once(self, pid: int, offset: int) -> tuple[int, int, int, list[bytes]] | ErrorCode | None:
        """One read_committed Fetch at `offset`, checked: (next offset, last stable offset, log
        start offset, the transactional values delivered), the error it answered, or None."""
        world = self.world
        row = world.log_store.partitions[pid]
        fields = read_committed_fetch(row.topic, row.partition, offset, READ_BYTES)
        answer = await self._call(1, 11, 5.0, **fields)
        if answer is None:
            return None
        (data,) = answer.responses[0].partitions
        if data.error_code != ErrorCode.none:
            return ErrorCode(data.error_code)
        self.stats.reads += 1
        name = world.partition_name(pid)
        truth = self.truth[pid]
        lso = int(data.last_stable_offset)
        if lso < truth.lso:
            world.fail("txn", f"{name}: the last stable offset moved back from {truth.lso} to {lso}")
        truth.lso = lso
        unfinished = truth.first_unfinished()
        if unfinished is not None and lso > unfinished:
            world.fail(
                "txn",
                f"{name}: last stable offset {lso} passes {unfinished}, a record of a transaction "
                "whose marker is not durable",
            )
        listed = sorted((int(a.first_offset), int(a.producer_id)) for a in data.aborted_transactions or ())
        delivered: list[bytes] = []
        next_offset = offset
        batches = kr.decode_batches(data.records or b"")
        for batch, skipped in read_committed_batches(batches, ((p, f) for f, p in listed)):
            next_offset = max(next_offset, batch.base_offset + batch.last_offset_delta + 1)
            if batch.is_control or not batch.is_transactional:
                continue
            if skipped:
                self.stats.aborted_skipped += len(batch.records)
                continue
            for r in batch.records:
                assert isinstance(r, kr.KafkaRecord)  # (decoded as a client reads them)
                at = batch.base_offset + r.offset_delta
                if at < offset:
                    continue
                run = truth.by_offset.get(at)
                if run is None:
                    world.fail(
                        "txn",
                        f"{name}@{at}: read_committed delivered a transactional record the log does not hold",
                    )
                assert run is not None
                if run.outcome != KIND_COMMIT:
                    world.fail(
                        "txn",
                        f"{name}@{at}: read_committed delivered a record of "
                        + (
                            "an aborted transaction"
                            if run.outcome == KIND_ABORT
                            else "an unfinished transaction"
                        )
                        + f" (producer {run.producer_id}; read at {offset}, last stable offset {lso}, "
                        f"aborted transactions {listed})",
                    )
                delivered.append(r.value or b"")
        self.stats.records_read += len(delivered)
        return next_offset, lso, int(data.log_start_offset), delivered

    async def final_scan(self) -> None:
        """After the quiet period: each partition read with read_committed from its start
        offset to its high watermark; every committed transaction's records delivered, none of
        an aborted one; what EndTxn answered holds."""
        if not self.enabled:
            return
        world = self.world
        committed_values: set[bytes] = set()
        for pid in sorted(self.truth):
            state = world.truth.shadow[pid]
            name = world.partition_name(pid)
            offset = state.start_offset
            delivered: set[bytes] = set()
            for _ in range(10_000):
                if offset >= state.high_watermark:
                    break
                got = await self._read(pid, offset)
                if got == ErrorCode.offset_out_of_range and state.start_offset > offset:
                    offset = state.start_offset  # retention moved the start during the read
                    continue
                if not isinstance(got, tuple):
                    world.fail("txn", f"{name}: the final read_committed scan failed at {offset}: {got!r}")
                assert isinstance(got, tuple)
                next_offset, lso, values = got
                delivered.update(values)
                if next_offset == offset:
                    if state.start_offset > offset:  # retention moved the start during the scan
                        offset = state.start_offset
                        continue
                    world.fail(
                        "txn", f"{name}: the final read_committed scan is stuck at {offset} (LSO {lso})"
                    )
                offset = next_offset
            # A compacted topic keeps, per key, the latest record read_committed sees: its latest
            # committed one (an aborted record supersedes nothing).
            latest: dict[bytes | None, tuple[int, bytes]] = {}
            for run in self.truth[pid].runs:
                if self.compacted and run.outcome == KIND_COMMIT:
                    for o, k, v in zip(run.offsets, run.keys, run.values, strict=True):
                        if o >= state.start_offset and (k not in latest or latest[k][0] < o):
                            latest[k] = (o, v)
            for run in self.truth[pid].runs:
                kept = [
                    v
                    for o, k, v in zip(run.offsets, run.keys, run.values, strict=True)
                    if o >= state.start_offset
                    and (not self.compacted or run.outcome != KIND_COMMIT or latest[k][0] == o)
                ]
                if run.outcome == KIND_COMMIT:
                    committed_values.update(run.values)
                    missing = [v for v in kept if v not in delivered]
                    if missing:
                        world.fail(
                            "txn", f"{name}: committed records {missing[:3]} not delivered to read_committed"
                        )
                else:
                    shown = [v for v in kept if v in delivered]
                    if shown:
                        world.fail("txn", f"{name}: aborted records {shown[:3]} delivered to read_committed")
        for txn in self.txns:
            if txn.answered is None or not txn.values:
                continue
            inside = [v in committed_values for v in txn.values]
            if txn.answered and not all(inside):
                world.fail(
                    "txn",
                    f"{txn.tid} transaction {txn.number}: EndTxn answered commit, records not committed",
                )
            if not txn.answered and any(inside):
                world.fail(
                    "txn", f"{txn.tid} transaction {txn.number}: EndTxn answered abort, records committed"
                )
