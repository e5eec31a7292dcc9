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
InitProducerId, AddPartitionsToTxn (only when it adds partitions: one commit per request, which
also opens the new partitions' ranges, at their high watermarks then: at or below the
transaction's first records there, so the last stable offset never passes an open
transaction), AddOffsetsToTxn, TxnOffsetCommit and PREPARE_COMMIT/PREPARE_ABORT are stored
before the answer. EndTxn answers once PREPARE_* is durable (the decision cannot be lost: a
restart completes it); the coordinator then writes the markers (through each partition's lane,
behind every record set the transaction submitted; a produce of a transaction that is not
ongoing is refused) and stores COMPLETE_* with the ranges closed, in one commit (an aborted
range keeps its abort marker's offset). Until that commit the ranges hold the last stable
offsets, so read_committed readers see the transaction whole or not at all. AddPartitionsToTxn
and AddOffsetsToTxn of the next transaction wait for the completion (Kafka's coordinator answers
CONCURRENT_TRANSACTIONS, which clients retry after a backoff), so its ranges open above the
markers. The offsets a transaction commits are stored with its completion too: until then
OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them (`pending_offsets`,
KIP-447, as Kafka), and one without completes a committed transaction holding the group's
offsets before it answers (`wait_offsets_stable`). TxnOffsetCommit v3+ is fenced by the
consumer's group metadata as an offset commit is (`GroupCoordinator.check_txn_commit`).

Restart (Kafka's TransactionStateManager load): a transaction found in PREPARE_COMMIT or
PREPARE_ABORT is completed (its markers written again where its ranges are still open: a
second marker is harmless); one found ONGOING is aborted when its timeout expires, as the
coordinator does for a transaction whose producer went away.

Limits: the coordinator writes markers through this node, so in a cluster every partition of a
transaction must be led by the transaction's coordinator node (a marker for a partition led
elsewhere fails: the transaction stays prepared, completed by the coordinator's pass once the
partition is led here, and the id's next transaction waits for it, then is answered
CONCURRENT_TRANSACTIONS); a produce's epoch is checked against the coordinator of this node
only. KIP-890's server-side verification is not implemented.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
from kio.schema.errors import ErrorCode

from levelzero.actors.intake import ProduceIntake
from levelzero.core.errors import LevelZeroError
from levelzero.core.l0format import Record
from levelzero.kafka.epochs import NO_EPOCH
from levelzero.kafka.groups import GroupCoordinator
from levelzero.kafka.metadata import Cluster
from levelzero.kafka.protocol import Request, make
from levelzero.kafka.records import TXN_HEADER
from levelzero.storage.protocols import MemoryTransactionStore, TransactionRow, TransactionStore, TxnRangeRow

log = logging.getLogger("levelzero.kafka")

_TXN_VALUE = struct.Struct(">qhb")  # producer id, producer epoch, kind
KIND_DATA = -1
KIND_ABORT = 0  # Kafka's control record types
KIND_COMMIT = 1
TRANSACTION_TIMEOUT_MAX_MS = 900_000  # Kafka's transaction.max.timeout.ms default
EXPIRY_CHECK_S = 1.0
# AddPartitionsToTxn, AddOffsetsToTxn wait at most this long for the previous transaction's
# markers (EndTxn answers before they are written), then answer CONCURRENT_TRANSACTIONS, which
# clients retry, as Kafka's coordinator answers at once.
COMPLETION_WAIT_S = 10.0
# Test use only: a daemon started with this set to 1 never writes a transaction's markers (its
# transactions stay prepared until a restart without it completes them).
HOLD_MARKERS_ENV = "LEVELZERO_TEST_HOLD_TXN_MARKERS"
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


def marker_record(producer_id: int, producer_epoch: int, commit: bool) -> Record:
    """A commit/abort marker as stored (encoded as Kafka's control record on fetch)."""
    kind = KIND_COMMIT if commit else KIND_ABORT
    return Record(
        struct.pack(">hh", 0, kind),
        struct.pack(">hi", 0, 0),  # version, coordinator epoch
        int(time.time() * 1000),
        (txn_header(producer_id, producer_epoch, kind),),
    )


def has_reserved_header(records: Sequence[Record]) -> bool:
    return any(r.headers and any(name == TXN_HEADER for name, _ in r.headers) for r in records)


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
    says a partition's log start offset, None where this node does not serve it."""

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

    def forget(self, topic: str) -> None:
        for key in [k for k in self._partitions if k[0] == topic]:
            del self._partitions[key]


@dataclass(slots=True)
class TxnState:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    started_at: float = 0.0
    partitions: list[tuple[str, int]] = field(default_factory=list)
    # group id -> [(topic, partition, offset, metadata, leader epoch)] committed with the
    # transaction
    groups: dict[str, list[tuple[str, int, int, str, int]]] = field(default_factory=dict)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    # Set once the prepared transaction's markers are written and it is complete (None: no
    # completion under way in this process).
    completed: anyio.Event | None = None

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
        )


def _pending_offset(entry: list[Any]) -> tuple[str, int, int, str, int]:
    """An offset a transaction holds, as stored: entries stored before the leader epoch was
    kept have four fields."""
    topic, partition, offset, metadata, *epoch = entry
    return topic, partition, offset, metadata, epoch[0] if epoch else NO_EPOCH


class TransactionCoordinator:
    """The transaction coordinator of the transactional ids this node coordinates."""

    def __init__(
        self,
        intake: ProduceIntake,
        groups: GroupCoordinator,
        cluster: Cluster,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.intake = intake
        self.groups = groups
        self.cluster = cluster
        self.clock = clock
        store = intake.node.log_store
        self.store: TransactionStore = (
            store if isinstance(store, TransactionStore) else MemoryTransactionStore()
        )
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

    async def run(self) -> None:
        """Aborts expired transactions (and completes those a restart left prepared), and
        forgets aborted ranges below partitions' log start offsets; runs until cancelled. Ended
        transactions are completed (their markers written) in its task group."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                while True:
                    try:
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

    async def expire(self) -> None:
        await self._load()
        now = self.clock()
        for txn in list(self._txns.values()):
            if not self.cluster.coordinates(txn.transactional_id):
                continue
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                async with txn.lock:
                    if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                        await self._complete(txn)
            elif txn.state == ONGOING and now > txn.started_at + txn.timeout_ms / 1000:
                async with txn.lock:
                    if txn.state == ONGOING and self.clock() > txn.started_at + txn.timeout_ms / 1000:
                        log.info("transaction %r timed out: aborting", txn.transactional_id)
                        txn.producer_epoch += 1  # fences the producer (KIP-360 lets it re-init)
                        self._epochs[txn.producer_id] = txn.producer_epoch
                        await self._end(txn, commit=False)

    # ------------------------------------------------------------------ what produce asks

    def produce_error(self, producer_id: int, producer_epoch: int) -> ErrorCode:
        """A transactional record set of an epoch older than the producer id's: fenced. One of
        a producer whose transaction is not ongoing here (ended: its markers may still be on
        their way, and records after them must open a range of their own, which only
        AddPartitionsToTxn of the next transaction does): INVALID_TXN_STATE."""
        current = self._epochs.get(producer_id)
        if current is not None and producer_epoch < current:
            return ErrorCode.invalid_producer_epoch
        txn = self._producers.get(producer_id)
        if txn is not None and txn.producer_id == producer_id and txn.state != ONGOING:
            return ErrorCode.invalid_txn_state
        return ErrorCode.none

    async def pending_offsets(self, group_id: str) -> set[tuple[str, int]]:
        """The partitions of `group_id` whose offsets a transaction this node coordinates holds
        and has not completed (ongoing, or prepared with its markers on their way): OffsetFetch
        with require_stable answers UNSTABLE_OFFSET_COMMIT for them (KIP-447), as Kafka's group
        coordinator does while a transactional offset commit is pending (its marker not yet
        written). Raises LevelZeroError when the transactions' state cannot be read."""
        await self._load()
        pending: set[tuple[str, int]] = set()
        for txn in list(self._txns.values()):
            if txn.state not in (ONGOING, PREPARE_COMMIT, PREPARE_ABORT):
                continue
            if not self.cluster.coordinates(txn.transactional_id):
                continue
            pending.update((topic, partition) for topic, partition, *_ in txn.groups.get(group_id, ()))
        return pending

    async def wait_offsets_stable(self, group_id: str) -> None:
        """Before OffsetFetch answers a client that does not ask for stable offsets
        (require_stable false, or OffsetFetch before v7: kafka-python, aiokafka): a committed
        transaction (PREPARE_COMMIT) holding offsets of `group_id` is completed first (or waited
        for, at most COMPLETION_WAIT_S), so a consumer that reads its group's offsets after the
        producer's commit was answered gets them, not the ones before. Kafka answers such a
        client the offsets before the commit until its markers are written; a client that asks
        for stable offsets is answered UNSTABLE_OFFSET_COMMIT at once instead
        (`pending_offsets`) and retries. After a restart this completes a prepared transaction
        at once."""
        try:
            await self._load()
        except LevelZeroError as exc:
            log.warning("OffsetFetch: cannot read the transactions' state: %s", exc)
            return
        for txn in list(self._txns.values()):
            if txn.state != PREPARE_COMMIT or not txn.groups.get(group_id):
                continue
            if not self.cluster.coordinates(txn.transactional_id):
                continue
            with anyio.move_on_after(COMPLETION_WAIT_S):
                async with txn.lock:
                    if txn.state == PREPARE_COMMIT:
                        try:
                            await self._complete(txn)
                        except LevelZeroError as exc:
                            log.warning("transaction %r: completing it failed: %s", txn.transactional_id, exc)

    # ------------------------------------------------------------------ the state machine

    async def _put(self, txn: TxnState) -> None:
        await self.store.put_transaction(txn.row(self.clock()))

    async def _end(self, txn: TxnState, commit: bool, *, wait: bool = True) -> None:
        """PREPARE_* durable, then the markers: written before returning (`wait`), else by a
        task of the coordinator (EndTxn answers once PREPARE_* is durable, as Kafka's does; a
        restart completes a prepared transaction; requests that start the next transaction
        wait for the completion, `_wait_completed`)."""
        txn.state = PREPARE_COMMIT if commit else PREPARE_ABORT
        await self._put(txn)
        txn.completed = anyio.Event()
        if wait or self._tg is None:
            await self._complete(txn)
        else:
            self._tg.start_soon(self._complete_later, txn)

    async def _complete_later(self, txn: TxnState) -> None:
        async with txn.lock:
            if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
                try:
                    await self._complete(txn)
                except LevelZeroError as exc:
                    log.warning(
                        "transaction %r: writing its markers failed (retried): %s", txn.transactional_id, exc
                    )

    async def _wait_completed(self, txn: TxnState) -> None:
        """Until the transaction's completion under way (if any) is done, at most
        COMPLETION_WAIT_S."""
        event = txn.completed
        if event is not None:
            with anyio.move_on_after(COMPLETION_WAIT_S):
                await event.wait()

    async def _complete(self, txn: TxnState) -> None:
        """Markers in every partition (at once), the offsets committed, then COMPLETE_* stored
        with the partitions' ranges closed, in one commit: until then the ranges hold the
        last stable offsets, so read_committed readers see the transaction whole or not at all
        (a crash before the commit: the restart writes the markers again, a second marker is
        harmless)."""
        assert txn.state in (PREPARE_COMMIT, PREPARE_ABORT), txn.state
        if self.hold_markers:
            await anyio.sleep_forever()
        commit = txn.state == PREPARE_COMMIT
        closed: list[TxnRangeRow] = []
        failed: list[LevelZeroError] = []

        async def marker(topic: str, partition: int) -> None:
            try:
                row = await self._write_marker(txn, topic, partition, commit)
            except LevelZeroError as exc:
                if exc.code not in ("unknown_topic", "unknown_partition"):
                    failed.append(exc)  # the transaction stays prepared: retried
                return
            if row is not None:
                closed.append(row)

        async with anyio.create_task_group() as tg:
            for topic, partition in txn.partitions:
                tg.start_soon(marker, topic, partition)
        if failed:
            raise failed[0]
        if commit:
            for group_id, offsets in txn.groups.items():
                if offsets:
                    await self.groups.commit(group_id, offsets)
        prepared = txn.state, txn.partitions, txn.groups, txn.started_at
        txn.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        txn.partitions, txn.groups, txn.started_at = [], {}, 0.0
        try:
            await self.store.put_transaction(txn.row(self.clock()), closed=closed)
        except BaseException:
            txn.state, txn.partitions, txn.groups, txn.started_at = prepared
            raise
        self.index.closed(closed)
        completed, txn.completed = txn.completed, None
        if completed is not None:
            completed.set()

    async def _write_marker(
        self, txn: TxnState, topic: str, partition: int, commit: bool
    ) -> TxnRangeRow | None:
        """The marker stored; the range it closes (None: nothing open there)."""
        txns = await self.index.get(topic, partition)
        first = txns.open.get(txn.producer_id)
        if first is None:
            return None  # nothing was produced there, or its marker is stored already
        # Through the partition's lane: after every record set of the transaction submitted
        # before it ended (a produce is refused once the transaction is not ongoing).
        pending = self.intake.submit(
            topic, partition, [marker_record(txn.producer_id, txn.producer_epoch, commit)], None
        )
        assert not isinstance(pending, int), "a marker has no producer identity"
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return TxnRangeRow(topic, partition, txn.producer_id, first, pending.base_offset, not commit)

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
                async with txn.lock:
                    await self._put(txn)
                    self._epochs[txn.producer_id] = 0
                    return answer(ErrorCode.none, txn.producer_id, 0)
            async with txn.lock:
                asked_id = getattr(body, "producer_id", -1)
                asked_epoch = getattr(body, "producer_epoch", -1)
                if asked_id >= 0 and (asked_id, asked_epoch) != (txn.producer_id, txn.producer_epoch):
                    # KIP-360: a producer re-initialising names the id and epoch it had
                    if asked_id != txn.producer_id or asked_epoch > txn.producer_epoch:
                        return answer(ErrorCode.producer_fenced)
                    if asked_epoch < txn.producer_epoch - 1:
                        return answer(ErrorCode.producer_fenced)
                if txn.state in (PREPARE_COMMIT, PREPARE_ABORT):
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
            await self._wait_completed(txn)
            async with txn.lock:
                return await self._add_partitions_locked(txn, partitions)
        except LevelZeroError as exc:
            log.warning("AddPartitionsToTxn for %r failed: %s", tid, exc)
            return ErrorCode.coordinator_not_available

    async def _add_partitions_locked(self, txn: TxnState, partitions: list[tuple[str, int]]) -> ErrorCode:
        """The partitions join the transaction, their ranges opened at their high watermarks
        (the last stable offset holds there from now on, at or below the transaction's first
        records), stored with the state in one commit. Partitions already in an ongoing
        transaction need nothing stored (as Kafka's coordinator answers at once)."""
        before = txn.state, txn.started_at, list(txn.partitions), dict(txn.groups)
        code = await self._begin(txn)
        if code != ErrorCode.none:
            return code
        new = [tp for tp in dict.fromkeys(partitions) if tp not in txn.partitions]
        if not new and before[0] == ONGOING:
            return ErrorCode.none
        ranges = []
        for topic, partition in new:
            try:
                _, high_watermark = self.intake.offsets(topic, partition)
            except LevelZeroError:
                continue  # led elsewhere: its first produce there opens its range
            ranges.append(TxnRangeRow(topic, partition, txn.producer_id, high_watermark, -1, False))
        opened = await self.index.holding(ranges)
        txn.partitions.extend(new)
        try:
            await self.store.put_transaction(txn.row(self.clock()), opened=opened)
        except BaseException:
            self.index.release(opened)
            txn.state, txn.started_at, txn.partitions, txn.groups = before
            raise
        return ErrorCode.none

    async def add_offsets(self, request: Request) -> Any:
        body = request.body
        try:
            code, txn = await self._checked(body.transactional_id, body.producer_id, body.producer_epoch)
            if txn is not None:
                await self._wait_completed(txn)
                async with txn.lock:
                    code = await self._begin(txn)
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
                code = self.groups.check_txn_commit(
                    body.group_id,
                    getattr(body, "member_id", ""),
                    getattr(body, "generation_id", -1),
                    getattr(body, "group_instance_id", None),
                )
            if txn is not None and code == ErrorCode.none:
                async with txn.lock:
                    if txn.state != ONGOING or body.group_id not in txn.groups:
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
                async with txn.lock:
                    code = await self._end_checked(txn, body.committed)
        except LevelZeroError as exc:
            log.warning("EndTxn for %r failed: %s", body.transactional_id, exc)
            code = ErrorCode.coordinator_not_available
        return make(request.response_module.EndTxnResponse, throttle_time=0, error_code=code)

    async def _end_checked(self, txn: TxnState, commit: bool) -> ErrorCode:
        # Kafka's handleEndTransaction: a retry of an ending that completed is answered as done
        if txn.state == (COMPLETE_COMMIT if commit else COMPLETE_ABORT):
            return ErrorCode.none
        if txn.state == (PREPARE_COMMIT if commit else PREPARE_ABORT):
            await self._complete(txn)
            return ErrorCode.none
        if txn.state != ONGOING:
            return ErrorCode.invalid_txn_state
        await self._end(txn, commit, wait=False)
        return ErrorCode.none
