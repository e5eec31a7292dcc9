"""Bring a control plane up to what the bucket holds: the re-adoption `levelzero restore` ends
with, and `levelzero recover --from-bucket`. The daemon must be stopped (every daemon, on
PostgreSQL).

Two cases, told apart by the control plane itself:

- **It has partitions** (a restored SQLite backup, or a PostgreSQL database restored from a
  dump). Each partition's log is older than the bucket: records that were above its LRO when
  the backup was taken were reconciled into L1 objects afterwards, and the live GC then deleted
  their L0 objects; the restored metastore does not know those L1 objects. For each partition
  with unreconciled data: list its L1 objects, keep those in the term lineage
  (`core/adoption.py`), walk them from LRO + 1 while their records are, checksum for checksum,
  the records the restored placeholders acknowledged, and adopt them: a new term above every
  term the bucket names for the partition, the objects recorded COPY_FINISHED under it, and one
  `AdvanceReconciledOffset` — the catch-up a reconciler would have appended. An object that
  reaches past the restored high watermark (it also holds records written after the backup),
  or one the metastore already knows in another state, is not adopted as it is: the records
  the log acknowledged are copied into a new object and that one is adopted.
  Where objects the metastore does not know reach the restored high watermark H (the
  discarded history's), a restore mark goes into the bucket (`levelzero/restores/…`: the term
  T the restored history writes from, H, and the topic record's creation, which a mark of a
  topic deleted since does not match), so that a later rebuild from the bucket alone,
  before the restored daemon reconciled what it acknowledged at H and on, does not serve the
  discarded history's records there (`core/adoption.py`, `restored_history`).
  Before that, restored COPY_FINISHED rows whose objects a compaction after the backup
  replaced (and deleted) are repaired where the bucket allows (`repair_compacted`): for each
  run of such rows that objects the metastore does not know cover whole (their term lineage,
  each of a term at or above the rows'), the records those hold at the rows' offsets (all at
  or below the restored LRO) go into a new compacted object, under a term above every term the
  bucket names, recorded as a compactor's result is (`l1_compaction_commit`: the gone rows
  superseded, the cleaner-offset map carried forward with the new term's entry). A record the
  compaction removed because its key was written again after the backup is gone with that
  record; a run not covered, or whose last record was removed (a compacted object ends on a
  record), is left as it is and named (`missing_objects`).
- **It has none** (the SQLite file or the PostgreSQL database was lost and the daemon made an
  empty one, or nothing was made yet). Topics and partitions come from the topic records
  (`levelzero/topics/{topic}`, written at creation) and the L1 keys; each
  partition's reconciled records come back (an emptied one at its end, from its end key,
  `levelzero/ends/…`) from its L1 objects (verified: checksum and record
  count; not those its restore marks discard, `levelzero/restores/…`), from the lowest offset
  the bucket holds to the highest, a gap between objects (a
  range abandoned by an operator) becoming an abandoned range; the cluster epoch is set above
  every L0 object's epoch. The partition's log starts with a `TermStart` (a term above every
  term its objects name, and at or above every term its restore marks name) and a snapshot
  saying what the bucket proves (LRO = high watermark - 1, the L1 objects in the lineage of
  that term). Records that were not reconciled do not come
  back: an L0 object does not hold the offsets of its records (the log assigns them after the
  upload) nor the names of its partitions, and it may hold extents the fence refused.

Why the GC stays safe: adopting is a catch-up. LRO and LRLO move exactly as a reconciler's
`AdvanceReconciledOffset` would move them, so `min_epoch_lower_bound` moves to the window's
lower edge only once LRLO reaches the entry that opened the window; every placeholder above
the new LRO keeps an epoch `>= previous_applied > M(p)`, and nothing in L0 is needed below LRO
(its records are in the adopted objects). The repair of gone rows changes L1 alone (a new
object, rows moved in one compaction result) at offsets at or below the LRO: LRO, LRLO, the
placeholders and so `M(p)` are as restored. A rebuilt partition has no placeholders at all: its
`M(p)` is the new cluster epoch - 1, and every L0 object in the bucket is an orphan of the lost
log (the GC collects them; start with `gc.enabled = false` to keep them while you look).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from levelzero.core.adoption import lineage, next_start_after, restored_history, starting_at, term_above
from levelzero.core.compaction import build_compacted_object, cleaned_to, extend_cleaner_map, l1_object_runs
from levelzero.core.entries import AdvanceReconciledOffset, LogRecord, Placeholder
from levelzero.core.errors import CorruptData, InvalidConfig, LevelZeroError, MalformedKey, ObjectNotFound
from levelzero.core.keys import (
    ENDS_ROOT,
    L0_ROOT,
    L1_ROOT,
    RESTORES_ROOT,
    TOPICS_ROOT,
    L1Key,
    decode_topic_record,
    format_l1_key,
    format_restore_key,
    new_uuid,
    parse_end_key,
    parse_l0_key,
    parse_l1_key,
    parse_restore_key,
    topic_incarnation,
    topic_record_key,
)
from levelzero.core.l0format import (
    Record,
    build_object,
    decode_single_extent,
    encode_extent,
    max_timestamp,
    records_match_extent,
)
from levelzero.core.names import topic_name_problem
from levelzero.core.state import PartitionSnapshot, PartitionState
from levelzero.core.topic_configs import BrokerConfigs, check_configs
from levelzero.storage.protocols import (
    CompactionCommit,
    L1Row,
    L1State,
    LogStore,
    ObjectStore,
    PartitionRow,
    Snapshot,
    iter_objects,
)
from levelzero.storage.postgres.store import PostgresLogStore

from levelzero.config import Config
from levelzero.daemon.ownership import (
    CLUSTER_ID_FILE,
    claim_store,
    local_cluster_id,
    refuse_another_owner,
    store_owner,
)
from levelzero.daemon.service import open_object_store, store_where
from levelzero.storage.opening import ControlStore, control_plane_presence, open_control_store

log = logging.getLogger("levelzero.recover")

REPLAY_BATCH_RECORDS = 10_000
PLACEHOLDER_PAGE_RECORDS = 4096


class RecoveryError(LevelZeroError):
    """One line for the operator."""

    code = "recovery_failed"


@dataclass
class PartitionRecovery:
    """What came back for one partition."""

    name: str
    lro_before: int
    lro_after: int
    high_watermark: int
    adopted: int = 0  # L1 objects recorded as they are
    copied: int = 0  # L1 objects whose acknowledged prefix was copied into a new object
    term: int | None = None  # the term the adoption started
    gaps: list[tuple[int, int]] = field(default_factory=list)  # rebuilt: ranges no object holds

    @property
    def unreconciled(self) -> int:
        """Records above the LRO after recovery (reconciled from L0 later, if it still holds them)."""
        return self.high_watermark - 1 - self.lro_after

    def describe(self) -> str:
        line = (
            f"{self.name}: LRO {self.lro_before} -> {self.lro_after}, high watermark "
            f"{self.high_watermark}, {_count(self.adopted + self.copied, 'L1 object')} adopted"
        )
        if self.copied:
            line += f" ({self.copied} copied)"
        if self.gaps:
            line += ", offsets no object holds (abandoned): " + ", ".join(f"{a}-{b}" for a, b in self.gaps)
        if self.unreconciled:
            line += f", {self.unreconciled} records left to reconcile from L0"
        return line


@dataclass
class RecoverySummary:
    rebuilt: bool  # True: the control plane was empty and was rebuilt from the bucket
    partitions: list[PartitionRecovery]
    topics: dict[str, int] = field(default_factory=dict)  # rebuilt topics: name -> partitions
    cluster_epoch: int | None = None
    skipped_keys: int = 0  # keys under level_one/ that are not L1 keys
    marks_ignored: int = 0  # restore marks of a topic deleted and made again since
    configs: dict[str, dict[str, str]] = field(default_factory=dict)  # rebuilt topics' configs
    configs_dropped: dict[str, str] = field(default_factory=dict)  # topic -> why they were not
    topics_dropped: dict[str, str] = field(default_factory=dict)  # restored topics deleted since
    # partition -> offset ranges of restored L1 rows whose objects are gone from the bucket, and
    # whether objects the metastore does not know (a compaction's, since) cover each
    missing: dict[str, list[tuple[int, int, bool]]] = field(default_factory=dict)
    # partition -> offset ranges such rows held that a compaction's objects gave back
    repaired: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    @property
    def objects(self) -> int:
        return sum(p.adopted + p.copied for p in self.partitions)


# ------------------------------------------------------------------ shared


async def replay_state(store: LogStore, row: PartitionRow) -> PartitionState:
    """The partition's state as its log says: the latest snapshot, then the log after it."""
    snapshot = await store.load_snapshot(row.pid)
    state = (
        PartitionState.decode_snapshot(snapshot.data)
        if snapshot is not None
        else PartitionState(row.creation_epoch)
    )
    while records := await store.read_log(row.pid, state.next_log_offset, REPLAY_BATCH_RECORDS):
        for record in records:
            state.apply(record)
    return state


async def partition_keys(objects: ObjectStore, topic: str, partition: int) -> list[L1Key]:
    keys = []
    async for info in iter_objects(objects, f"{L1_ROOT}{topic}/{partition}/"):
        try:
            keys.append(parse_l1_key(info.key))
        except MalformedKey:
            log.warning("ignoring %s: not an L1 key", info.key)
    return keys


async def _read_records(objects: ObjectStore, key: L1Key) -> tuple[list[Record], int] | None:
    """The object's records (verified against its own header) and its size; None if it is gone
    or damaged (it is then not adopted)."""
    where = f"L1 object {key}"
    try:
        data = await objects.get(str(key))
        records = decode_single_extent(data, where)
    except (ObjectNotFound, CorruptData) as exc:
        log.warning("not adopting %s: %s", key, exc)
        return None
    if len(records) != key.last_offset - key.base_offset + 1:
        log.warning(
            "not adopting %s: %d records for offsets %d-%d",
            key,
            len(records),
            key.base_offset,
            key.last_offset,
        )
        return None
    return records, len(data)


# ------------------------------------------------------------------ adoption (restored logs)


@dataclass(frozen=True)
class _Adoptable:
    key: L1Key
    upto: int  # the last offset adopted (<= key.last_offset)
    records: list[Record]  # offsets key.base_offset..upto
    size: int
    lrlo: int  # log offset of the placeholder ending at `upto`

    @property
    def whole(self) -> bool:
        return self.upto == self.key.last_offset


async def _placeholders(store: LogStore, pid: int, start: int, end: int) -> dict[int, LogRecord]:
    """The partition's placeholders covering data offsets `start..end`, by base offset."""
    found: dict[int, LogRecord] = {}
    offset = start
    while offset <= end:
        page = await store.read_placeholders(pid, offset, PLACEHOLDER_PAGE_RECORDS)
        for record in page:
            assert isinstance(record.entry, Placeholder)
            found[record.base_offset] = record
        if not page:
            break
        last = page[-1]
        assert isinstance(last.entry, Placeholder)
        offset = last.base_offset + last.entry.record_count
    return found


async def _verify_against_log(
    objects: ObjectStore, key: L1Key, placeholders: dict[int, LogRecord], end: int
) -> _Adoptable | None:
    """`key` as far as the log acknowledged it (up to `end`), if its records are exactly the
    ones the placeholders there acknowledged, extent by extent."""
    read = await _read_records(objects, key)
    if read is None:
        return None
    records, size = read
    upto = min(key.last_offset, end)
    offset, lrlo = key.base_offset, None
    while offset <= upto:
        record = placeholders.get(offset)
        if record is None:
            log.warning("not adopting %s: no placeholder of the log starts at offset %d", key, offset)
            return None
        placeholder = record.entry
        assert isinstance(placeholder, Placeholder)
        if offset + placeholder.record_count - 1 > upto:
            log.warning("not adopting %s: it ends inside the placeholder at offset %d", key, offset)
            return None
        first = offset - key.base_offset
        if not records_match_extent(records[first : first + placeholder.record_count], placeholder.checksum):
            log.warning(
                "not adopting %s: its records at offset %d are not the ones the log "
                "acknowledged (another history's object)",
                key,
                offset,
            )
            return None
        lrlo = record.log_offset
        offset += placeholder.record_count
    assert lrlo is not None
    return _Adoptable(key, upto, records[: upto - key.base_offset + 1], size, lrlo)


async def adopt_partition(
    store: LogStore, objects: ObjectStore, row: PartitionRow, now: float
) -> PartitionRecovery | None:
    """Adopt the L1 objects that continue `row`'s reconciled data (see the module docstring),
    and mark the restore in the bucket where the discarded history reaches past it
    (`_mark_restore`). None when the partition has nothing unreconciled."""
    if topic_name_problem(row.topic) is not None:
        return None
    state = await replay_state(store, row)
    keys = await partition_keys(objects, row.topic, row.partition)
    known = {r.key for r in await store.l1_list(row.pid)}
    restored_term = state.term
    result = await _adopt(store, objects, row, now, state, keys)
    await _mark_restore(objects, row, keys, known, state, restored_term)
    return result


async def _mark_restore(
    objects: ObjectStore,
    row: PartitionRow,
    keys: list[L1Key],
    known: set[str],
    state: PartitionState,
    restored_term: int,
) -> None:
    """When the bucket holds L1 objects the restored control plane does not know reaching the
    restored high watermark H (the discarded history's, written after the backup), write the
    partition's restore mark: the term T the restored history writes from (the term this
    adoption began, else the one the daemon begins, the partition's term + 1) and H. Until the
    restored daemon reconciles the records it acknowledges at H and beyond, nothing else in the
    bucket says they are not the discarded history's; a rebuild from the bucket alone drops
    what the mark discards (`core/adoption.py`, `restored_history`). Written before the restore
    is done (the daemon refuses to start before), so none of those records is acknowledged
    without it; running the restore again writes another mark, which applies as well."""
    high_watermark = state.high_watermark
    if not any(k.last_offset >= high_watermark for k in keys if str(k) not in known):
        return
    term = state.term if state.term > restored_term else state.term + 1
    key = format_restore_key(
        row.topic, row.partition, term, high_watermark, await _topic_incarnation(objects, row.topic)
    )
    await objects.put(key, b"")
    log.info("%s/%d: restore marked (%s)", row.topic, row.partition, key)


async def _topic_incarnation(objects: ObjectStore, topic: str) -> int | None:
    """The restored topic's record's creation (`keys.topic_incarnation`), which its restore
    marks name: a mark left behind by a failed deletion of the topic does not apply to a topic
    made again with the name (whose record is created anew), nor to one without a record (the
    deleted topic's went). None: no record to name (a failed best-effort write, an earlier
    release): the mark applies to whatever topic has the name."""
    try:
        record = decode_topic_record(topic_record_key(topic), await objects.get(topic_record_key(topic)))
    except (ObjectNotFound, MalformedKey):
        return None
    return topic_incarnation(record.created_at)


async def _adopt(
    store: LogStore,
    objects: ObjectStore,
    row: PartitionRow,
    now: float,
    state: PartitionState,
    keys: list[L1Key],
) -> PartitionRecovery | None:
    """`adopt_partition`'s adoption, on `state` (its terms and catch-up applied to it)."""
    name = f"{row.topic}/{row.partition}"
    if not state.has_unreconciled_data:
        await _outrank(store, row, state, keys)
        return None
    result = PartitionRecovery(name, state.lro, state.lro, state.high_watermark)
    rows = {r.key: r for r in await store.l1_list(row.pid)}
    deleting = (L1State.DELETE_STARTED, L1State.DELETE_FINISHED)
    # The newest term's objects win where terms overlap (a zombie's late upload loses); what
    # is adopted is then checked record by record against the restored placeholders.
    kept = lineage(k for k in keys if str(k) not in rows or rows[str(k)].state not in deleting)
    end = state.high_watermark - 1
    placeholders = await _placeholders(store, row.pid, state.lro + 1, end)
    plan: list[_Adoptable] = []
    offset = state.lro + 1
    while offset <= end:
        for key in starting_at(kept, offset):
            found = await _verify_against_log(objects, key, placeholders, end)
            if found is not None:
                plan.append(found)
                offset = found.upto + 1
                break
        else:
            break
    if not plan:
        await _outrank(store, row, state, keys)
        return result
    term_start = await store.begin_term(
        row.pid, state.next_log_offset, state.high_watermark, at_least=term_above(keys, state.term)
    )
    state.apply(term_start)
    term = result.term = term_start.term
    for item in plan:
        object_key = str(item.key)
        if item.whole and object_key not in rows:
            result.adopted += 1
            size = item.size
        else:
            object_key = format_l1_key(
                row.topic, row.partition, item.key.base_offset, item.upto, term, new_uuid()
            )
            data, _ = build_object(term, [(row.pid, encode_extent(item.records), len(item.records))])
            await objects.put(object_key, data)
            result.copied += 1
            size = len(data)
        await store.l1_insert(
            L1Row(
                object_key,
                row.pid,
                item.key.base_offset,
                item.upto,
                item.lrlo,
                term,
                size,
                L1State.COPY_FINISHED,
                now,
                now,
                max_timestamp(item.records),
            )
        )
    last = plan[-1]
    catch_up = LogRecord(
        state.next_log_offset, term, state.high_watermark, AdvanceReconciledOffset(last.upto, last.lrlo)
    )
    state.apply(catch_up)  # checks it before it is stored
    await store.append(row.pid, term, [catch_up])
    assert all(state.l1_range_valid(term, item.key.base_offset, item.upto) for item in plan)
    result.lro_after = state.lro
    return result


async def _outrank(store: LogStore, row: PartitionRow, state: PartitionState, keys: list[L1Key]) -> None:
    """A partition that adopts nothing still starts a term above every term its L1 objects in
    the bucket name, when an object the restored log does not know names a later one (the lost
    history's leaders, restarted after the backup): what the restored daemon writes must
    outrank what the lost history wrote, should the bucket be read again (`recover
    --from-bucket` keeps the newest term's object at each offset). Left at its own term, the
    restored partition's next term could equal or trail the lost history's, and a later
    recovery served the lost history's records at offsets it acknowledged anew."""
    known = {r.key for r in await store.l1_list(row.pid)}
    # (the partition's next term, at its start-up, is its term + 1: an object of the lost
    # history at the partition's term is outranked by it already)
    if any(key.term > state.term for key in keys if str(key) not in known):
        state.apply(
            await store.begin_term(
                row.pid, state.next_log_offset, state.high_watermark, at_least=term_above(keys, state.term)
            )
        )


async def _deleted_since(
    store: LogStore, objects: ObjectStore, topic: str, rows: list[PartitionRow], taken_at: float | None
) -> str | None:
    """Why the restored topic `topic` was deleted after the control plane's copy was taken, or
    None. A deletion removes the topic's bucket record first and its L1 objects after (the GC's
    `collect_deleted`); a topic made again with the name writes a record of its own, created
    after `taken_at` (the backup's time, when known). So: the record gone or newer than the
    backup, and not one of the L1 objects the restored metastore names for the topic left. A
    topic whose record was never written (an earlier release; a failed best-effort write) still
    has its L1 objects, or has none recorded: it is kept."""
    try:
        record = decode_topic_record(topic_record_key(topic), await objects.get(topic_record_key(topic)))
    except ObjectNotFound:
        record = None
    except MalformedKey:
        return None  # not ours to judge: kept
    if record is not None and (taken_at is None or record.created_at <= taken_at):
        return None
    named = 0
    for row in rows:
        known = [r.key for r in await store.l1_list(row.pid, [L1State.COPY_FINISHED])]
        present = {str(k) for k in await partition_keys(objects, topic, row.partition)}
        # With no record, any object under its keys (a compaction's since, say) keeps the topic:
        # a deletion collects them all.
        if present & set(known) or (record is None and present):
            return None
        named += len(known)
    if not named:
        return None
    gone = (
        f"none of the {_count(named, 'L1 object')} the restored control plane names for it is in the bucket"
    )
    if record is None:
        return f"its topic record {topic_record_key(topic)} is gone and {gone}: deleted after the backup"
    return (
        f"its topic record {topic_record_key(topic)} was written at {_when(record.created_at)}, after "
        f"the backup (taken at {_when(taken_at)}), and {gone}: deleted and made again after the backup"
    )


def _when(at: float | None) -> str:
    return "an unknown time" if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


async def drop_deleted_topics(
    store: LogStore, objects: ObjectStore, now: float, taken_at: float | None
) -> dict[str, str]:
    """Delete from the restored control plane, as `levelzero topics delete` would, each topic
    deleted after the backup (`_deleted_since`): its records are gone from the bucket, and
    kept it would be listed and answer 500 `object_not_found`. The bucket is not touched: what
    is left there under the name is a topic made again since. Topic -> why it was dropped."""
    by_topic: dict[str, list[PartitionRow]] = {}
    for row in await store.list_partitions():
        by_topic.setdefault(row.topic, []).append(row)
    dropped = {}
    for topic, rows in sorted(by_topic.items()):
        if topic_name_problem(topic) is not None:
            continue
        why = await _deleted_since(store, objects, topic, rows, taken_at)
        if why is not None:
            await store.delete_topic(topic, now)
            for row in rows:
                await _collect_dropped(store, objects, row, now)
            log.warning("dropped topic %s from the restored control plane: %s", topic, why)
            dropped[topic] = why
    return dropped


async def missing_objects(
    store: LogStore, objects: ObjectStore, row: PartitionRow
) -> list[tuple[int, int, bool]]:
    """The offset ranges of `row`'s restored COPY_FINISHED L1 rows whose objects are gone from
    the bucket (a compaction after the backup replaced them, or retention deleted them), each
    with whether objects the metastore does not know cover it (a compacted object's range)."""
    if topic_name_problem(row.topic) is not None:
        return []
    rows = await store.l1_list(row.pid, [L1State.COPY_FINISHED])
    if not rows:
        return []
    keys = await partition_keys(objects, row.topic, row.partition)
    present = {str(k) for k in keys}
    known = {r.key for r in await store.l1_list(row.pid)}
    unknown = [k for k in keys if str(k) not in known]
    gone = []
    for l1 in sorted(rows, key=lambda r: r.base_offset):
        if l1.key in present:
            continue
        covered = any(k.base_offset <= l1.base_offset and l1.last_offset <= k.last_offset for k in unknown)
        gone.append((l1.base_offset, l1.last_offset, covered))
    return gone


@dataclass(frozen=True)
class _Repair:
    """One range of gone rows, and what the new object holding it is made of."""

    base: int
    last: int  # the new object's last offset: a record is there
    superseded: list[L1Row]  # the gone rows
    offsets: list[int]
    records: list[Record]


async def repair_compacted(
    store: LogStore, objects: ObjectStore, row: PartitionRow, now: float
) -> list[tuple[int, int]]:
    """Replace `row`'s restored L1 rows whose objects a compaction after the backup deleted by
    a new compacted object holding what that compaction kept there (see the module
    docstring); the offset ranges repaired. A range not wholly covered by objects the
    metastore does not know is left as it is (`missing_objects` names it)."""
    if topic_name_problem(row.topic) is not None:
        return []
    state = await replay_state(store, row)
    finished = await store.l1_list(row.pid, [L1State.COPY_FINISHED])
    if not finished:
        return []
    keys = await partition_keys(objects, row.topic, row.partition)
    present = {str(k) for k in keys}
    known = {r.key for r in await store.l1_list(row.pid)}
    compaction = await store.l1_compaction_state(row.pid)

    def valid(l1: L1Row) -> bool:  # as `L1Catalog.is_valid` says of a COPY_FINISHED row
        if l1.key in compaction.compacted_keys:
            return l1.term <= state.term and l1.last_offset <= state.lro
        return state.l1_range_valid(l1.term, l1.base_offset, l1.last_offset)

    lineage_rows = sorted((r for r in finished if valid(r)), key=lambda r: r.base_offset)
    # The newest term's wins where the unknown objects overlap (a zombie's late upload loses).
    unknown = lineage(k for k in keys if str(k) not in known)
    ranges: list[list[L1Row]] = []  # contiguous gone rows
    for l1 in lineage_rows:
        if l1.key in present or l1.last_offset > state.lro:
            continue
        if ranges and ranges[-1][-1].last_offset + 1 == l1.base_offset:
            ranges[-1].append(l1)
        else:
            ranges.append([l1])
    plan: list[_Repair] = []
    for gone in ranges:
        repair = await _covered(objects, gone, unknown)
        if repair is not None:
            plan.append(repair)
    if not plan:
        return []
    term_start = await store.begin_term(
        row.pid, state.next_log_offset, state.high_watermark, at_least=term_above(keys, state.term)
    )
    state.apply(term_start)
    term = term_start.term
    new_keys = []
    for repair in plan:
        key = format_l1_key(row.topic, row.partition, repair.base, repair.last, term, new_uuid())
        extent = encode_extent(repair.records)
        data = build_compacted_object(term, row.pid, repair.offsets, extent, len(repair.records))
        lrlo = max(r.last_log_offset for r in repair.superseded)
        await store.l1_insert(
            L1Row.copy_started(
                key,
                row.pid,
                repair.base,
                repair.last,
                lrlo,
                term,
                len(data),
                now,
                max_timestamp(repair.records),
            )
        )
        await objects.put(key, data)
        new_keys.append(key)
    accepted = compaction.cleaner_offsets
    # The cleaning reached no further than the restored map says (the lost history's map is
    # gone): the compactor may clean these offsets again, never skip one.
    claim = extend_cleaner_map(accepted, term, cleaned_to(accepted))
    superseded = tuple(r.key for repair in plan for r in repair.superseded)
    refusal = await store.l1_compaction_commit(
        CompactionCommit(row.pid, term, claim, tuple(new_keys), superseded), now
    )
    if refusal is not None:  # every daemon is stopped: nothing else moves these rows
        raise RecoveryError(
            f"{row.topic}/{row.partition}: the repair's compaction result was refused: {refusal}"
        )
    for repair in plan:
        log.warning(
            "%s/%d: offsets %d-%d come back from a compaction's object of the lost history "
            "(what it kept there), under term %d",
            row.topic,
            row.partition,
            repair.base,
            repair.last,
            term,
        )
    return [(repair.base, repair.last) for repair in plan]


async def _covered(objects: ObjectStore, gone: list[L1Row], unknown: list[L1Key]) -> _Repair | None:
    """The records that objects of `unknown` (the lineage of the objects the metastore does not
    know) hold at the offsets of the contiguous gone rows `gone` (at or below the LRO); None
    when they do not cover every offset, or an object cannot be read."""
    base, last = gone[0].base_offset, gone[-1].last_offset
    floor = max(r.term for r in gone)  # written after them: a compaction of their records
    covering = sorted(
        (k for k in unknown if k.base_offset <= last and k.last_offset >= base and k.term >= floor),
        key=lambda k: k.base_offset,
    )
    reach = base - 1
    chain = []
    for key in covering:
        if key.base_offset > reach + 1:
            break
        if key.last_offset > reach:
            chain.append(key)
            reach = key.last_offset
        if reach >= last:
            break
    if reach < last:
        return None
    offsets: list[int] = []
    records: list[Record] = []
    for key in chain:
        runs = await _runs(objects, str(key), key.base_offset)
        if runs is None:
            return None
        for start, run in runs:
            for i, record in enumerate(run):
                at = start + i
                if base <= at <= last and (not offsets or at > offsets[-1]):
                    offsets.append(at)
                    records.append(record)
    if not offsets or offsets[-1] != last:
        # The compaction removed the range's last record (its key was written again after the
        # backup; the range then ends at the LRO, as an object after it would have been the
        # compaction's input too, and gone). A compacted object ends on a record, as a fetch
        # relies on: one ending in a gap at the LRO would leave readers short of it. Left named.
        log.warning(
            "not repairing offsets %d-%d of %s: the compaction removed the record at %d",
            base,
            last,
            gone[0].key,
            last,
        )
        return None
    return _Repair(base, last, gone, offsets, records)


async def _runs(objects: ObjectStore, key: str, base: int) -> list[tuple[int, list[Record]]] | None:
    """An L1 object's runs of records (verified), None if it is gone or damaged."""
    try:
        return l1_object_runs(await objects.get(key), base, f"L1 object {key}")
    except (ObjectNotFound, CorruptData) as exc:
        log.warning("not repairing from %s: %s", key, exc)
        return None


async def _collect_dropped(store: LogStore, objects: ObjectStore, row: PartitionRow, now: float) -> None:
    """Collect a dropped partition's L1 rows here, so that the GC does not: its sweep of a
    deleted partition's key prefix (`L1Catalog.collect_deleted`) would delete the objects a
    topic made again with the name wrote after the backup, which no restored partition holds
    but which a recovery from the bucket can still bring back. Only the rows' own keys go."""
    for l1 in await store.l1_list(row.pid):
        if l1.state == L1State.DELETE_FINISHED:
            continue
        # Every daemon is stopped: nothing else moves these rows.
        if l1.state != L1State.DELETE_STARTED:
            moved = await store.l1_transition(l1.key, l1.state, L1State.DELETE_STARTED, now)
            assert moved, l1
        errors = (await objects.delete_many([l1.key])).errors
        if errors:
            raise RecoveryError(f"cannot delete {l1.key} of dropped topic {row.topic}: {errors[l1.key]}")
        moved = await store.l1_transition(l1.key, L1State.DELETE_STARTED, L1State.DELETE_FINISHED, now)
        assert moved, l1
    forgotten = await store.forget_deleted_partition(row.pid)
    assert forgotten, row


async def adopt_all(
    store: LogStore, objects: ObjectStore, now: float, taken_at: float | None = None
) -> RecoverySummary:
    """`taken_at`: when the restored control plane was copied (a backup's time), if known."""
    summary = RecoverySummary(rebuilt=False, partitions=[])
    summary.topics_dropped = await drop_deleted_topics(store, objects, now, taken_at)
    for row in await store.list_partitions():
        repaired = await repair_compacted(store, objects, row, now)
        if repaired:
            summary.repaired[f"{row.topic}/{row.partition}"] = repaired
        gone = await missing_objects(store, objects, row)
        if gone:
            summary.missing[f"{row.topic}/{row.partition}"] = gone
        found = await adopt_partition(store, objects, row, now)
        if found is not None:
            summary.partitions.append(found)
    return summary


# ------------------------------------------------------------------ rebuilding (lost control plane)


async def rebuild_from_bucket(store: LogStore, objects: ObjectStore, now: float) -> RecoverySummary:
    """Rebuild an empty control plane from the bucket (see the module docstring)."""
    assert not await store.list_partitions(), "rebuild only an empty control plane"
    summary = RecoverySummary(rebuilt=True, partitions=[])
    keys: dict[tuple[str, int], list[L1Key]] = {}
    async for info in iter_objects(objects, L1_ROOT):
        try:
            key = parse_l1_key(info.key)
        except MalformedKey:
            summary.skipped_keys += 1
            log.warning("ignoring %s: not an L1 key", info.key)
            continue
        keys.setdefault((key.topic, key.partition), []).append(key)
    configs: dict[str, dict[str, str]] = {}  # the topic records' configs, checked
    ends: dict[tuple[str, int], int] = {}  # where emptied partitions ended (their end keys)
    top_epoch = 0
    async for info in iter_objects(objects, L0_ROOT):
        with contextlib.suppress(MalformedKey):
            top_epoch = max(top_epoch, parse_l0_key(info.key).epoch)
    # Above every L0 object's epoch: the new logs' writes are never older than an orphan.
    epoch = max(await store.get_cluster_epoch(), top_epoch + 1)
    await store.set_cluster_epoch(epoch)
    summary.cluster_epoch = epoch
    incarnations: dict[str, int] = {}  # topic -> its record's creation (`topic_incarnation`)
    async for info in iter_objects(objects, TOPICS_ROOT):
        try:
            record = decode_topic_record(info.key, await objects.get(info.key))
        except (MalformedKey, ObjectNotFound) as exc:
            log.warning("ignoring %s: %s", info.key, exc)
            continue
        summary.topics[record.topic] = record.partitions
        incarnations[record.topic] = topic_incarnation(record.created_at)
        for p, kept in record.ends.items():  # (one release kept them in the record)
            ends[record.topic, p] = max(kept, ends.get((record.topic, p), 0))
        if record.configs:
            try:
                configs[record.topic] = check_configs(record.configs.items(), BrokerConfigs(broker_id=0))
            except InvalidConfig as exc:  # (a record of another release, whose rules differ)
                summary.configs_dropped[record.topic] = str(exc)
                log.warning("topic %s comes back without its configs: %s", record.topic, exc)
    async for info in iter_objects(objects, ENDS_ROOT):
        try:
            topic, partition, ended_at = parse_end_key(info.key)
        except MalformedKey as exc:
            summary.skipped_keys += 1
            log.warning("ignoring %s: %s", info.key, exc)
            continue
        ends[topic, partition] = max(ended_at, ends.get((topic, partition), 0))
    restores: dict[tuple[str, int], list[tuple[int, int]]] = {}  # the restore marks' (term, H)
    async for info in iter_objects(objects, RESTORES_ROOT):
        try:
            mark = parse_restore_key(info.key)
        except MalformedKey as exc:
            summary.skipped_keys += 1
            log.warning("ignoring %s: %s", info.key, exc)
            continue
        then, now_created = mark.topic_created, incarnations.get(mark.topic)
        if then is not None and then != now_created:
            # The mark of a topic deleted since (its removal with the topic failed; the record
            # it names went, or was replaced by the record of a topic made again with the
            # name): none of the history of a topic of that name now is the mark's.
            summary.marks_ignored += 1
            log.warning(
                "ignoring %s: it marks a restore of a topic %s created at %s, deleted since (%s)",
                info.key,
                mark.topic,
                _when(then / 1e6),
                "no record of it left"
                if now_created is None
                else f"the topic of that name now was created at {_when(now_created / 1e6)}",
            )
            continue
        restores.setdefault((mark.topic, mark.partition), []).append((mark.term, mark.high_watermark))
    for topic, partition in keys:  # a topic created before topics were recorded, or a record lost
        summary.topics[topic] = max(summary.topics.get(topic, 0), partition + 1)
    summary.configs = configs
    for topic, count in sorted(summary.topics.items()):
        for row in await store.create_topic(topic, count, epoch, now, configs.get(topic)):
            found = keys.get((row.topic, row.partition), [])
            end = ends.get((row.topic, row.partition))
            marks = restores.get((row.topic, row.partition), [])
            if found or end or marks:
                summary.partitions.append(
                    await _rebuild_partition(store, objects, row, found, epoch, now, end, marks)
                )
    return summary


async def _rebuild_partition(
    store: LogStore,
    objects: ObjectStore,
    row: PartitionRow,
    keys: list[L1Key],
    epoch: int,
    now: float,
    end: int | None = None,
    restores: Sequence[tuple[int, int]] = (),
) -> PartitionRecovery:
    """One partition's log from its L1 objects; `end`: where it ended when retention or
    DeleteRecords emptied it (its end key), which an empty partition starts at; `restores`:
    its restore marks' (term, high watermark), whose discarded history is not adopted. The new
    term is above every term `keys` name, discarded objects' included, and at or above every
    mark's: what the partition writes from then on is never a discarded history's."""
    kept = lineage(restored_history(keys, restores))
    at_least = term_above(keys, max((term for term, _ in restores), default=1) - 1)
    chosen: list[tuple[L1Key, int, int]] = []  # key, size, largest timestamp
    gaps: list[tuple[int, int]] = []
    offset: int | None = kept[0].base_offset if kept else None
    while offset is not None:
        for key in starting_at(kept, offset):
            read = await _read_records(objects, key)
            if read is not None:
                chosen.append((key, read[1], max_timestamp(read[0])))
                offset = key.last_offset + 1
                break
        else:
            resume = next_start_after(kept, offset)
            if resume is not None and chosen:
                gaps.append((offset, resume - 1))
            offset = resume
    name = f"{row.topic}/{row.partition}"
    result = PartitionRecovery(name, -1, -1, 0, gaps=gaps)
    if not chosen:
        if end:
            return await _rebuild_emptied(store, row, end, epoch, at_least, result)
        if restores:  # empty at offset 0, but its terms above the marks'
            result.term = (await store.begin_term(row.pid, 0, 0, at_least=at_least)).term
        return result
    term_start = await store.begin_term(row.pid, 0, 0, at_least=at_least)
    term = result.term = term_start.term
    for key, size, max_timestamp_ms in chosen:
        await store.l1_insert(
            L1Row(
                str(key),
                row.pid,
                key.base_offset,
                key.last_offset,
                0,
                term,
                size,
                L1State.COPY_FINISHED,
                now,
                now,
                max_timestamp_ms,
            )
        )
    result.adopted = len(chosen)
    last = chosen[-1][0].last_offset
    size = sum(size for _, size, _ in chosen)
    state = _proven_state(row, term_start, epoch, chosen[0][0].base_offset, last + 1, size, gaps)
    assert all(state.l1_range_valid(term, k.base_offset, k.last_offset) for k, _, _ in chosen)
    await store.save_snapshot(Snapshot(row.pid, term_start.log_offset, state.encode_snapshot()))
    result.lro_after, result.high_watermark = last, last + 1
    return result


def _proven_state(
    row: PartitionRow,
    term_start: LogRecord,
    epoch: int,
    start: int,
    end: int,
    size: int,
    gaps: list[tuple[int, int]],
) -> PartitionState:
    """The state the bucket proves, at the log's first entry (the TermStart): the records
    `start` up to `end` (excluded) reconciled by the term; the window at the new cluster epoch,
    already caught up."""
    term = term_start.term
    state = PartitionState.from_snapshot(
        PartitionSnapshot(
            creation_epoch=row.creation_epoch,
            last_applied_log_offset=term_start.log_offset,
            term=term,
            max_applied_epoch=epoch,
            previous_applied_epoch=epoch,
            min_epoch_lower_bound=epoch,
            epoch_window_offset=term_start.log_offset,
            lro=end - 1,
            lrlo=term_start.log_offset,
            start_offset=start,
            high_watermark=end,
            term_starts=((term, end),),
            size_bytes=size,
            reconciled_by_term={term: end - 1},
            abandoned=tuple(gaps),
        )
    )
    assert row.creation_epoch <= epoch and not state.has_unreconciled_data
    return state


async def _rebuild_emptied(
    store: LogStore, row: PartitionRow, end: int, epoch: int, at_least: int, result: PartitionRecovery
) -> PartitionRecovery:
    """A partition with no record left (retention or DeleteRecords emptied it) whose end a key
    in the bucket kept: empty, its start offset and high watermark at `end`, so its next
    record takes `end` as it would have, not an offset consumers read before."""
    term_start = await store.begin_term(row.pid, 0, 0, at_least=at_least)
    result.term = term_start.term
    state = _proven_state(row, term_start, epoch, end, end, 0, [])
    await store.save_snapshot(Snapshot(row.pid, term_start.log_offset, state.encode_snapshot()))
    result.lro_after, result.high_watermark = end - 1, end
    return result


# ------------------------------------------------------------------ entry point


async def recover_from_bucket(
    store: LogStore,
    objects: ObjectStore,
    *,
    wall_clock: Callable[[], float] = time.time,
    taken_at: float | None = None,
) -> RecoverySummary:
    """Rebuild an empty control plane, or adopt L1 objects into one that has partitions
    (`taken_at`: when that one was copied, a backup's time, if known)."""
    now = wall_clock()
    if await store.list_partitions():
        return await adopt_all(store, objects, now, taken_at)
    return await rebuild_from_bucket(store, objects, now)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def describe(summary: RecoverySummary) -> Sequence[str]:
    lines = []
    if summary.rebuilt:
        topics = ", ".join(f"{t}: {_count(n, 'partition')}" for t, n in sorted(summary.topics.items()))
        lines.append(
            f"rebuilt the control plane from the bucket: {_count(len(summary.topics), 'topic')} "
            f"({topics or 'none'}), "
            f"cluster epoch {summary.cluster_epoch}, {_count(summary.objects, 'L1 object')}"
        )
        if summary.configs:
            lines.append(
                f"topic configs: {', '.join(f'{t} ({len(c)})' for t, c in sorted(summary.configs.items()))}"
            )
        for topic, why in sorted(summary.configs_dropped.items()):
            lines.append(f"topic {topic} comes back without its configs: {why}")
        if summary.skipped_keys:
            lines.append(f"{summary.skipped_keys} keys under {L1_ROOT} are not L1 keys (ignored)")
        if summary.marks_ignored:
            lines.append(
                f"{_count(summary.marks_ignored, 'restore mark')} of topics deleted since "
                f"(ignored; under {RESTORES_ROOT})"
            )
        lines.append(
            "not recovered: records that were not reconciled yet, consumer offsets "
            "(see docs/backup-restore.md, 'Recovering from the bucket alone'); the L0 objects "
            "that hold such records are deleted by the GC once the daemon runs: to look at them "
            "first, start it with gc.enabled = false"
        )
    else:
        lines.append(
            f"adopted {_count(summary.objects, 'L1 object')} found in the bucket into "
            f"{_count(sum(1 for p in summary.partitions if p.term is not None), 'partition')}"
        )
        for topic, why in sorted(summary.topics_dropped.items()):
            lines.append(f"dropped topic {topic}: {why}")
        for name, spans in sorted(summary.repaired.items()):
            lines.append(_describe_repaired(name, spans))
        for name, ranges in sorted(summary.missing.items()):
            lines.append(_describe_missing(name, ranges))
    lines.extend(p.describe() for p in summary.partitions if p.term is not None or p.gaps)
    return lines


def _describe_repaired(name: str, spans: list[tuple[int, int]]) -> str:
    offsets = ", ".join(f"{a}-{b}" for a, b in spans)
    return (
        f"{name}: the L1 objects of offsets {offsets} that the restored control plane names were "
        "replaced by a compaction after the backup: its records there were copied into a new "
        "compacted object (a record it removed because its key was written again after the "
        "backup is gone); see docs/backup-restore.md, 'L1 objects gone since the backup'"
    )


def _describe_missing(name: str, ranges: list[tuple[int, int, bool]]) -> str:
    offsets = ", ".join(f"{a}-{b}" for a, b, _ in ranges)
    covered = all(c for _, _, c in ranges)
    cause = (
        "a compaction after the backup replaced them; its objects are in the bucket, but it removed "
        "the range's last record, or they could not be read"
        if covered
        else "nothing in the bucket holds their records (retention or a compaction since)"
    )
    return (
        f"{name}: the L1 objects of offsets {offsets} that the restored control plane names are gone "
        f"from the bucket ({cause}): reads of these offsets answer 500 object_not_found; see "
        "docs/backup-restore.md, 'L1 objects gone since the backup'"
    )


# mypy does not count on the task group re-raising what ends it: "missing return".
async def recover_configured(  # type: ignore[return]
    config: Config, taken_at: float | None = None
) -> RecoverySummary:
    """`recover_from_bucket` on the stores `config` names (every daemon on them stopped);
    `taken_at`: the restored backup's time, when a restore runs it."""
    Path(config.storage.data_dir).mkdir(parents=True, exist_ok=True)  # lost with the SQLite file
    async with anyio.create_task_group() as tg:
        store = await open_control_store(tg, config)
        try:
            # On PostgreSQL: refused while any daemon runs there, and keeps them from starting.
            name = "levelzero recover"
            async with control_plane_presence(tg, config, application_name=name, exclusive=True):
                await _refuse_live_nodes(store)
                objects = await open_object_store(config)
                try:
                    await _claim(store, objects, config)
                    return await recover_from_bucket(store, objects, taken_at=taken_at)
                finally:
                    await objects.aclose()
        finally:
            await store.aclose()


async def refuse_another_clusters_backup(config: Config, cluster_id: str, backup: str) -> None:
    """Before `levelzero restore` writes anything: the backup must be of the cluster that owns
    the bucket (a daemon on it would be refused, as `run` refuses: the same check)."""
    objects = await open_object_store(config)
    try:
        owner = await store_owner(objects)
    finally:
        await objects.aclose()
    if owner is not None:
        refuse_another_owner(owner, cluster_id, store_where(config), ours=f"the backup {backup}")


async def _refuse_live_nodes(store: ControlStore) -> None:
    if not isinstance(store, PostgresLogStore):
        return  # SQLite: opening the store took its lock, so no daemon runs on it
    view = await store.cluster_view()
    live = sorted(n.node_id for n in view.nodes if n.lease_expires_at > view.now)
    if live:
        raise RecoveryError(
            f"daemons are running on this control plane ({', '.join(live)}): stop every one first"
        )


async def _claim(store: ControlStore, objects: ObjectStore, config: Config) -> None:
    """The data directory (and on PostgreSQL the database) must name the cluster that owns the
    bucket. A lost one gets the bucket's id back, so its daemon is not refused by its own
    bucket; so does one a control plane holding no partition names (a daemon started on the
    new, empty control plane before this, and refused by the bucket, had made an id there,
    and this rebuild was refused as that start had been); one naming another cluster beside
    partitions of its own is refused, as the daemon would refuse it."""
    owner = await store_owner(objects)
    empty = not await store.list_partitions()
    id_path = Path(config.storage.data_dir) / CLUSTER_ID_FILE
    if owner is not None and (
        not id_path.exists() or (empty and local_cluster_id(config.storage.data_dir) != owner)
    ):
        id_path.parent.mkdir(parents=True, exist_ok=True)
        staged = id_path.with_name(CLUSTER_ID_FILE + ".recovering")
        staged.write_text(owner + "\n", encoding="ascii")
        staged.replace(id_path)
        log.info("wrote %s: cluster %s, the owner of the bucket", id_path, owner)
    cluster_id = local_cluster_id(config.storage.data_dir)
    if isinstance(store, PostgresLogStore):
        cluster_id = await store.cluster_id(cluster_id)
        if owner is not None and cluster_id != owner and empty:
            log.warning(
                "the database named cluster %s and holds no partition: it takes the bucket's id %s",
                cluster_id,
                owner,
            )
            await store.replace_cluster_id(owner)
            cluster_id = owner
    await claim_store(objects, cluster_id, store_where(config))
