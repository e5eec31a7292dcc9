"""Kafka transactions (KIP-98): the transaction coordinator (InitProducerId with a
transactional id, AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn, timeouts) and
each partition's transaction index (open ranges: the last stable offset; aborted ranges: what a
read_committed fetch lists).

How records carry a transaction: a record of a transactional batch is stored with one reserved
header (`TXN_HEADER`: producer id, epoch, kind) as its last header, and a commit or abort marker
is a stored record with the same header of kind commit/abort. The L0/L1 format is unchanged (old
objects read as they are); the fetch encoder strips the header again and emits such records as
transactional batches of that producer and markers as control batches, as Kafka's log holds them
(`records.encode_run`). A client cannot send the reserved header (a produce holding it is refused).

Durability (state in the control plane before answering, `TransactionStore`), as Kafka's
coordinator stores its transaction log (TransactionCoordinator/TransactionStateManager):
InitProducerId, AddOffsetsToTxn, TxnOffsetCommit and PREPARE_COMMIT/PREPARE_ABORT are stored
before the answer. AddPartitionsToTxn (only when it adds partitions: one commit per request,
which also opens the new partitions' ranges, at their high watermarks then: at or below the
transaction's first records there, so the last stable offset never passes an open
transaction) is answered once its commit is on its way, and the transaction's records in
those partitions are submitted only once it is durable (`Registration`: what must hold is
that no record of a transaction is durable before the transaction knows its partition, and
the commit overlaps the client's linger); every later write of the transaction's state waits
for it too. If it fails, the partitions leave the transaction and the producer is fenced. A
partition the producer's previous transaction still holds (prepared, its range open, its marker
queued in the lane) is the exception (`Registration.held`): the LSO holds below the records
there and they follow the marker, so they are submitted at once and the partition reaches
durability with them (KIP-890's idea); if the commit fails such partitions stay in the
transaction, which is fenced and aborted; after a crash before it, the restart finds the records
after the previous transaction's marker, takes their transaction up from the data (its ranges
opened just after the marker in the previous one's completion) and aborts it.
EndTxn answers once PREPARE_* is durable (the decision cannot be lost: a restart completes it);
the coordinator then queues the markers in the partitions' lanes (behind every record set the
transaction submitted; a produce of a transaction that is not ongoing is refused).

Pipelining (where Kafka's coordinator answers CONCURRENT_TRANSACTIONS until the markers are
written): once the markers are queued, the producer's next transaction may begin. Its records in
a partition queue behind the marker there (each refused if the marker failed: `after`), and a
marker alone in its lane waits for them briefly (MARKER_GATHER_S) so both share one write. The
prepared transaction stays in memory and in the store beside the next one's state
(`TransactionRow.prepared`, stored by the next one's AddPartitionsToTxn); a partition keeps one
open range per producer, the prepared one's, which holds the last stable offset below both
transactions' records. Once the markers are stored, the completion is stored in one commit:
COMPLETE_* (or the next transaction's state) without the prepared one, its ranges closed at its
markers (an aborted range keeps its abort marker's offset), and the next transaction's ranges in
those partitions opened just after the markers; the next transaction's EndTxn stores it with
its own PREPARE_* if it comes first (a completion waits COMPLETION_DEFER_S for that). Until that
commit the ranges hold the last stable offsets, so read_committed readers see a transaction
whole or not at all. The offsets a transaction commits are stored with its completion too:
until then OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them
(`pending_offsets`, KIP-447, as Kafka), and one without completes a committed transaction
holding the group's offsets before it answers (`wait_offsets_stable`). TxnOffsetCommit v3+ is
fenced by the consumer's group metadata as an offset commit is
(`GroupCoordinator.check_commit`).

Restart (Kafka's TransactionStateManager load): a transaction found in PREPARE_COMMIT or
PREPARE_ABORT, or prepared beside the next one, is completed: a marker that may have been stored
(by the previous run, or by a write that failed) is looked for in the partition's log from its
range's first offset (or the log start offset, if retention has passed it), and written only if
it is not there (another would land after the next transaction's records, taking them into the
range it closes; where retention may have removed it, `_queue_markers` says what is done). A
transaction the expiry pass cannot complete (a partition not writable now) is left for its next
pass without holding up the others. One found ONGOING is aborted
when its timeout expires, as the coordinator does for a transaction whose producer went away.

Limits: the coordinator writes markers through this node, so in a cluster every partition of a
transaction must be led by the transaction's coordinator node (a marker for a partition led
elsewhere fails: the transaction stays prepared, completed by the coordinator's pass once the
partition is led here, and the id's next transaction is answered CONCURRENT_TRANSACTIONS, or,
begun already, its records there NOT_ENOUGH_REPLICAS); a produce's epoch is checked against the
coordinator of this node only. KIP-890's server-side verification is not implemented.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from levelzero.actors.intake import Pending, ProduceIntake
from levelzero.core.errors import LevelZeroError
from levelzero.core.l0format import Record
from levelzero.core.txn_marks import txn_kind
from levelzero.kafka.epochs import NO_EPOCH
from levelzero.kafka.groups import GroupCoordinator
from levelzero.kafka.metadata import Cluster
from levelzero.kafka.protocol import Request, make
from levelzero.kafka.records import TXN_HEADER, KafkaBatch
from levelzero.storage.protocols import MemoryTransactionStore, TransactionRow, TransactionStore, TxnRangeRow

log = logging.getLogger("levelzero.kafka")

_TXN_VALUE = struct.Struct(">qhb")  # producer id, producer epoch, kind
KIND_DATA = -1
KIND_ABORT = 0  # Kafka's control record types
KIND_COMMIT = 1
TRANSACTION_TIMEOUT_MAX_MS = 900_000  # Kafka's transaction.max.timeout.ms default
EXPIRY_CHECK_S = 1.0
# A transactional id whose transaction ended (or never began) this long ago is forgotten, in
# memory and in the store, as Kafka's transactional.id.expiration.ms (7 days) has it: a client
# that takes a new id at every start (Quix Streams does) made both grow for ever.
TRANSACTIONAL_ID_EXPIRATION_S = 7 * 24 * 3600.0
# ... at most this many a pass (a commit each): the pass's timeouts and completions, the LSO's
# progress, do not wait behind a backlog of ids (the first pass after an upgrade).
ID_EXPIRIES_PER_PASS_MAX = 100
# OffsetFetch waits at most this long for a committed transaction holding the group's offsets
# to complete (EndTxn answers before its markers are written).
COMPLETION_WAIT_S = 10.0
# A marker alone in its partition's lane waits this long for the producer's next transaction's
# records to share their write (one data write a transaction, not two; the next transaction's
# records queue behind the marker in any case).
MARKER_GATHER_S = 0.05
# Once its markers are stored, a transaction whose producer's next one is ongoing waits this
# long for that one's EndTxn to store its completion (its ranges closing, so read_committed
# readers see it, at most this much later than its markers).
COMPLETION_DEFER_S = 0.05
MARKER_SCAN_BYTES = 1 << 20  # a read's size looking for a marker that may be stored
# Test use only: a daemon started with this set to 1 never writes a transaction's markers (its
# transactions stay prepared until a restart without it completes them).
HOLD_MARKERS_ENV = "LEVELZERO_TEST_HOLD_TXN_MARKERS"
# Test use only: with this set to 1 a completion task never stores the completion once the
# markers are (the transaction stays prepared beside the producer's next one, unless that one's
# EndTxn stores it).
HOLD_COMPLETION_ENV = "LEVELZERO_TEST_HOLD_TXN_COMPLETION"
# Test use only: with this set to 1 an AddPartitionsToTxn that adds partitions is answered but
# its commit never completes (the transaction's records there are never submitted).
HOLD_REGISTRATION_ENV = "LEVELZERO_TEST_HOLD_TXN_REGISTRATION"
# Test use only: with this set to 1 an AddPartitionsToTxn whose records do not wait for its
# commit (`Registration.held`) is answered but its commit never completes.
HOLD_HELD_REGISTRATION_ENV = "LEVELZERO_TEST_HOLD_TXN_HELD_REGISTRATION"
# Test use only: with this set to 1 the coordinator's pass neither completes the transactions
# a restart left prepared nor aborts expired ones (the requests that touch them still do).
HOLD_EXPIRY_ENV = "LEVELZERO_TEST_HOLD_TXN_EXPIRY"
EPOCH_MAX = 32767

EMPTY, ONGOING = "empty", "ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "prepare_commit", "prepare_abort"
COMPLETE_COMMIT, COMPLETE_ABORT = "complete_commit", "complete_abort"


def txn_header(producer_id: int, producer_epoch: int, kind: int) -> tuple[str, bytes]:
    return TXN_HEADER, _TXN_VALUE.pack(producer_id, producer_epoch, kind)


def txn_of(record: Record) -> tuple[int, int, int] | None:
    """(producer id, epoch, kind) of a record stored by a transaction, else None."""
    headers = record.headers
    if headers and headers[-1][0] == TXN_HEADER:
        value = headers[-1][1]
        assert value is not None and len(value) == _TXN_VALUE.size, "stored by this module"
        producer_id, epoch, kind = _TXN_VALUE.unpack(value)
        return producer_id, epoch, kind
    return None


def marker_record(producer_id: int, producer_epoch: int, commit: bool, now: float | None = None) -> Record:
    """A commit/abort marker as stored (encoded as Kafka's control record on fetch), stamped
    `now` (seconds; the wall clock when None)."""
    kind = KIND_COMMIT if commit else KIND_ABORT
    return Record(
        struct.pack(">hh", 0, kind),
        struct.pack(">hi", 0, 0),  # version, coordinator epoch
        int((time.time() if now is None else now) * 1000),
        (txn_header(producer_id, producer_epoch, kind),),
    )


def read_committed_batches(
    batches: Iterable[KafkaBatch], aborted: Iterable[tuple[int, int]]
) -> Iterator[tuple[KafkaBatch, bool]]:
    """A read_committed Fetch answer's batches as Kafka's consumers apply its aborted list of
    (producer id, first offset): each batch, and whether the consumer skips it as aborted (a
    listed producer's batches from the range's first offset until that producer's abort
    marker; a control batch is never skipped, and never delivered)."""
    pending = sorted((first, producer_id) for producer_id, first in aborted)
    skipping: set[int] = set()
    for batch in batches:
        last = batch.base_offset + batch.last_offset_delta
        while pending and pending[0][0] <= last:
            skipping.add(pending.pop(0)[1])
        if batch.is_control:
            key = batch.records[0].key or b""
            if len(key) == 4 and struct.unpack(">hh", key)[1] == KIND_ABORT:
                skipping.discard(batch.producer_id)
            yield batch, False
        else:
            yield batch, batch.producer_id in skipping


@dataclass(slots=True)
class PartitionTxns:
    """One partition's transactions: open ranges (producer id -> first offset) and aborted ranges
    (producer id, first offset, last offset: the abort marker's), by first offset."""

    open: dict[int, int] = field(default_factory=dict)
    aborted: list[tuple[int, int, int]] = field(default_factory=list)

    def last_stable_offset(self, high_watermark: int) -> int:
        return min(min(self.open.values(), default=high_watermark), high_watermark)

    def aborted_between(self, start: int, stop: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of aborted ranges that overlap [start, stop)."""
        return [(p, first) for p, first, last in self.aborted if last >= start and first < stop]


class PartitionIndex:
    """Each partition's `PartitionTxns`, loaded from the store on first use. An aborted range
    is forgotten (in memory and in the store) once the partition's log start offset passes its
    abort marker (retention, DeleteRecords): no fetch can reach it any more. `start_offset`
    says a partition's log start offset, None where this node does not serve it.

    A topic this node deletes is forgotten (`forget`, a `Node.topic_deleted` hook, however it
    was deleted): a recreated topic's partitions kept the old topic's ranges, an open one held
    their last stable offset and their retention, an aborted one hid a producer's committed
    records at those offsets from read_committed readers."""

    def __init__(self, store: TransactionStore, start_offset: Callable[[str, int], int | None]) -> None:
        self.store = store
        self.start_offset = start_offset
        self._partitions: dict[tuple[str, int], PartitionTxns] = {}

    def known(self, topic: str, partition: int) -> PartitionTxns | None:
        return self._partitions.get((topic, partition))

    async def get(self, topic: str, partition: int) -> PartitionTxns:
        found = self._partitions.get((topic, partition))
        if found is not None:
            return found
        rows = await self.store.txn_ranges(topic, partition)
        found = self._partitions.get((topic, partition))
        if found is not None:  # loaded meanwhile
            return found
        txns = PartitionTxns()
        for row in rows:
            if row.aborted:
                txns.aborted.append((row.producer_id, row.first_offset, row.last_offset))
            else:
                txns.open[row.producer_id] = row.first_offset
        self._partitions[(topic, partition)] = txns
        await self.prune(topic, partition)
        return txns

    async def oldest_open(self, topic: str, partition: int) -> int | None:
        """The first offset of the oldest transaction open in the partition, or None: retention
        keeps the log start offset at or below it (`Housekeeper.open_transactions`), so a
        restart completing a transaction finds its records and its marker where it left them."""
        return min((await self.get(topic, partition)).open.values(), default=None)

    async def prune(self, topic: str, partition: int) -> None:
        """Forget the aborted ranges below the partition's log start offset."""
        txns = self._partitions.get((topic, partition))
        start = self.start_offset(topic, partition)
        if txns is None or start is None or not any(last < start for _, _, last in txns.aborted):
            return
        await self.store.prune_txn_ranges(topic, partition, start)
        txns.aborted = [a for a in txns.aborted if a[2] >= start]

    async def prune_all(self) -> None:
        for topic, partition in list(self._partitions):
            await self.prune(topic, partition)

    async def open_range(self, topic: str, partition: int, producer_id: int, at: int) -> None:
        """Durable before the transaction's first record set there is submitted."""
        txns = await self.get(topic, partition)
        if producer_id in txns.open:
            return
        txns.open[producer_id] = at  # first: the LSO holds at or below the records from now on
        try:
            await self.store.open_txn_range(TxnRangeRow(topic, partition, producer_id, at, -1, False))
        except BaseException:
            txns.open.pop(producer_id, None)
            raise

    async def holding(self, rows: Sequence[TxnRangeRow]) -> list[TxnRangeRow]:
        """Open `rows` in memory (those of a producer not open there already), before the store
        has them: the LSO holds at their first offsets from now on. The rows opened; the
        caller stores them (`TransactionStore.put_transaction`) or calls `release` on failure."""
        opened = []
        for row in rows:
            txns = await self.get(row.topic, row.partition)
            if row.producer_id not in txns.open:
                txns.open[row.producer_id] = row.first_offset
                opened.append(row)
        return opened

    def release(self, rows: Sequence[TxnRangeRow]) -> None:
        for row in rows:
            txns = self._partitions.get((row.topic, row.partition))
            if txns is not None and txns.open.get(row.producer_id) == row.first_offset:
                del txns.open[row.producer_id]

    def closed(self, rows: Sequence[TxnRangeRow]) -> None:
        """The ranges `rows` closed in the store (their markers written): an aborted range is
        listed before the open range goes, so a fetch sees one or the other."""
        for row in rows:
            txns = self._partitions.get((row.topic, row.partition))
            if txns is None or txns.open.get(row.producer_id) != row.first_offset:
                continue
            if row.aborted:
                txns.aborted.append((row.producer_id, row.first_offset, row.last_offset))
                txns.aborted.sort(key=lambda a: a[1])
            del txns.open[row.producer_id]

    def handed_over(self, closed: Sequence[TxnRangeRow], opened: Sequence[TxnRangeRow]) -> None:
        """A transaction's ranges `closed` and its producer's next transaction's ranges `opened`
        just after its markers, in the store (one commit): in memory with no await between."""
        self.closed(closed)
        for row in opened:
            txns = self._partitions.get((row.topic, row.partition))
            if txns is not None:
                txns.open.setdefault(row.producer_id, row.first_offset)

    def forget(self, topic: str) -> None:
        for key in [k for k in self._partitions if k[0] == topic]:
            del self._partitions[key]

    def forget_partition(self, topic: str, partition: int) -> None:
        """The partition was handed over: its ranges change on its next leader (opened, closed,
        aborted there, in the store), so what is loaded here goes, and is loaded again if it
        comes back. Kept, it listed none of the aborted ranges made meanwhile: read_committed
        readers here got those records."""
        self._partitions.pop((topic, partition), None)


Partition = tuple[str, int]
PendingOffset = tuple[str, int, int, str, int]  # topic, partition, offset, metadata, leader epoch


@dataclass(eq=False, slots=True)
class Prepared:
    """An ended transaction (PREPARE_* durable) whose markers are being written. Its producer's
    next transaction may begin beside it once the markers are queued in the partitions' lanes
    (ahead of any record of the next one there); its completion (COMPLETE_*, its ranges closed
    at the markers, the next transaction's ranges in those partitions opened just after them)
    is stored in one commit once the markers are."""

    commit: bool
    producer_epoch: int
    partitions: list[Partition]
    groups: dict[str, list[PendingOffset]]
    # Each partition's open range the marker closes (its first offset); partitions without one
    # get no marker.
    firsts: dict[Partition, int]
    # Prepared in this process and its markers never queued: none of them can be stored yet.
    # Otherwise (after a restart, or a marker that failed) a partition's log is read for the
    # marker before another is written (a second one would land after the next transaction's
    # records).
    fresh: bool
    # A partition's marker: queued (its record set in the lane), or found stored (its offset).
    markers: dict[Partition, Pending | int] = field(default_factory=dict)
    completed: anyio.Event = field(default_factory=anyio.Event)
    attempting: bool = False  # a completion task is waiting on the markers
    # A partition's first record of the producer after the marker found stored (after a
    # restart): a next transaction's records whose AddPartitionsToTxn commit never became
    # durable (`_store_completion` takes that transaction up and aborts it).
    strays: dict[Partition, int] = field(default_factory=dict)

    def queued(self, tp: Partition) -> Pending | int | None:
        """The partition's marker, queued or stored (None: not queued, or it failed)."""
        marker = self.markers.get(tp)
        if isinstance(marker, Pending) and marker.done.is_set() and marker.error is not None:
            return None
        return marker

    def json(self) -> str:
        return json.dumps(
            {
                "state": PREPARE_COMMIT if self.commit else PREPARE_ABORT,
                "epoch": self.producer_epoch,
                "partitions": self.partitions,
                "groups": self.groups,
                "firsts": [[t, p, first] for (t, p), first in self.firsts.items()],
            }
        )

    @classmethod
    def of_json(cls, text: str) -> Prepared:
        found = json.loads(text)
        return cls(
            found["state"] == PREPARE_COMMIT,
            found["epoch"],
            [(t, p) for t, p in found["partitions"]],
            {g: [_pending_offset(e) for e in offsets] for g, offsets in found["groups"].items()},
            {(t, p): first for t, p, first in found["firsts"]},
            fresh=False,
        )


@dataclass(eq=False, slots=True)
class Registration:
    """An AddPartitionsToTxn commit (the state with the new partitions, their ranges opened)
    answered before it is durable. Until it is: the transaction's records in `partitions` are
    not submitted (a produce waits for it), and nothing else of the transaction is stored
    (every holder of the transaction's lock waits for it first: its row, taken when it was
    answered, is the transaction's latest). If it fails, the partitions leave the transaction
    again and the producer is fenced (its epoch bumped: the records waiting are refused as a
    fenced producer's): none of them was stored."""

    partitions: frozenset[Partition]
    # Partitions added that the previous transaction's open range holds, its marker queued
    # ahead in the lane: their records do not wait (see `_add_partitions_locked`). If the
    # commit fails they stay in the transaction, which is aborted.
    held: frozenset[Partition] = frozenset()
    done: anyio.Event = field(default_factory=anyio.Event)

    def holds(self, tp: Partition) -> bool:
        """The partition's records must wait."""
        return tp in self.partitions and not self.done.is_set()


@dataclass(slots=True)
class TxnState:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    started_at: float = 0.0
    partitions: list[Partition] = field(default_factory=list)
    # group id -> [(topic, partition, offset, metadata, leader epoch)] committed with the
    # transaction
    groups: dict[str, list[PendingOffset]] = field(default_factory=dict)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    # The previous transaction, its markers being written (`Prepared`); `state` is then
    # COMPLETE_* (in memory: the next transaction may begin) or the next one's.
    prepared: Prepared | None = None
    # The PREPARE_* state was stored by this process (its markers cannot have been written).
    prepared_here: bool = False
    # The last AddPartitionsToTxn's commit, answered before it is durable (`Registration`).
    registering: Registration | None = None
    # When its state was last stored (the row's time, once the store took it): a transactional
    # id idle this long is forgotten (`TransactionCoordinator.id_expiration_s`, Kafka's
    # transactional.id.expiration.ms), its row deleted only if still the one of this time.
    updated_at: float = 0.0
    # Forgotten by the expiry while a request waited for its lock: that request is refused
    # (retriable), and its retry finds the id gone, as after any expiry.
    expired: bool = False

    def row(self, now: float) -> TransactionRow:
        return TransactionRow(
            self.transactional_id,
            self.producer_id,
            self.producer_epoch,
            self.state,
            self.timeout_ms,
            self.started_at,
            json.dumps(self.partitions),
            json.dumps(self.groups),
            now,
            "" if self.prepared is None else self.prepared.json(),
        )

    @classmethod
    def of_row(cls, row: TransactionRow) -> TxnState:
        groups = json.loads(row.groups) or {}
        if isinstance(groups, list):
            groups = {g: [] for g in groups}
        return cls(
            row.transactional_id,
            row.producer_id,
            row.producer_epoch,
            row.state,
            row.timeout_ms,
            row.started_at,
            [(t, p) for t, p in json.loads(row.partitions)],
            {g: [_pending_offset(entry) for entry in offsets] for g, offsets in groups.items()},
            prepared=Prepared.of_json(row.prepared) if row.prepared else None,
            updated_at=row.updated_at,
        )


def _pending_offset(entry: list[Any]) -> tuple[str, int, int, str, int]:
    """An offset a transaction holds, as stored: entries stored before the leader epoch was
    kept have four fields."""
    topic, partition, offset, metadata, *epoch = entry
    return topic, partition, offset, metadata, epoch[0] if epoch else NO_EPOCH


class TransactionalIdExpired(LevelZeroError):
    """A request about a transactional id the expiry forgot while the request waited for it
    (answered as the coordinator's other failures are: retriable)."""

    code = "transactional_id_expired"


class TransactionCoordinator:
    """The transaction coordinator of the transactional ids this node coordinates."""

    def __init__(
        self,
        intake: ProduceIntake,
        groups: GroupCoordinator,
        cluster: Cluster,
        clock: Callable[[], float] = time.time,
        id_expiration_s: float = TRANSACTIONAL_ID_EXPIRATION_S,
    ) -> None:
        assert id_expiration_s > 0, id_expiration_s
        self.intake = intake
        self.groups = groups
        self.cluster = cluster
        self.clock = clock
        self.id_expiration_s = id_expiration_s
        self._expiring = 0
        store = intake.node.log_store
        self.store: TransactionStore
        if isinstance(store, TransactionStore):
            self.store = store
        else:  # (a deleted topic's ranges go with it, as a store with the role deletes them)
            self.store = memory = MemoryTransactionStore()
            intake.node.topic_deleted.append(memory.forget_topic_ranges)
        self.index = PartitionIndex(self.store, self._start_offset)
        self._txns: dict[str, TxnState] = {}
        self._epochs: dict[int, int] = {}  # producer id -> its current epoch (fencing produce)
        self._producers: dict[int, TxnState] = {}  # producer id -> its transactional id's state
        self._loaded = False
        self._load_lock = anyio.Lock()
        self._tg: anyio.abc.TaskGroup | None = None  # completions of ended transactions
        self.hold_markers = os.environ.get(HOLD_MARKERS_ENV) == "1"
        if self.hold_markers:
            log.warning("%s is set: transactions' markers are never written; test use only", HOLD_MARKERS_ENV)
        self.hold_registration = os.environ.get(HOLD_REGISTRATION_ENV) == "1"
        if self.hold_registration:
            log.warning("%s is set: AddPartitionsToTxn never commits; test use only", HOLD_REGISTRATION_ENV)
        self.hold_held_registration = os.environ.get(HOLD_HELD_REGISTRATION_ENV) == "1"
        if self.hold_held_registration:
            log.warning(
                "%s is set: AddPartitionsToTxn with held partitions never commits; test use only",
                HOLD_HELD_REGISTRATION_ENV,
            )
        self.hold_completion = os.environ.get(HOLD_COMPLETION_ENV) == "1"
        if self.hold_completion:
            log.warning("%s is set: completions wait for the next EndTxn; test use only", HOLD_COMPLETION_ENV)
        self.hold_expiry = os.environ.get(HOLD_EXPIRY_ENV) == "1"
        if self.hold_expiry:
            log.warning("%s is set: no pass completes or expires a transaction (test use)", HOLD_EXPIRY_ENV)

    async def run(self) -> None:
        """Aborts expired transactions (and completes those a restart left prepared), and
        forgets aborted ranges below partitions' log start offsets; runs until cancelled. Ended
        transactions are completed (their markers written) in its task group."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                while True:
                    try:
                        if not self.hold_expiry:
                            await self.expire()
                        await self.index.prune_all()
                    except LevelZeroError as exc:
                        log.warning("transaction coordinator: expiry pass failed: %s", exc)
                    await anyio.sleep(EXPIRY_CHECK_S)
            finally:
                self._tg = None

    def _start_offset(self, topic: str, partition: int) -> int | None:
        try:
            return self.intake.node.partition(topic, partition).state.start_offset
        except LevelZeroError:
            return None  # not served here (led elsewhere, deleted): its leader prunes

    async def _load(self) -> None:
        if self._loaded:
            return
        async with self._load_lock:
            if self._loaded:
                return
            for row in await self.store.transactions():
                txn = TxnState.of_row(row)
                self._txns[txn.transactional_id] = txn
                self._producers[txn.producer_id] = txn
                self._epochs[txn.producer_id] = max(self._epochs.get(txn.producer_id, -1), txn.producer_epoch)
            self._loaded = True

    async def coordinated(self) -> list[TxnState]:
        """The transactions of the transactional ids this node coordinates now, by id
        (ListTransactions)."""
        await self._load()
        return [txn for tid, txn in sorted(self._txns.items()) if self.cluster.coordinates(tid)]

    async def described(self, tid: str) -> tuple[ErrorCode, TxnState | None]:
        """The transaction of `tid` (DescribeTransactions): NOT_COORDINATOR where another node
        coordinates it, TRANSACTIONAL_ID_NOT_FOUND where no producer initialised it."""
        if not self.cluster.coordinates(tid):
            return ErrorCode.not_coordinator, None
        await self._load()
        txn = self._txns.get(tid)
        return (ErrorCode.none, txn) if txn is not None else (ErrorCode.transactional_id_not_found, None)

    async def expire(self) -> None:
        await self._load()
        now = self.clock()
        self._expiring = 0  # ids forgotten this pass (each a commit: the rest wait for the next)
        for txn in list(self._txns.values()):
            if not self.cluster.coordinates(txn.transactional_id):
                continue
            try:
                await self._expire_one(txn, now)
            except LevelZeroError as exc:
                # One transaction's failure (a partition not writable now) leaves the others'
                # completions and timeouts to this pass; it is tried again at the next.
                log.warning("transaction %r: completing or expiring it failed: %s", txn.transactional_id, exc)

    async def _expire_one(self, txn: TxnState, now: float) -> None:
        if self._idle(txn, now) and self._expiring < ID_EXPIRIES_PER_PASS_MAX:
            self._expiring += 1
            async with txn.lock:  # (not `_locked`: an idle one has no registration on its way)
                if self._idle(txn, self.clock()) and self._txns.get(txn.transactional_id) is txn:
                    await self.store.expire_transaction(txn.transactional_id, txn.updated_at)
                    self._forget(txn)
                    log.info(
                        "transactional id %r expired (idle since its last transaction)", txn.transactional_id
                    )
        elif self._completing(txn):
            async with self._locked(txn):
                if self._completing(txn):
                    await self._complete(txn)
        elif txn.state == ONGOING and now > txn.started_at + txn.timeout_ms / 1000:
            async with self._locked(txn):
                if txn.state == ONGOING and self.clock() > txn.started_at + txn.timeout_ms / 1000:
                    log.info("transaction %r timed out: aborting", txn.transactional_id)
                    txn.producer_epoch += 1  # fences the producer (KIP-360 lets it re-init)
                    self._epochs[txn.producer_id] = txn.producer_epoch
                    await self._end(txn, commit=False)

    def _idle(self, txn: TxnState, now: float) -> bool:
        """No transaction open or being completed, and none for `id_expiration_s`."""
        return (
            txn.state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT)
            and txn.prepared is None
            and txn.registering is None
            and now - txn.updated_at >= self.id_expiration_s
        )

    def _forget(self, txn: TxnState) -> None:
        """An expired transactional id out of memory (its row deleted): its producer id with it."""
        txn.expired = True
        del self._txns[txn.transactional_id]
        if self._producers.get(txn.producer_id) is txn:
            del self._producers[txn.producer_id]
            self._epochs.pop(txn.producer_id, None)

    @staticmethod
    def _completing(txn: TxnState) -> bool:
        """A prepared transaction no completion task is waiting on (a restart left it, or its
        markers failed)."""
        if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return True
        return txn.prepared is not None and not txn.prepared.attempting

    # ------------------------------------------------------------------ what produce asks

    async def load(self) -> None:
        """Every stored transaction known (after a restart, before the first request's check)."""
        await self._load()

    def produce_error(
        self,
        producer_id: int,
        producer_epoch: int,
        topic: str,
        partition: int,
        transactional_id: str | None = None,
    ) -> ErrorCode:
        """A transactional record set of an epoch older than the producer id's: fenced. One
        whose producer id no transaction here has, or another transactional id's than the
        request names (`transactional_id`, when given): INVALID_PRODUCER_ID_MAPPING. One of a
        producer whose transaction is not ongoing here (ended: its markers may still be on
        their way, and records after them must open a range of their own, which only
        AddPartitionsToTxn of the next transaction does), or in a partition the transaction
        did not add: INVALID_TXN_STATE, as Kafka's verification of a transactional produce
        answers (KIP-890). Either, stored, would open a range no EndTxn ever closes: the last
        stable offset held for good. One in a partition where the previous transaction's marker
        is not queued (after a restart, or it failed): NOT_ENOUGH_REPLICAS, which clients retry
        (the records must follow the marker)."""
        current = self._epochs.get(producer_id)
        if current is not None and producer_epoch < current:
            return ErrorCode.invalid_producer_epoch
        txn = self._producers.get(producer_id)
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping
        if transactional_id is not None and txn.transactional_id != transactional_id:
            return ErrorCode.invalid_producer_id_mapping
        tp = (topic, partition)
        if txn.state != ONGOING or tp not in txn.partitions:
            return ErrorCode.invalid_txn_state
        prepared = txn.prepared
        if prepared is not None and tp in prepared.firsts and prepared.queued(tp) is None:
            return ErrorCode.not_enough_replicas
        if txn.registering is not None and txn.registering.holds(tp):
            return ErrorCode.not_enough_replicas  # (`registered` is awaited first)
        return ErrorCode.none

    async def registered(self, producer_id: int, topic: str, partition: int) -> None:
        """Before a transactional record set is submitted: until the AddPartitionsToTxn commit
        that added its partition is durable (or failed: the producer is fenced, and
        `produce_error` says so), so no record of a transaction is stored before the transaction
        knows the partition and its range holds the last stable offset."""
        txn = self._producers.get(producer_id)
        if txn is None or txn.producer_id != producer_id:
            return
        registration = txn.registering
        if registration is not None and (topic, partition) in registration.partitions:
            await registration.done.wait()

    def marker_ahead(self, producer_id: int, topic: str, partition: int) -> Pending | None:
        """The previous transaction's marker queued in the partition's lane, which the
        producer's records there must not be stored without (`ProduceIntake.submit`'s
        `after`)."""
        txn = self._producers.get(producer_id)
        if txn is None or txn.prepared is None:
            return None
        marker = txn.prepared.markers.get((topic, partition))
        return marker if isinstance(marker, Pending) else None

    async def pending_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """The partitions of `group_id` whose offsets a transaction this node coordinates holds
        and has not completed (ongoing, or prepared with its markers on their way): OffsetFetch
        with require_stable answers UNSTABLE_OFFSET_COMMIT for them (KIP-447), as Kafka's group
        coordinator does while a transactional offset commit is pending (its marker not yet
        written). Raises LevelZeroError when the transactions' state cannot be read."""
        await self._load()
        pending: set[tuple[str, int]] = set()
        for txn in list(self._txns.values()):
            if not self.cluster.coordinates(txn.transactional_id):
                continue
            if txn.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT):
                pending.update((topic, partition) for topic, partition, *_ in txn.groups.get(group_id, ()))
            prepared = txn.prepared  # completing (beside the next one): its markers on their way
            if prepared is not None:
                pending.update(
                    (topic, partition) for topic, partition, *_ in prepared.groups.get(group_id, ())
                )
        return pending

    async def wait_offsets_stable(self, group_id: str) -> None:
        """Before OffsetFetch answers a client that does not ask for stable offsets
        (require_stable false, or OffsetFetch before v7: kafka-python, aiokafka): a committed
        transaction (PREPARE_COMMIT, or completing beside the next one) holding offsets of
        `group_id` is completed first (or waited for, at most COMPLETION_WAIT_S), so a consumer
        that reads its group's offsets after the producer's commit was answered gets them, not
        the ones before. Kafka answers such a client the offsets before the commit until its
        markers are written; a client that asks for stable offsets is answered
        UNSTABLE_OFFSET_COMMIT at once instead (`pending_offsets`) and retries. After a restart
        this completes a prepared transaction at once."""
        try:
            await self._load()
        except LevelZeroError as exc:
            log.warning("OffsetFetch: cannot read the transactions' state: %s", exc)
            return
        for txn in list(self._txns.values()):
            if not self._holds_offsets(txn, group_id):
                continue
            if not self.cluster.coordinates(txn.transactional_id):
                continue
            with anyio.move_on_after(COMPLETION_WAIT_S):
                async with self._locked(txn):
                    if self._holds_offsets(txn, group_id):
                        try:
                            await self._complete(txn)
                        except LevelZeroError as exc:
                            log.warning("transaction %r: completing it failed: %s", txn.transactional_id, exc)

    @staticmethod
    def _holds_offsets(txn: TxnState, group_id: str) -> bool:
        if txn.state == PREPARE_COMMIT and txn.groups.get(group_id):
            return True
        prepared = txn.prepared
        return prepared is not None and prepared.commit and bool(prepared.groups.get(group_id))

    # ------------------------------------------------------------------ the state machine

    async def _put(self, txn: TxnState) -> None:
        row = txn.row(self.clock())
        await self.store.put_transaction(row)
        txn.updated_at = row.updated_at

    @contextlib.asynccontextmanager
    async def _locked(self, txn: TxnState) -> AsyncIterator[None]:
        """The transaction's lock, once its last AddPartitionsToTxn commit is done: every write
        of its state follows that one's (whose row was taken when it was answered)."""
        async with txn.lock:
            if txn.expired:  # forgotten while this request waited: its retry finds the id gone
                raise TransactionalIdExpired(f"transactional id {txn.transactional_id!r} expired meanwhile")
            registration = txn.registering
            if registration is not None:
                await registration.done.wait()
            yield

    async def _register(
        self,
        txn: TxnState,
        registration: Registration,
        row: TransactionRow,
        opened: list[TxnRangeRow],
        before: tuple[str, float, list[Partition], dict[str, list[PendingOffset]]],
    ) -> None:
        """AddPartitionsToTxn's commit, after its answer (the records wait for it). A failure:
        the partitions leave the transaction again (their ranges released: no record of the
        transaction was stored there) and the producer is fenced, as the expiry pass fences it
        (its next request is answered PRODUCER_FENCED or INVALID_PRODUCER_EPOCH; InitProducerId
        then aborts what the transaction had stored). Partitions whose records did not wait
        (`Registration.held`) stay: the transaction stays ongoing with them, expired now, so the
        expiry pass aborts what it stored there."""
        try:
            if self.hold_registration or (self.hold_held_registration and registration.held):
                await anyio.sleep_forever()
            await self.store.put_transaction(row, opened=opened)
            txn.updated_at = row.updated_at
        except BaseException as exc:
            self.index.release(opened)
            if registration.held:
                kept = [tp for tp in txn.partitions if tp in before[2] or tp in registration.held]
                txn.partitions, txn.started_at = kept, 0.0
            else:
                txn.state, txn.started_at, txn.partitions, txn.groups = before
            txn.producer_epoch += 1
            self._epochs[txn.producer_id] = max(self._epochs.get(txn.producer_id, -1), txn.producer_epoch)
            if not isinstance(exc, LevelZeroError):
                raise
            log.warning(
                "transaction %r: storing AddPartitionsToTxn failed (the producer is fenced): %s",
                txn.transactional_id,
                exc,
            )
        finally:
            registration.done.set()
            if txn.registering is registration:
                txn.registering = None

    async def _end(self, txn: TxnState, commit: bool, *, wait: bool = True) -> bool:
        """PREPARE_* durable, then the markers: written before returning (`wait`), else by a
        task of the coordinator (EndTxn answers once PREPARE_* is durable, as Kafka's does; a
        restart completes a prepared transaction). The previous transaction, if still
        completing, completes in the same commit as this one's PREPARE_* (its markers are
        stored: this one's records followed them in the lanes). False: the previous one's
        completion fenced this one (`_queue_markers`), which is aborted instead of committed."""
        previous, epoch = txn.prepared, txn.producer_epoch
        if previous is not None:
            await self._queue_markers(txn, previous)
            await self._markers_stored(previous)
        fenced = txn.producer_epoch != epoch
        commit = commit and not fenced
        ongoing, txn.state = txn.state, PREPARE_COMMIT if commit else PREPARE_ABORT
        try:
            if previous is not None:
                await self._store_completion(txn, previous)
            else:
                await self._put(txn)
        except BaseException:
            # Not stored: still ongoing, EndTxn is retried (left prepared in memory beside the
            # previous transaction, the completion would take it for that one's).
            txn.state = ongoing
            raise
        txn.prepared_here = True
        if wait or self._tg is None:
            await self._complete(txn)
        else:
            self._tg.start_soon(self._complete_later, txn)
        return not fenced

    async def _complete_later(self, txn: TxnState) -> None:
        """The markers queued (under the lock), waited for (without it: the producer's next
        transaction may begin meanwhile), then the completion stored (under it)."""
        try:
            async with self._locked(txn):
                prepared = await self._prepare(txn)
            if prepared is None:
                return
            prepared.attempting = True
            try:
                await self._markers_stored(prepared)
                if self.hold_completion:
                    await anyio.sleep_forever()
                if txn.state == ONGOING:
                    # The next transaction's EndTxn stores this completion with its PREPARE_*,
                    # in one commit, if it comes soon (else two commits in a row for it).
                    with anyio.move_on_after(COMPLETION_DEFER_S):
                        await prepared.completed.wait()
            finally:
                prepared.attempting = False
            async with self._locked(txn):
                await self._store_completion(txn, prepared)
        except LevelZeroError as exc:
            log.warning("transaction %r: writing its markers failed (retried): %s", txn.transactional_id, exc)

    async def _complete(self, txn: TxnState) -> None:
        """(The lock held.) The prepared transaction (PREPARE_*, or the one completing beside
        the next) completed: markers queued, stored, then its completion stored."""
        prepared = await self._prepare(txn)
        if prepared is None:
            return
        await self._markers_stored(prepared)
        await self._store_completion(txn, prepared)

    async def _prepare(self, txn: TxnState) -> Prepared | None:
        """(The lock held.) A PREPARE_* transaction becomes `txn.prepared` and its markers are
        queued in the partitions' lanes (each behind every record set the transaction
        submitted: a produce is refused once it is not ongoing); then the state is COMPLETE_*
        in memory, so the producer's next transaction may begin (its records queue behind the
        markers). The prepared transaction (None: nothing to complete)."""
        if self.hold_markers:
            await anyio.sleep_forever()
        if txn.state in (PREPARE_COMMIT, PREPARE_ABORT) and txn.prepared is None:
            firsts = {}
            for topic, partition in dict.fromkeys(txn.partitions):
                try:
                    first = (await self.index.get(topic, partition)).open.get(txn.producer_id)
                except LevelZeroError as exc:
                    if exc.code in ("unknown_topic", "unknown_partition"):
                        continue
                    raise
                if first is not None:  # else nothing was produced there
                    firsts[(topic, partition)] = first
            txn.prepared = Prepared(
                txn.state == PREPARE_COMMIT,
                txn.producer_epoch,
                list(txn.partitions),
                dict(txn.groups),
                firsts,
                fresh=txn.prepared_here,
            )
        prepared = txn.prepared
        if prepared is None:
            return None
        await self._queue_markers(txn, prepared)
        if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
            txn.state = COMPLETE_COMMIT if prepared.commit else COMPLETE_ABORT
            txn.partitions, txn.groups, txn.started_at = [], {}, 0.0
        return prepared

    async def _queue_markers(self, txn: TxnState, prepared: Prepared) -> None:
        """Each partition's marker queued in its lane, unless queued already or found stored:
        a marker that may have been stored (by the previous run, or by a produce that failed)
        is looked for in the log first, since another would land after the next transaction's
        records.

        The log is read from the range's first offset or the partition's log start offset,
        whichever is later. When retention (or DeleteRecords) has moved the start past the
        range's first offset and no marker is found, the marker was either never stored or
        stored and removed. By the branch's rules, records of the producer's next transaction
        are stored in the partition only behind a stored marker (behind one that failed they
        are refused; after a restart they are refused while this marker is not queued), so:
        - if the producer has no transactional record from the start offset on, or its next
          transaction has not added the partition, every record of the producer there is this
          transaction's (or none is): the marker is written (a second one, if the first was
          removed, closes nothing of another transaction);
        - otherwise those records may be the next transaction's (the marker removed) or this
          one's (never stored); a marker written now would take the next one's into this
          range. The range is closed at the start offset minus one, without a marker (the
          next transaction's range opens at the start offset, holding the last stable offset
          there: it never moves back). Its records, if they are this transaction's, then fall
          in the next one's range: for a commit they are read when (and if) the next commits;
          for an abort the next transaction is fenced (its epoch bumped, its EndTxn answered
          PRODUCER_FENCED, aborted by the expiry pass), so they are aborted with it and
          read_committed never returns an aborted record."""
        for tp, first in list(prepared.firsts.items()):
            if prepared.queued(tp) is not None:
                continue
            topic, partition = tp
            try:
                if not prepared.fresh or tp in prepared.markers:
                    start = self._start_offset(topic, partition)
                    start = first if start is None else start
                    found, seen = await self._stored_marker(
                        txn.producer_id, topic, partition, max(first, start)
                    )
                    if found is not None:
                        prepared.markers[tp] = found
                        if not (txn.state == ONGOING and tp in txn.partitions):
                            stray = await self._first_record_after(txn.producer_id, topic, partition, found)
                            if stray is not None:
                                prepared.strays[tp] = stray
                        continue
                    if start > first and seen and txn.state == ONGOING and tp in txn.partitions:
                        log.warning(
                            "transaction %r: no marker in %s/%d from its start offset %d"
                            " (its range began at %d): closed there%s",
                            txn.transactional_id,
                            topic,
                            partition,
                            start,
                            first,
                            "" if prepared.commit else "; the next transaction is fenced",
                        )
                        prepared.markers[tp] = start - 1
                        if not prepared.commit:
                            txn.producer_epoch += 1  # fences the producer (KIP-360 lets it re-init)
                            self._epochs[txn.producer_id] = txn.producer_epoch
                            txn.started_at = 0.0  # the expiry pass aborts it
                        continue
                pending = self.intake.submit(
                    topic,
                    partition,
                    [marker_record(txn.producer_id, prepared.producer_epoch, prepared.commit, self.clock())],
                    None,
                    gather_s=MARKER_GATHER_S,
                    linger_s=self.intake.node.batcher.config.transaction_linger_ms / 1000,
                )
            except LevelZeroError as exc:
                if exc.code in ("unknown_topic", "unknown_partition"):
                    del prepared.firsts[tp]  # deleted: its ranges went with it
                    continue
                raise
            assert not isinstance(pending, int), "a marker has no producer identity"
            prepared.markers[tp] = pending
        prepared.fresh = False

    async def _stored_marker(
        self, producer_id: int, topic: str, partition: int, first: int
    ) -> tuple[int | None, bool]:
        """The offset of the producer's first marker at or after `first` (its range's first
        offset, or the log start offset if later: the marker found is the one closing it), or
        None: read up to the high watermark as it is now (a marker stored before is below it);
        and whether a transactional record of the producer was read before it."""
        _, high_watermark = self.intake.offsets(topic, partition)
        offset, seen = first, False
        while offset < high_watermark:
            result = await self.intake.node.fetch(topic, partition, offset, MARKER_SCAN_BYTES)
            for record in result.records:
                mark = txn_kind(record.headers)
                if mark is not None and mark[0] == producer_id:
                    if mark[1] != KIND_DATA:
                        return record.offset, seen
                    seen = True
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        return None, seen

    async def _first_record_after(
        self, producer_id: int, topic: str, partition: int, marker: int
    ) -> int | None:
        """The offset of the producer's first transactional record after its marker at
        `marker`, up to the high watermark as it is now, or None."""
        _, high_watermark = self.intake.offsets(topic, partition)
        offset = marker + 1
        while offset < high_watermark:
            result = await self.intake.node.fetch(topic, partition, offset, MARKER_SCAN_BYTES)
            for record in result.records:
                mark = txn_kind(record.headers)
                if mark is not None and mark[0] == producer_id and record.offset > marker:
                    return record.offset
            if result.next_offset <= offset:
                break
            offset = result.next_offset
        return None

    async def _markers_stored(self, prepared: Prepared) -> None:
        """Until every queued marker is stored; raises the first failure (the completion is
        tried again: the expiry pass, the next request)."""
        for marker in list(prepared.markers.values()):
            if isinstance(marker, Pending):
                await marker.done.wait()
                if marker.error is not None:
                    raise marker.error

    async def _store_completion(self, txn: TxnState, prepared: Prepared) -> None:
        """(The lock held, the markers stored.) The offsets committed (a commit), then in one
        commit: the state as it is now (COMPLETE_*, or the next transaction's) without the
        prepared one, its ranges closed at its markers (an aborted range keeps its abort
        marker's offset), and the next transaction's ranges in those partitions opened just
        after the markers. Until then the ranges hold the last stable offsets, so
        read_committed readers see the transaction whole or not at all."""
        if txn.prepared is not prepared:
            return  # completed meanwhile
        if prepared.commit:
            for group_id, offsets in prepared.groups.items():
                if offsets:
                    await self.groups.commit(group_id, offsets)
        closed, opened = [], []
        following = txn.state in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT)
        before = txn.state, txn.started_at, list(txn.partitions), dict(txn.groups), txn.producer_epoch
        strays = [tp for tp in prepared.strays if not (following and tp in txn.partitions)]
        if strays:
            # Records of the producer's next transaction after the markers, its
            # AddPartitionsToTxn never durable (a crash between its answer and its commit):
            # that transaction is taken up from the data, its ranges opened after the markers in
            # this commit, its producer fenced, and it is aborted (expired: the expiry pass, or
            # the producer's InitProducerId).
            log.warning(
                "transaction %r: records after its markers in %s of a transaction never registered: aborted",
                txn.transactional_id,
                strays,
            )
            if not following:
                txn.state, txn.partitions, txn.groups = ONGOING, [], {}
            txn.partitions.extend(strays)
            txn.started_at = 0.0
            txn.producer_epoch += 1
            following = True
        for (topic, partition), first in prepared.firsts.items():
            marker = prepared.markers[(topic, partition)]
            at = marker if isinstance(marker, int) else marker.base_offset
            assert at >= first, (topic, partition, first, at)
            closed.append(TxnRangeRow(topic, partition, txn.producer_id, first, at, not prepared.commit))
            if following and (topic, partition) in txn.partitions:
                opened.append(TxnRangeRow(topic, partition, txn.producer_id, at + 1, -1, False))
        txn.prepared = None
        try:
            row = txn.row(self.clock())
            await self.store.put_transaction(row, opened=opened, closed=closed)
            txn.updated_at = row.updated_at
        except BaseException:
            txn.prepared = prepared
            txn.state, txn.started_at, txn.partitions, txn.groups, txn.producer_epoch = before
            raise
        self._epochs[txn.producer_id] = max(self._epochs.get(txn.producer_id, -1), txn.producer_epoch)
        self.index.handed_over(closed, opened)
        prepared.completed.set()

    # ------------------------------------------------------------------ the APIs

    async def init_producer_id(self, request: Request) -> Any:
        m = request.response_module
        body = request.body

        def answer(code: ErrorCode, producer_id: int = -1, epoch: int = -1) -> Any:
            return make(
                m.InitProducerIdResponse,
                throttle_time=0,
                error_code=code,
                producer_id=producer_id,
                producer_epoch=epoch,
            )

        tid = body.transactional_id
        if not tid:  # (Kafka's coordinator: an empty transactional id is INVALID_REQUEST)
            return answer(ErrorCode.invalid_request)
        timeout_ms = int(body.transaction_timeout.total_seconds() * 1000)
        if not 0 < timeout_ms <= TRANSACTION_TIMEOUT_MAX_MS:
            return answer(ErrorCode.invalid_transaction_timeout)
        if not self.cluster.coordinates(tid):
            return answer(ErrorCode.not_coordinator)
        try:
            await self._load()
            txn = self._txns.get(tid)
            if txn is None:
                txn = TxnState(tid, self.intake.new_producer_id(), 0, EMPTY, timeout_ms)
                self._txns[tid] = txn
                self._producers[txn.producer_id] = txn
                async with self._locked(txn):
                    await self._put(txn)
                    self._epochs[txn.producer_id] = 0
                    return answer(ErrorCode.none, txn.producer_id, 0)
            async with self._locked(txn):
                asked_id = getattr(body, "producer_id", -1)
                asked_epoch = getattr(body, "producer_epoch", -1)
                if asked_id >= 0 and (asked_id, asked_epoch) != (txn.producer_id, txn.producer_epoch):
                    # KIP-360: a producer re-initialising names the id and epoch it had
                    if asked_id != txn.producer_id or asked_epoch > txn.producer_epoch:
                        return answer(ErrorCode.producer_fenced)
                    if asked_epoch < txn.producer_epoch - 1:
                        return answer(ErrorCode.producer_fenced)
                if txn.state in (PREPARE_COMMIT, PREPARE_ABORT) or txn.prepared is not None:
                    await self._complete(txn)
                # A new incarnation: the epoch bumped fences the previous one, whose open
                # transaction is aborted (with the new epoch, as Kafka's coordinator does).
                if txn.producer_epoch + 1 >= EPOCH_MAX:
                    if txn.state == ONGOING:
                        # Its records and open ranges are under this producer id: abort under it
                        # (fenced at the last epoch) before the id changes, or no marker would
                        # close those ranges and the LSO would stay below them for ever.
                        txn.producer_epoch = EPOCH_MAX
                        self._epochs[txn.producer_id] = EPOCH_MAX
                        await self._end(txn, commit=False)
                    txn.producer_id, txn.producer_epoch = self.intake.new_producer_id(), 0
                    self._producers[txn.producer_id] = txn
                else:
                    txn.producer_epoch += 1
                self._epochs[txn.producer_id] = txn.producer_epoch
                txn.timeout_ms = timeout_ms
                if txn.state == ONGOING:
                    await self._end(txn, commit=False)
                else:
                    txn.state = EMPTY
                    await self._put(txn)
                return answer(ErrorCode.none, txn.producer_id, txn.producer_epoch)
        except LevelZeroError as exc:
            log.warning("InitProducerId for %r failed: %s", tid, exc)
            return answer(ErrorCode.coordinator_not_available)

    async def _checked(self, tid: str, producer_id: int, epoch: int) -> tuple[ErrorCode, TxnState | None]:
        if not self.cluster.coordinates(tid):
            return ErrorCode.not_coordinator, None
        await self._load()
        txn = self._txns.get(tid)
        if txn is None or txn.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping, None
        if epoch != txn.producer_epoch:
            return ErrorCode.producer_fenced, None
        return ErrorCode.none, txn

    async def _markers_queued(self, txn: TxnState) -> None:
        """(The lock held.) Before the next transaction begins: the previous one's markers
        queued in the lanes (by its completion task, or here if that has not run yet), so the
        next one's records follow them. Markers that cannot be queued (a partition led elsewhere)
        or held (test use): it stays prepared, and the next transaction is answered
        CONCURRENT_TRANSACTIONS (as Kafka's coordinator answers while PREPARE_*)."""
        if txn.state in (PREPARE_COMMIT, PREPARE_ABORT) and not self.hold_markers:
            try:
                await self._prepare(txn)
            except LevelZeroError as exc:  # still prepared: CONCURRENT_TRANSACTIONS, retried
                log.warning("transaction %r: queueing its markers failed: %s", txn.transactional_id, exc)

    @staticmethod
    def _fenced(txn: TxnState, epoch: int) -> ErrorCode | None:
        """PRODUCER_FENCED if the epoch was bumped since `_checked` (the transaction's last
        AddPartitionsToTxn commit failed, or a completion found records of a transaction never
        registered after its markers), else None."""
        return ErrorCode.producer_fenced if txn.producer_epoch != epoch else None

    async def _begin(self, txn: TxnState) -> ErrorCode:
        """The transaction is (or becomes) ongoing; errors for a state that cannot take more."""
        if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
            return ErrorCode.concurrent_transactions
        if txn.state != ONGOING:
            txn.state = ONGOING
            txn.started_at = self.clock()
            txn.partitions, txn.groups = [], {}
        return ErrorCode.none

    async def add_partitions(self, request: Request) -> Any:
        m = request.response_module
        body = request.body
        topics = [(t.name, list(t.partitions)) for t in body.v3_and_below_topics]
        code = await self._add_partitions(
            body.v3_and_below_transactional_id,
            body.v3_and_below_producer_id,
            body.v3_and_below_producer_epoch,
            [(name, p) for name, parts in topics for p in parts],
        )
        results = tuple(
            make(
                m.AddPartitionsToTxnTopicResult,
                name=name,
                results_by_partition=tuple(
                    make(m.AddPartitionsToTxnPartitionResult, partition_index=p, partition_error_code=code)
                    for p in parts
                ),
            )
            for name, parts in topics
        )
        return make(m.AddPartitionsToTxnResponse, throttle_time=0, results_by_topic_v3_and_below=results)

    async def _add_partitions(
        self, tid: str, producer_id: int, epoch: int, partitions: list[tuple[str, int]]
    ) -> ErrorCode:
        try:
            code, txn = await self._checked(tid, producer_id, epoch)
            if txn is None:
                return code
            known = self.intake.node.topics()
            for topic, partition in partitions:
                if topic not in known or not 0 <= partition < known[topic]:
                    return ErrorCode.unknown_topic_or_partition
            async with self._locked(txn):
                if txn.producer_epoch != epoch:  # fenced meanwhile (its last commit failed)
                    return ErrorCode.producer_fenced
                await self._markers_queued(txn)
                return await self._add_partitions_locked(txn, partitions)
        except LevelZeroError as exc:
            log.warning("AddPartitionsToTxn for %r failed: %s", tid, exc)
            return ErrorCode.coordinator_not_available

    async def _add_partitions_locked(self, txn: TxnState, partitions: list[tuple[str, int]]) -> ErrorCode:
        """The partitions join the transaction, their ranges opened at their high watermarks
        (the last stable offset holds there from now on, at or below the transaction's first
        records), stored with the state in one commit: answered before it is durable, the
        records there waiting for it (`Registration`), unless a partition is led elsewhere.
        Partitions already in an ongoing transaction need nothing stored (as Kafka's
        coordinator answers at once)."""
        before = txn.state, txn.started_at, list(txn.partitions), dict(txn.groups)
        code = await self._begin(txn)
        if code != ErrorCode.none:
            return code
        new = [tp for tp in dict.fromkeys(partitions) if tp not in txn.partitions]
        if not new and before[0] == ONGOING:
            return ErrorCode.none
        for topic, partition in new:  # loaded first: no await between reading a high
            await self.index.get(topic, partition)  # watermark and opening a range there
        ranges = []
        for topic, partition in new:
            try:
                _, high_watermark = self.intake.offsets(topic, partition)
            except LevelZeroError:
                continue  # led elsewhere: its first produce there opens its range
            ranges.append(TxnRangeRow(topic, partition, txn.producer_id, high_watermark, -1, False))
        opened = await self.index.holding(ranges)
        txn.partitions.extend(new)
        if self._tg is None or len(ranges) < len(new):
            # (Not running, or a partition led elsewhere, whose records do not wait here:
            # stored before the answer.)
            try:
                row = txn.row(self.clock())
                await self.store.put_transaction(row, opened=opened)
                txn.updated_at = row.updated_at
            except BaseException:
                self.index.release(opened)
                txn.state, txn.started_at, txn.partitions, txn.groups = before
                raise
            return ErrorCode.none
        # Answered now, stored by a task: the client's records (which wait for it before they
        # are submitted) are on their way meanwhile; see `Registration`.
        # A partition where the previous transaction's range is still open (it completes only
        # once this commit is durable) and its marker queued ahead in the lane: the LSO holds
        # below the records anyway and they follow the marker, so they need not wait (KIP-890's
        # idea: the partition reaches durability with the records). A crash before this commit
        # leaves them after the previous transaction's marker, taken up from the data and
        # aborted by the restart (`_queue_markers`, `_store_completion`).
        prepared = txn.prepared
        held = frozenset(
            tp
            for tp in new
            if prepared is not None and tp in prepared.firsts and prepared.queued(tp) is not None
        )
        registration = Registration(frozenset(new) - held, held)
        txn.registering = registration
        self._tg.start_soon(self._register, txn, registration, txn.row(self.clock()), opened, before)
        return ErrorCode.none

    async def add_offsets(self, request: Request) -> Any:
        body = request.body
        try:
            code, txn = await self._checked(body.transactional_id, body.producer_id, body.producer_epoch)
            if txn is not None:
                async with self._locked(txn):
                    await self._markers_queued(txn)
                    code = self._fenced(txn, body.producer_epoch) or await self._begin(txn)
                    if code == ErrorCode.none:
                        txn.groups.setdefault(body.group_id, [])
                        await self._put(txn)
        except LevelZeroError as exc:
            log.warning("AddOffsetsToTxn for %r failed: %s", body.transactional_id, exc)
            code = ErrorCode.coordinator_not_available
        return make(request.response_module.AddOffsetsToTxnResponse, throttle_time=0, error_code=code)

    async def txn_offset_commit(self, request: Request) -> Any:
        """The offsets wait in the transaction (stored with its state) until it commits."""
        m = request.response_module
        body = request.body
        try:
            code, txn = await self._checked(body.transactional_id, body.producer_id, body.producer_epoch)
            if txn is not None:
                # v3+ (KIP-447): the consumer's group metadata, fenced as Kafka's group
                # coordinator fences a transactional offset commit (defaults: not checked)
                code = await self.groups.load(body.group_id)
            if txn is not None and code == ErrorCode.none:
                code = self.groups.check_commit(
                    body.group_id,
                    getattr(body, "member_id", ""),
                    getattr(body, "generation_id", -1),
                    getattr(body, "group_instance_id", None),
                    transactional=True,
                )
            if txn is not None and code == ErrorCode.none:
                async with self._locked(txn):
                    if txn.producer_epoch != body.producer_epoch:
                        code = ErrorCode.producer_fenced
                    elif txn.state != ONGOING or body.group_id not in txn.groups:
                        code = ErrorCode.invalid_txn_state
                    else:
                        pending = {(e[0], e[1]): e for e in txn.groups[body.group_id]}
                        for topic in body.topics:
                            for p in topic.partitions:
                                pending[(topic.name, p.partition_index)] = (
                                    topic.name,
                                    p.partition_index,
                                    p.committed_offset,
                                    p.committed_metadata or "",
                                    getattr(p, "committed_leader_epoch", NO_EPOCH),  # v2+
                                )
                        txn.groups[body.group_id] = sorted(pending.values())
                        await self._put(txn)
        except LevelZeroError as exc:
            log.warning("TxnOffsetCommit for %r failed: %s", body.transactional_id, exc)
            code = ErrorCode.coordinator_not_available
        topics = tuple(
            make(
                m.TxnOffsetCommitResponseTopic,
                name=topic.name,
                partitions=tuple(
                    make(
                        m.TxnOffsetCommitResponsePartition, partition_index=p.partition_index, error_code=code
                    )
                    for p in topic.partitions
                ),
            )
            for topic in body.topics
        )
        return make(m.TxnOffsetCommitResponse, throttle_time=0, topics=topics)

    async def end_txn(self, request: Request) -> Any:
        body = request.body
        try:
            code, txn = await self._checked(body.transactional_id, body.producer_id, body.producer_epoch)
            if txn is not None:
                async with self._locked(txn):
                    code = self._fenced(txn, body.producer_epoch) or await self._end_checked(
                        txn, body.committed, body.producer_epoch
                    )
        except LevelZeroError as exc:
            log.warning("EndTxn for %r failed: %s", body.transactional_id, exc)
            code = ErrorCode.coordinator_not_available
        return make(request.response_module.EndTxnResponse, throttle_time=0, error_code=code)

    async def _end_checked(self, txn: TxnState, commit: bool, epoch: int) -> ErrorCode:
        # Kafka's handleEndTransaction: a retry of an ending that completed is answered as done
        if txn.state == (COMPLETE_COMMIT if commit else COMPLETE_ABORT):
            return ErrorCode.none
        if txn.state == (PREPARE_COMMIT if commit else PREPARE_ABORT):
            # A retry of the prepared transaction's EndTxn, or (after a restart) the next
            # transaction's, its AddPartitionsToTxn never durable: the completion then finds its
            # records after the markers and fences it (`_store_completion`), and this EndTxn
            # is answered so, never as the prepared one's (single-node seed 33361: a commit
            # answered, its records then aborted).
            await self._complete(txn)
            return self._fenced(txn, epoch) or ErrorCode.none
        if txn.state != ONGOING:
            return ErrorCode.invalid_txn_state
        if not await self._end(txn, commit, wait=False):
            return ErrorCode.producer_fenced
        return ErrorCode.none
