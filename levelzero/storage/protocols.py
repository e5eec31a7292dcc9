"""What actors need from storage, as protocols. Actors import these, never a concrete adapter;
only `levelzero.daemon` wires SQLite / S3 / local / memory implementations in.

Two stores:
- `ObjectStore`: S3-shaped blob store (S3 via aiobotocore, local directory, memory).
- `LogStore`: the control plane (SQLite, embedded; PostgreSQL, shared), the sum of the roles it
  serves, each its own protocol so a component names only what it uses:
  `PartitionLog` (partitions, terms, logs, snapshots), `EpochStore` (the cluster epoch),
  `L1Metastore` (L1 object lifecycle), `L0Catalog` (L0 objects and GC marks), `EventLog`
  (the event tables the export reads), `ConsumerOffsetStore` and `TopicConfigStore` (each
  topic's Kafka topic configs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol, TypeAlias, runtime_checkable

import msgspec

from levelzero.core.entries import LogRecord
from levelzero.core.errors import NotLeader

DELETE_BATCH_KEYS_MAX = 1000
LIST_PAGE_KEYS_MAX = 1000


# --------------------------------------------------------------------------- object store


class ObjectInfo(msgspec.Struct, frozen=True):
    key: str
    size: int
    last_modified: float  # unix seconds


class ListPage(msgspec.Struct, frozen=True):
    objects: list[ObjectInfo]
    # Pass as `start_after` to get the next page; None when the listing is complete.
    next_start_after: str | None


class DeleteResult(msgspec.Struct, frozen=True):
    deleted: list[str]
    errors: dict[str, str]  # key -> error code/message; these keys were NOT deleted


@runtime_checkable
class ObjectStore(Protocol):
    """S3-shaped contract. Keys are non-empty, relative, without `..` segments."""

    async def put(self, key: str, data: bytes | bytearray) -> None: ...

    async def get(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Whole object, or `length` bytes from `offset`. Raises ObjectNotFound."""
        ...

    async def head(self, key: str) -> ObjectInfo | None: ...

    async def list_page(
        self, prefix: str, start_after: str | None = None, limit: int = LIST_PAGE_KEYS_MAX
    ) -> ListPage:
        """Keys starting with `prefix`, strictly after `start_after`, in lexicographic order."""
        ...

    async def delete_many(self, keys: Sequence[str]) -> DeleteResult:
        """Delete <= DELETE_BATCH_KEYS_MAX keys; a missing key counts as deleted."""
        ...

    async def aclose(self) -> None: ...


async def iter_objects(
    store: ObjectStore, prefix: str, start_after: str | None = None
) -> AsyncIterator[ObjectInfo]:
    """Every object under `prefix`, page by page, in key order."""
    while True:
        page = await store.list_page(prefix, start_after)
        for obj in page.objects:
            yield obj
        if page.next_start_after is None:
            return
        start_after = page.next_start_after


# --------------------------------------------------------------------------- log store


class PartitionRow(msgspec.Struct, frozen=True):
    pid: int  # store-wide partition id
    topic: str
    partition: int
    creation_epoch: int
    term: int  # current term (0 before the first leader)
    created_at: float


class Append(msgspec.Struct, frozen=True):
    """One partition's part of `LogStore.append_many`: what `append` takes. (One per partition
    per call: a msgspec struct is made in C, a named tuple in Python.)"""

    pid: int
    expected_term: int
    records: Sequence[LogRecord]


# Told that `appends[index]` of an `append_many` is durable (refusal None) or was refused.
OnDurable: TypeAlias = Callable[[int, NotLeader | None], None]


def tell_each(refused: Sequence[NotLeader | None], on_durable: OnDurable | None) -> None:
    """`append_many`'s `on_durable` for a store that settles the whole call at once: every
    append, in order, once it all is durable. The first exception is raised after all are told."""
    if on_durable is None:
        return
    failure: Exception | None = None
    for index, refusal in enumerate(refused):
        try:
            on_durable(index, refusal)
        except Exception as error:  # noqa: BLE001 - raised once all are told
            failure = failure or error
    if failure is not None:
        raise failure


class Snapshot(msgspec.Struct, frozen=True):
    pid: int
    log_offset: int  # last log offset the snapshot includes
    data: bytes


class L1State:
    COPY_STARTED = "COPY_STARTED"
    COPY_FINISHED = "COPY_FINISHED"
    DELETE_STARTED = "DELETE_STARTED"
    DELETE_FINISHED = "DELETE_FINISHED"
    ALL = (COPY_STARTED, COPY_FINISHED, DELETE_STARTED, DELETE_FINISHED)


class L1Row(msgspec.Struct, frozen=True):
    key: str
    pid: int
    base_offset: int
    last_offset: int
    last_log_offset: int  # LRLO this object reconciles up to
    term: int
    size: int
    state: str
    created_at: float
    updated_at: float
    # The largest record timestamp in the object (-1: no record has one): ListOffsets by time
    # reads only the object that holds its answer. None: a row written before the column
    # existed (SQLite schema 8, PostgreSQL migration 11), or recovered from the bucket without
    # reading the object; a lookup reads that object to find out (`core/time_lookup.py`).
    max_timestamp_ms: int | None = None

    @classmethod
    def copy_started(
        cls,
        key: str,
        pid: int,
        base_offset: int,
        last_offset: int,
        last_log_offset: int,
        term: int,
        size: int,
        now: float,
        max_timestamp_ms: int,
    ) -> L1Row:
        """The row of a new L1 object about to be uploaded (a reconciler's copy, a compaction
        result): COPY_STARTED, created and updated `now`."""
        return cls(
            key,
            pid,
            base_offset,
            last_offset,
            last_log_offset,
            term,
            size,
            L1State.COPY_STARTED,
            now,
            now,
            max_timestamp_ms,
        )


class CompactionCommit(msgspec.Struct, frozen=True):
    """A compaction result: the new L1 objects (recorded COPY_STARTED, uploaded) that replace
    the superseded ones (COPY_FINISHED), and the cleaner-offset map its writer claims."""

    pid: int
    writer_term: int
    cleaner_offsets: dict[int, int]
    new_keys: tuple[str, ...]
    superseded_keys: tuple[str, ...]


class CompactionState(msgspec.Struct, frozen=True):
    """A partition's accepted cleaner-offset map and the L1 objects compaction wrote."""

    cleaner_offsets: dict[int, int]
    compacted_keys: frozenset[str]


class L0ObjectRow(msgspec.Struct, frozen=True):
    key: str
    epoch: int
    size: int
    created_at: float
    extents: int
    deleted_at: float | None = None
    deleted_at_m: int | None = None  # the GC watermark M when it was deleted


class GcRoundRow(msgspec.Struct, frozen=True):
    round_id: int
    started_at: float
    finished_at: float
    cluster_epoch: int
    m: int | None
    dry_run: bool
    listed: int
    deleted: int
    deleted_bytes: int
    too_young: int
    above_m: int
    errors: int
    blocked_by: str | None  # why no deletes (e.g. partition without M(p)); None when not blocked


class FenceEventRow(msgspec.Struct, frozen=True):
    """`decisions` fence decisions of one partition leader with the same term, epoch, outcome
    and window, gathered between two flushes; `at` is when the first of them was made."""

    at: float
    pid: int
    term: int
    epoch: int
    outcome: str  # admitted | admitted_new_epoch | rejected
    window_min: int | None
    window_max: int | None
    decisions: int = 1


class StateSampleRow(msgspec.Struct, frozen=True):
    at: float
    pid: int
    term: int
    previous_applied_epoch: int | None
    max_applied_epoch: int | None
    min_epoch_lower_bound: int | None
    mp: int | None
    lro: int
    high_watermark: int
    start_offset: int


class OffsetRow(msgspec.Struct, frozen=True):
    """A consumer group's committed offset for one partition (Kafka's OffsetCommit)."""

    group_id: str
    topic: str
    partition: int
    committed_offset: int
    metadata: str
    committed_at: float
    # The leader epoch of the record the offset follows, as the consumer committed it (KIP-320;
    # -1: not given, or committed before the column existed).
    leader_epoch: int = -1


@runtime_checkable
class ConsumerOffsetStore(Protocol):
    """The consumer-offsets role of the control plane: durable on return, last write wins."""

    async def commit_offsets(self, rows: Sequence[OffsetRow]) -> None: ...

    async def committed_offsets(self, group_id: str) -> list[OffsetRow]:
        """Every partition's committed offset of `group_id`, in (topic, partition) order."""
        ...

    async def offset_groups(self) -> list[str]:
        """The groups with at least one committed offset, in order (Kafka's ListGroups shows
        them as empty groups)."""
        ...

    async def delete_offsets(self, group_id: str, partitions: Sequence[tuple[str, int]] | None) -> None:
        """Durable on return: the committed offsets of `group_id` for `partitions` (topic,
        partition), or all of them when None (DeleteGroups, OffsetDelete)."""
        ...

    async def expire_offsets(self, group_id: str, committed_before: float) -> None:
        """Durable on return: the committed offsets of `group_id` committed before
        `committed_before` (wall clock) deleted, those committed since kept (a commit racing the
        expiry survives it): Kafka's offsets.retention.minutes."""
        ...

    async def store_group_metadata(self, group_id: str, metadata: bytes | None, now: float) -> None:
        """Durable on return: the group's metadata (the group coordinator's encoding, opaque
        here), replacing what was stored; None forgets the group (DeleteGroups)."""
        ...

    async def group_metadata(self, group_id: str) -> bytes | None:
        """The group's metadata as last stored, or None."""
        ...

    async def metadata_groups(self) -> list[str]:
        """The groups with metadata stored, in order (ListGroups loads them after a restart,
        as a Kafka coordinator loads its groups when it takes over)."""
        ...


@runtime_checkable
class TopicConfigStore(Protocol):
    """Each topic's topic configs (Kafka's: name -> value, as text, checked by the caller with
    `core.topic_configs`); a topic without any has none stored."""

    async def topic_configs(self, topic: str | None = None) -> dict[str, dict[str, str]]:
        """Topic -> its configs, for the topics that have any (`topic`: that one only)."""
        ...

    async def set_topic_configs(self, topic: str, configs: Mapping[str, str], now: float) -> None:
        """Replace the topic's whole set at once, durable on return. Raises UnknownTopic if
        the topic does not exist."""
        ...


class LogStoreStatistics(msgspec.Struct, frozen=True):
    """A snapshot of the writer's counters (immutable; call `statistics()` again for news)."""

    batches: int  # batches the writer executed
    commits: int  # batches that committed
    jobs: int  # write calls resolved by a committed batch (accepted or rejected)
    appends: int  # append calls committed
    records: int  # log records committed (appends and TermStarts)
    rejected_appends: int  # appends refused with NotLeader / InvariantViolation
    largest_batch_records: int
    queued: int  # write jobs waiting for the writer right now
    queue_max: int
    failed: bool  # the store refuses writes (SQLite failed mid-batch; until the daemon restarts)


class ProducerBatchRow(msgspec.Struct, frozen=True):
    """A batch an idempotent Kafka producer had stored: its sequence and where it went."""

    producer_id: int
    producer_epoch: int
    topic: str
    partition: int
    base_sequence: int
    record_count: int
    base_offset: int
    stored_at: float


@runtime_checkable
class ProducerBatchStore(Protocol):
    """An optional role (the SQLite and PostgreSQL stores have it): idempotent producers' last
    batches per partition, kept durably so a retry after a restart is still recognised."""

    async def record_producer_batches(self, rows: Sequence[ProducerBatchRow], keep: int) -> None:
        """Durable on return; per (producer, topic, partition) only the `keep` newest remain."""
        ...

    async def producer_batches(self, producer_id: int) -> list[ProducerBatchRow]: ...


@runtime_checkable
class ProducerBatchExpiry(Protocol):
    """An optional role beside ProducerBatchStore (the SQLite and PostgreSQL stores have it):
    batches of producers in a range of ids (HTTP idempotency keys' producers, one per key;
    Kafka producers, one per producer instance) forgotten once old, so the table does not grow
    with every key and producer ever used."""

    async def expire_producer_batches(
        self, producer_id_min: int, stored_before: float, rows_max: int, producer_id_below: int = 2**63 - 1
    ) -> None:
        """Durable on return: batches of producers `producer_id_min` and up (below
        `producer_id_below`) stored before `stored_before` are gone, the oldest first, at most
        `rows_max` of them."""
        ...


class TransactionRow(msgspec.Struct, frozen=True):
    """A Kafka transactional id's coordinator state (Kafka's TransactionMetadata): the producer
    id and epoch it holds, where its transaction is (`state`: empty, ongoing, prepare_commit,
    prepare_abort, complete_commit, complete_abort), and what the open one touched."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    timeout_ms: int
    started_at: float  # when the open transaction began (0: none open)
    partitions: str  # JSON [[topic, partition], ...] added to the open transaction
    groups: str  # JSON [group id, ...] whose offsets the open transaction commits
    updated_at: float
    # JSON of the previous transaction, prepared, whose markers are being written while this
    # one is ongoing ({"state", "epoch", "partitions", "groups", "firsts"}); "" when none
    prepared: str = ""


class TxnRangeRow(msgspec.Struct, frozen=True):
    """One transaction's records in one partition: from its first offset, open (last_offset
    -1: it holds the partition's last stable offset back) or aborted (up to its abort marker,
    which read_committed fetches list). Committed ranges are forgotten."""

    topic: str
    partition: int
    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@runtime_checkable
class TransactionStore(Protocol):
    """An optional role (the SQLite and PostgreSQL stores have it; the Kafka listener keeps the
    same in memory without it): transaction coordinators' state and partitions' open and
    aborted transaction ranges, durable on return."""

    async def put_transaction(
        self, row: TransactionRow, opened: Sequence[TxnRangeRow] = (), closed: Sequence[TxnRangeRow] = ()
    ) -> None:
        """Store a transactional id's state, and in the same commit open the ranges `opened`
        (as `open_txn_range`) and close the ranges `closed` (as `close_txn_range`, each by its
        first offset, with its last offset and whether it aborted)."""
        ...

    async def transactions(self) -> list[TransactionRow]: ...

    async def expire_transaction(self, transactional_id: str, updated_at: float) -> None:
        """Forget a transactional id (Kafka's transactional.id.expiration.ms) if its row is the
        one stored at `updated_at` (a row stored since, by another node that coordinates it
        now, stays); durable on return."""
        ...

    async def open_txn_range(self, row: TxnRangeRow) -> None:
        """Insert an open range (a range already there is kept)."""
        ...

    async def close_txn_range(
        self, topic: str, partition: int, producer_id: int, first_offset: int, last_offset: int, aborted: bool
    ) -> None:
        """An aborted range gets its last offset; a committed one is forgotten."""
        ...

    async def txn_ranges(self, topic: str, partition: int) -> list[TxnRangeRow]:
        """The partition's open and aborted ranges, by first offset."""
        ...

    async def prune_txn_ranges(self, topic: str, partition: int, below: int) -> None:
        """Forget the partition's aborted ranges that end below `below` (its log start offset:
        no fetch reaches them any more)."""
        ...


class MemoryTransactionStore:
    """`TransactionStore` in memory (the memory log store's, and a store without the role)."""

    def __init__(self) -> None:
        self._transactions: dict[str, TransactionRow] = {}
        self._ranges: dict[tuple[str, int, int, int], TxnRangeRow] = {}

    async def put_transaction(
        self, row: TransactionRow, opened: Sequence[TxnRangeRow] = (), closed: Sequence[TxnRangeRow] = ()
    ) -> None:
        self._transactions[row.transactional_id] = row
        for r in opened:
            await self.open_txn_range(r)
        for r in closed:
            await self.close_txn_range(
                r.topic, r.partition, r.producer_id, r.first_offset, r.last_offset, r.aborted
            )

    async def transactions(self) -> list[TransactionRow]:
        return [self._transactions[k] for k in sorted(self._transactions)]

    async def expire_transaction(self, transactional_id: str, updated_at: float) -> None:
        row = self._transactions.get(transactional_id)
        if row is not None and row.updated_at == updated_at:
            del self._transactions[transactional_id]

    async def open_txn_range(self, row: TxnRangeRow) -> None:
        self._ranges.setdefault((row.topic, row.partition, row.producer_id, row.first_offset), row)

    async def close_txn_range(
        self, topic: str, partition: int, producer_id: int, first_offset: int, last_offset: int, aborted: bool
    ) -> None:
        key = (topic, partition, producer_id, first_offset)
        if aborted:
            self._ranges[key] = TxnRangeRow(topic, partition, producer_id, first_offset, last_offset, True)
        else:
            self._ranges.pop(key, None)

    def forget_topic_ranges(self, topic: str) -> None:
        """The topic was deleted: its partitions' ranges go, as the SQL stores' `delete_topic`
        deletes them."""
        for key in [k for k in self._ranges if k[0] == topic]:
            del self._ranges[key]

    async def txn_ranges(self, topic: str, partition: int) -> list[TxnRangeRow]:
        rows = [r for (t, p, _, _), r in self._ranges.items() if (t, p) == (topic, partition)]
        return sorted(rows, key=lambda r: (r.first_offset, r.producer_id))

    async def prune_txn_ranges(self, topic: str, partition: int, below: int) -> None:
        for key, row in list(self._ranges.items()):
            if (row.topic, row.partition) == (topic, partition) and row.aborted and row.last_offset < below:
                del self._ranges[key]


@runtime_checkable
class PartitionLog(Protocol):
    """Partitions, their terms, their logs and snapshots."""

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        creation_epoch: int,
        now: float,
        configs: Mapping[str, str] | None = None,
    ) -> list[PartitionRow]:
        """Raises TopicExists if the topic exists. `configs` (its topic configs, checked by the
        caller: `core.topic_configs`) are stored in the same transaction."""
        ...

    async def list_partitions(self) -> list[PartitionRow]: ...

    async def add_partitions(
        self, topic: str, count: int, creation_epoch: int, now: float
    ) -> list[PartitionRow]:
        """Grow the topic to `count` partitions; the new rows, in partition order. Their
        creation epoch is at least the stored cluster epoch, as `create_topic`'s. Raises
        UnknownTopic, or InvalidInput unless `count` is above the topic's partition count."""
        ...

    async def delete_topic(self, topic: str, now: float) -> list[PartitionRow]:
        """Delete the topic in one transaction: its partitions leave the partition set (and
        with it the GC's watermark snapshot, leases and published M(p)); their logs,
        snapshots, committed consumer offsets and idempotent producers' batches go. Each is
        kept as a *deleted partition* until its L1 objects are collected
        (`deleted_partitions`, `forget_deleted_partition`). A partition id is never given
        again, and an append, term start, snapshot or L1 insert naming a deleted one raises
        PartitionDeleted (a NotLeader). Returns the deleted rows; raises UnknownTopic."""
        ...

    async def deleted_partitions(self) -> list[PartitionRow]:
        """Deleted partitions whose L1 objects are not all collected yet, in pid order."""
        ...

    async def forget_deleted_partition(self, pid: int) -> bool:
        """Drop a deleted partition's L1 rows and mark it collected, if every one of those rows
        is DELETE_FINISHED; False (nothing changed) otherwise."""
        ...

    async def begin_term(self, pid: int, log_offset: int, base_offset: int, at_least: int = 0) -> LogRecord:
        """Atomically term = max(term + 1, `at_least`) and append `TermStart(term)` at
        `log_offset`. Durable on return. (`at_least`: recovery starts a term above every term
        an L1 object in the bucket names, `daemon/recover.py`.)"""
        ...

    async def append(self, pid: int, expected_term: int, records: Sequence[LogRecord]) -> None:
        """Group-committed, durable on return. Raises NotLeader if the term moved on.
        Records must continue the log contiguously and carry `expected_term`."""
        ...

    async def append_many(
        self, appends: Sequence[Append], on_durable: OnDurable | None = None
    ) -> list[NotLeader | None]:
        """`append` for many partitions (distinct ones) at once, durable on return: one call,
        one wait, where a call per partition cost a task wake-up and a group-commit job each.
        A partition whose term moved on gets its `NotLeader` in the list (the others commit);
        anything else raises, as `append` does.

        `on_durable(i, refusal)` is told of `appends[i]` as soon as it is durable (or refused
        with `NotLeader`), once per append, before the call returns: a store that commits one
        call in several transactions (PostgreSQL's two writers; SQLite's writer, which sends a
        crowd of partitions as two batches) tells each partition at its own COMMIT, so it need
        not wait for the call's slowest commit. What it raises, the call
        raises once every append is settled."""
        ...

    async def read_log(self, pid: int, from_log_offset: int, limit: int | None = None) -> list[LogRecord]: ...

    async def read_placeholders(self, pid: int, from_data_offset: int, limit: int) -> list[LogRecord]:
        """Placeholder records whose data range ends above `from_data_offset`, in offset order."""
        ...

    async def save_snapshot(self, snapshot: Snapshot) -> None: ...

    async def load_snapshot(self, pid: int) -> Snapshot | None: ...

    async def truncate_below(self, pid: int, log_offset: int) -> int:
        """Delete entries below `log_offset` (must be <= latest snapshot's offset + 1)."""
        ...


@runtime_checkable
class EpochStore(Protocol):
    """The cluster epoch: monotone, 1 before the first set."""

    async def get_cluster_epoch(self) -> int: ...

    async def set_cluster_epoch(self, epoch: int) -> None:
        """Raises InvariantViolation if `epoch` is below the stored one."""
        ...

    async def probe_write(self) -> None:
        """A durable write that changes nothing the store holds: on SQLite the cluster epoch's
        row written again with the value it holds (made with 1 where none was set yet, the
        value read without it), on PostgreSQL a transaction given an id and committed. The
        daemon's health probe of an unhealthy log store (`daemon/storage_health.py`)."""
        ...


@runtime_checkable
class L1Metastore(Protocol):
    """The L1 objects and their lifecycle (COPY_STARTED ... DELETE_FINISHED)."""

    async def l1_insert(self, row: L1Row) -> None: ...

    async def l1_transition(self, key: str, from_state: str, to_state: str, now: float) -> bool:
        """Compare-and-set the lifecycle state; False if the row was not in `from_state`."""
        ...

    async def l1_list(self, pid: int | None = None, states: Sequence[str] | None = None) -> list[L1Row]: ...

    async def l1_compaction_commit(self, commit: CompactionCommit, now: float) -> str | None:
        """Accept a compaction result in one transaction, or say why not (None: accepted).
        Accepted only if its cleaner-offset map lies within the term lineage
        (`core.compaction.cleaner_map_refusal` against the partition's current term and
        accepted map), its new objects are all COPY_STARTED and the superseded ones all
        COPY_FINISHED; then the map is the accepted one, the new objects go COPY_FINISHED and
        the superseded ones DELETE_STARTED together: a reader sees either set, never half."""
        ...

    async def l1_compaction_state(self, pid: int) -> CompactionState: ...


@runtime_checkable
class L0Catalog(Protocol):
    """The L0 objects written and the GC's marks on them."""

    async def record_l0_object(self, row: L0ObjectRow) -> None: ...

    async def mark_l0_deleted(self, keys: Sequence[str], at: float, m: int) -> None:
        """Stamp the recorded, not yet marked rows of `keys` as deleted at `at` under `M` = `m`;
        keys without a row are ignored. Every row recorded before the call is seen (a store
        may also stamp a row whose record call committed together with the mark)."""
        ...

    async def l0_live_objects(
        self, max_epoch: int, after: tuple[int, str] | None = None, limit: int = 1000
    ) -> list[L0ObjectRow]:
        """Recorded L0 objects not yet marked deleted with epoch <= `max_epoch`, in
        (epoch, key) order, strictly after `after`; at most `limit`. The GC's catalog."""
        ...


@runtime_checkable
class EventLog(Protocol):
    """Append-only event tables for export and analysis."""

    async def record_gc_round(self, row: GcRoundRow) -> None: ...

    async def record_fence_events(self, rows: Sequence[FenceEventRow]) -> None: ...

    async def record_state_samples(self, rows: Sequence[StateSampleRow]) -> None: ...

    async def prune_history(self, before: float, limit: int) -> int:
        """Delete up to `limit` rows of each history table older than `before` (fence events
        and state samples by their time, GC rounds by their end, the rows of L0 objects the GC
        deleted by the deletion), never a table's newest row; how many went
        (`storage/history.py`)."""
        ...


@runtime_checkable
class LogStore(
    PartitionLog,
    EpochStore,
    L1Metastore,
    L0Catalog,
    EventLog,
    ConsumerOffsetStore,
    TopicConfigStore,
    Protocol,
):
    """Every role in one store (what the daemon opens and hands to a `Node`)."""

    async def aclose(self) -> None: ...


# --------------------------------------------------------------------------- the cluster


class NodeRow(msgspec.Struct, frozen=True):
    """A member of the cluster, as the control plane keeps it (times by its clock)."""

    node_id: str
    advertise_url: str  # the node's HTTP base URL: redirects and `levelzero cluster` name it
    kafka_url: str | None  # host:port of its Kafka listener, if any
    registered_at: float
    lease_expires_at: float  # live while the control plane's now < this
    draining: bool  # shutting down: gets no new partitions
    incarnation: int = 0  # given by its last registration; calls naming another change nothing


class LeaseRow(msgspec.Struct, frozen=True):
    """A partition's leadership lease (one per partition of the cluster)."""

    pid: int
    topic: str
    partition: int
    node_id: str | None  # None: never led, or released
    lease_expires_at: float
    term: int = 0  # the partition's current term in the log store (who last started one)


class ClusterView(msgspec.Struct, frozen=True):
    now: float  # the control plane's clock when the view was read (one transaction)
    nodes: list[NodeRow]
    leases: list[LeaseRow]
    # Each topic's topic configs (`TopicConfigStore.topic_configs()`): every node enforces the
    # set it last read with its view.
    topic_configs: dict[str, dict[str, str]] = msgspec.field(default_factory=dict)


@runtime_checkable
class ClusterControl(Protocol):
    """Membership, partition leases and published `M(p)`, all timed by the control plane's
    clock (never a node's). An optional role: a single node needs none of it."""

    async def advance_cluster_epoch(self) -> int:
        """The stored cluster epoch plus one, atomically: the new epoch (nodes never collide)."""
        ...

    async def cluster_id(self, proposed: str) -> str:
        """The cluster's id: `proposed` if none is stored yet (the first node), else the stored
        one. Every node claims the object store with it."""
        ...

    async def register_node(
        self, node_id: str, advertise_url: str, kafka_url: str | None, ttl_s: float
    ) -> int:
        """Insert or refresh the node's row (a restarted node takes its row back) under a new
        incarnation, returned: larger than any the control plane gave before, to any node.
        Every later call about the node's row or its leases names it, and one naming an older
        incarnation changes nothing (a request of the node's previous life, or of this life
        before it registered again, that arrives late).

        Raises `NodeIdTaken` (nothing changed) when the row is live under another advertise
        URL: another process runs under this node id. The same URL (a restart, within its
        previous run's lease or after) or an expired row is taken."""
        ...

    async def renew_node(self, node_id: str, incarnation: int, ttl_s: float) -> bool:
        """Extend the node's lease; False when its row is gone, expired or another
        incarnation's (register again)."""
        ...

    async def set_draining(self, node_id: str, incarnation: int) -> None: ...

    async def leave_node(self, node_id: str, incarnation: int) -> None:
        """A graceful exit: its partition leases released now, its row removed."""
        ...

    async def forget_expired_nodes(self, expired_for_s: float) -> list[str]:
        """Remove the rows of nodes whose lease ran out at least `expired_for_s` ago (crashed
        and never restarted: no graceful leave removed them), and clear their expired partition
        leases; the node ids removed. A node coming back later registers again."""
        ...

    async def cluster_view(self) -> ClusterView: ...

    async def acquire_leases(
        self, node_id: str, incarnation: int, pids: Sequence[int], ttl_s: float
    ) -> list[int]:
        """Take each of `pids` that is free, expired or already ours; the pids now ours
        (none for an incarnation that is not the node's current one)."""
        ...

    async def renew_leases(self, node_id: str, incarnation: int, ttl_s: float) -> list[int]:
        """Extend every unexpired lease the node holds; the pids it still holds (none for an
        incarnation that is not the node's current one: nothing extended)."""
        ...

    async def release_leases(self, node_id: str, incarnation: int, pids: Sequence[int]) -> None:
        """Expire now those of `pids` the node holds (a hand-over without waiting)."""
        ...

    async def publish_watermarks(self, values: Mapping[int, int]) -> None:
        """pid -> M(p); the stored value only ever rises (GREATEST)."""
        ...

    async def watermark_snapshot(self) -> tuple[int, dict[str, int | None]]:
        """(cluster epoch E, "topic/partition" -> published M(p) or None) for every partition,
        read in one transaction: a partition created later has creation epoch >= E."""
        ...
