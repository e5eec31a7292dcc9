"""Adopting L1 objects into a restored log (`daemon/recover.py`) on memory stores: only records
the restored placeholders acknowledged are adopted, checksum for checksum; an object reaching
past the restored high watermark is adopted through a copy of its acknowledged prefix; each
adoption starts a term above every term in the bucket and is the catch-up a reconciler would
append (LRO, LRLO and so M(p) move as they would)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from levelzero.actors.l1 import L1Catalog
from levelzero.core.compaction import build_compacted_object

from levelzero.core.entries import AdvanceReconciledOffset, LogRecord, Placeholder
from levelzero.core.errors import ObjectNotFound, StorageError
from levelzero.core.keys import (
    RESTORES_ROOT,
    TopicRecord,
    encode_topic_record,
    format_l0_key,
    format_l1_key,
    format_restore_key,
    parse_l1_key,
    parse_restore_key,
    topic_record_key,
)
from levelzero.core.l0format import Record, build_object, checksum, decode_single_extent, encode_extent
from levelzero.daemon.recover import adopt_all, adopt_partition, describe, rebuild_from_bucket, replay_state
from levelzero.storage.memory_log import MemoryLogStore
from levelzero.storage.memory_store import MemoryObjectStore
from levelzero.storage.protocols import L1Row, L1State, PartitionRow

L0_KEY = format_l0_key(1, 1, "a" * 32)  # gone: the live GC deleted it


def records(n: int, tag: str) -> list[Record]:
    return [Record(f"{tag}{i}".encode(), f"{tag}-value-{i}".encode() * (i + 1)) for i in range(n)]


async def put_l1(objects: MemoryObjectStore, base: int, term: int, recs: list[Record], uuid: str) -> str:
    key = format_l1_key("t", 0, base, base + len(recs) - 1, term, uuid * 32)
    data, _ = build_object(term, [(1, encode_extent(recs), len(recs))])
    await objects.put(key, data)
    return key


async def test_only_what_the_restored_log_acknowledged_is_adopted_under_a_term_above_the_bucket() -> None:
    store, objects = MemoryLogStore(), MemoryObjectStore()
    [row] = await store.create_topic("t", 1, 1, 0.0)
    term = (await store.begin_term(row.pid, 0, 0)).term
    # The restored log: 15 records in 3 placeholders, none reconciled.
    acked = [records(5, "a"), records(5, "b"), records(5, "c")]
    await store.append(
        row.pid,
        term,
        [
            LogRecord(
                1 + i,
                term,
                5 * i,
                Placeholder(1, L0_KEY, 0, len(encode_extent(r)), 5, checksum(encode_extent(r))),
            )
            for i, r in enumerate(acked)
        ],
    )
    # The bucket: the live leader's (term 3) 0-9 and 10-19 (its last 5 records were written
    # after the backup), and another history's term-4 object at 10-14 with other records.
    first = await put_l1(objects, 0, 3, acked[0] + acked[1], "1")
    await put_l1(objects, 10, 3, acked[2] + records(5, "after"), "2")
    other = await put_l1(objects, 10, 4, records(5, "other"), "3")

    result = await adopt_partition(store, objects, row, 10.0)
    assert result is not None
    # 0-9 adopted as it is; at 10 the newest term's object holds records the log never
    # acknowledged, and it outranks term 3's there: nothing more (a hole, never wrong data).
    assert (result.lro_before, result.lro_after, result.adopted, result.copied, result.term) == (
        -1,
        9,
        1,
        0,
        5,
    )
    [adopted] = await store.l1_list(row.pid)
    assert (
        adopted.key,
        adopted.base_offset,
        adopted.last_offset,
        adopted.last_log_offset,
        adopted.term,
        adopted.state,
    ) == (first, 0, 9, 2, 5, L1State.COPY_FINISHED)
    state = await replay_state(store, row)
    assert (state.lro, state.lrlo, state.term, state.reconciled_by_term) == (9, 2, 5, {5: 9})
    assert state.l1_range_valid(5, 0, 9)
    assert state.mp == 0  # LRLO reached the window's entry: M(p) at the window's lower edge - 1

    # The other history's object goes (an operator, or it was never there): the next run
    # adopts the rest, copying the acknowledged prefix of the object that reaches past it.
    await objects.delete_many([other])
    again = await adopt_partition(store, objects, row, 20.0)
    assert again is not None
    assert (again.lro_after, again.adopted, again.copied, again.term) == (14, 0, 1, 6)
    copy = next(r for r in await store.l1_list(row.pid) if r.base_offset == 10)
    assert (copy.last_offset, copy.last_log_offset, copy.term) == (14, 3, 6)
    assert copy.key.startswith("level_one/t/0/00000000000000000010-00000000000000000014/6-")
    assert decode_single_extent(await objects.get(copy.key), copy.key) == acked[2]
    state = await replay_state(store, row)
    assert (state.lro, state.term, state.reconciled_by_term) == (14, 6, {5: 9, 6: 14})
    assert not state.has_unreconciled_data
    assert await adopt_partition(store, objects, row, 30.0) is None  # nothing left to adopt


async def test_a_partition_with_nothing_to_adopt_still_outranks_the_lost_historys_terms() -> None:
    """A restored partition reconciled up to its high watermark adopts nothing, but the bucket
    holds what the lost history wrote after the backup under later terms (its leader restarted):
    the restore starts a term above them, so what the restored daemon acknowledges at those
    offsets outranks them if the bucket is ever read again (`recover --from-bucket` keeps the
    newest term's object). Before, it kept its own term, and a recovery later served the lost
    history's records at offsets the restored daemon had acknowledged anew."""
    store, objects = MemoryLogStore(), MemoryObjectStore()
    [row] = await store.create_topic("t", 1, 1, 0.0)
    term = (await store.begin_term(row.pid, 0, 0)).term
    acked = records(5, "a")
    encoded = encode_extent(acked)
    await store.append(
        row.pid, term, [LogRecord(1, term, 0, Placeholder(1, L0_KEY, 0, len(encoded), 5, checksum(encoded)))]
    )
    mine = await put_l1(objects, 0, term, acked, "1")
    await store.l1_insert(L1Row(mine, row.pid, 0, 4, 1, term, 1, L1State.COPY_FINISHED, 0.0, 0.0, 0))
    await store.append(row.pid, term, [LogRecord(2, term, 5, AdvanceReconciledOffset(4, 1))])
    assert not (await replay_state(store, row)).has_unreconciled_data
    unchanged = (await replay_state(store, row)).term
    # Its own objects alone: no new term.
    assert await adopt_partition(store, objects, row, 1.0) is None
    assert (await replay_state(store, row)).term == unchanged
    # The lost history: restarted twice after the backup, it reconciled 5-9 under term 3.
    await put_l1(objects, 5, term + 2, records(5, "lost"), "2")
    assert await adopt_partition(store, objects, row, 2.0) is None
    state = await replay_state(store, row)
    assert state.term == term + 3 and state.lro == 4 and state.high_watermark == 5


async def put_key(
    objects: MemoryObjectStore,
    topic: str,
    partition: int,
    base: int,
    term: int,
    recs: list[Record],
    uuid: str,
) -> str:
    key = format_l1_key(topic, partition, base, base + len(recs) - 1, term, uuid * 32)
    data, _ = build_object(term, [(9, encode_extent(recs), len(recs))])
    await objects.put(key, data)
    return key


async def test_a_lost_control_plane_is_rebuilt_from_the_l1_keys() -> None:
    store, objects = MemoryLogStore(), MemoryObjectStore()
    t0 = records(10, "t")
    await put_key(objects, "t", 0, 0, 2, t0[:5], "1")
    await put_key(objects, "t", 0, 5, 2, t0[5:], "2")
    await put_key(objects, "t", 0, 5, 1, records(8, "zombie"), "3")  # term 1's late claim
    late = records(5, "late")
    await put_key(objects, "t", 0, 20, 3, late, "4")  # 10-19: abandoned by an operator
    await put_key(objects, "u", 1, 3, 1, records(5, "u"), "5")  # 0-2: gone by retention
    await objects.put("level_one/t/0/not-an-l1-key", b"?")
    await objects.put(topic_record_key("w"), encode_topic_record(TopicRecord("w", 4, 1.0)))  # no data
    await objects.put(topic_record_key("u"), encode_topic_record(TopicRecord("u", 1, 1.0)))  # too few
    await objects.put(topic_record_key("x"), b'{"topic": "y", "partitions": 2, "created_at": 1.0}')
    await objects.put(format_l0_key(7, 42, "b" * 32), b"an orphan of the lost log")

    summary = await rebuild_from_bucket(store, objects, 50.0)
    assert (summary.rebuilt, summary.topics, summary.cluster_epoch, summary.skipped_keys) == (
        True,
        {"t": 1, "u": 2, "w": 4},
        43,
        1,
    )
    assert await store.get_cluster_epoch() == 43  # above every L0 object's epoch
    rows = {(r.topic, r.partition): r for r in await store.list_partitions()}
    t = await replay_state(store, rows[("t", 0)])
    assert (t.start_offset, t.lro, t.high_watermark, t.term, t.abandoned) == (0, 24, 25, 4, ((10, 19),))
    assert t.mp == 42 and not t.has_unreconciled_data
    l1 = await store.l1_list(rows[("t", 0)].pid)
    assert [(r.base_offset, r.last_offset, r.term) for r in sorted(l1, key=lambda r: r.base_offset)] == [
        (0, 4, 4),
        (5, 9, 4),
        (20, 24, 4),
    ]  # not the zombie's 5-12
    assert all(t.l1_range_valid(r.term, r.base_offset, r.last_offset) for r in l1)
    u1 = await replay_state(store, rows[("u", 1)])
    assert (u1.start_offset, u1.lro, u1.high_watermark, u1.term) == (3, 7, 8, 2)
    assert [p for (topic, p) in rows if topic == "w"] == [0, 1, 2, 3]
    u0 = await replay_state(store, rows[("u", 0)])
    assert (u0.high_watermark, u0.term, await store.l1_list(rows[("u", 0)].pid)) == (0, 0, [])


async def test_an_interrupted_adoption_is_resumed_by_running_it_again() -> None:
    """The catch-up is the last write: an adoption stopped before it adopted nothing; the next
    run copies what the stopped one had recorded (its rows are outside every lineage and the
    daemon collects them) and adopts the copies."""
    store, objects = MemoryLogStore(), MemoryObjectStore()
    [row] = await store.create_topic("t", 1, 1, 0.0)
    term = (await store.begin_term(row.pid, 0, 0)).term
    acked = records(6, "a")
    extent = encode_extent(acked)
    await store.append(
        row.pid, term, [LogRecord(1, term, 0, Placeholder(1, L0_KEY, 0, len(extent), 6, checksum(extent)))]
    )
    original = await put_l1(objects, 0, 2, acked, "1")
    store.fail_appends = 1  # the catch-up fails, as a crash before it would leave things
    try:
        await adopt_partition(store, objects, row, 10.0)
    except StorageError:
        pass
    else:
        raise AssertionError("the injected failure did not happen")
    assert (await replay_state(store, row)).lro == -1  # nothing adopted
    again = await adopt_partition(store, objects, row, 20.0)
    assert again is not None and (again.lro_after, again.adopted, again.copied, again.term) == (5, 0, 1, 4)
    state = await replay_state(store, row)
    valid = [
        r for r in await store.l1_list(row.pid) if state.l1_range_valid(r.term, r.base_offset, r.last_offset)
    ]
    [copy] = valid
    assert copy.key != original and decode_single_extent(await objects.get(copy.key), copy.key) == acked


async def test_restored_l1_rows_whose_objects_are_gone_are_named_with_what_covers_them() -> None:
    """After the backup a compaction replaced t/0's object 0-9 by one for 0-10 (the old one
    deleted), and retention deleted t/1's: the restored metastore names objects that are gone,
    and every read of their offsets answers 500 object_not_found. The restore names them."""
    store, objects = MemoryLogStore(), MemoryObjectStore()
    rows = await store.create_topic("t", 2, 1, 0.0)
    for row in rows:
        term = (await store.begin_term(row.pid, 0, 0)).term
        acked = records(10, f"p{row.partition}")
        encoded = encode_extent(acked)
        placeholder = Placeholder(1, L0_KEY, 0, len(encoded), 10, checksum(encoded))
        await store.append(row.pid, term, [LogRecord(1, term, 0, placeholder)])
        gone = format_l1_key("t", row.partition, 0, 9, term, "1" * 32)  # never in the bucket
        await store.l1_insert(L1Row(gone, row.pid, 0, 9, 1, term, 1, L1State.COPY_FINISHED, 0.0, 0.0, 0))
        await store.append(row.pid, term, [LogRecord(2, term, 10, AdvanceReconciledOffset(9, 1))])
    await put_key(objects, "t", 0, 0, 1, records(11, "compacted"), "2")  # the compaction's 0-10
    topic = TopicRecord("t", 2, 0.0)
    await objects.put(topic_record_key("t"), encode_topic_record(topic))  # not deleted since
    summary = await adopt_all(store, objects, 1.0)
    # t/0's compacted object covers the range: its records there come back (the tests below).
    assert summary.repaired == {"t/0": [(0, 9)]}
    assert summary.missing == {"t/1": [(0, 9, False)]}
    lines = describe(summary)
    assert lines[1] == (
        "t/0: the L1 objects of offsets 0-9 that the restored control plane names were replaced by "
        "a compaction after the backup: its records there were copied into a new compacted object "
        "(a record it removed because its key was written again after the backup is gone); see "
        "docs/backup-restore.md, 'L1 objects gone since the backup'"
    )
    assert "t/1: the L1 objects of offsets 0-9" in lines[2] and "nothing in the bucket holds" in lines[2]


def keyed(*pairs: tuple[str, str]) -> list[Record]:
    return [Record(key.encode(), value.encode()) for key, value in pairs]


async def put_compacted(
    objects: MemoryObjectStore, base: int, last: int, term: int, kept: dict[int, Record], uuid: str
) -> str:
    """A compaction's object of the lost history: `kept` at their own offsets."""
    key = format_l1_key("t", 0, base, last, term, uuid * 32)
    offsets = sorted(kept)
    recs = [kept[o] for o in offsets]
    await objects.put(key, build_compacted_object(term, 1, offsets, encode_extent(recs), len(recs)))
    return key


async def restored_compacted_partition(
    store: MemoryLogStore, objects: MemoryObjectStore, history: list[Record], reconciled: list[int]
) -> tuple[PartitionRow, int, list[str]]:
    """A restored partition of `history` (one placeholder a record), its L1 rows for the
    objects ending at each of `reconciled` (none of them in the bucket: a compaction after the
    backup deleted them), its LRO at the last of them. Its row, its term and the rows' keys."""
    [row] = await store.create_topic("t", 1, 1, 0.0, {"cleanup.policy": "compact"})
    term = (await store.begin_term(row.pid, 0, 0)).term
    await store.append(
        row.pid,
        term,
        [
            LogRecord(
                1 + i,
                term,
                i,
                Placeholder(1, L0_KEY, 0, len(encode_extent([r])), 1, checksum(encode_extent([r]))),
            )
            for i, r in enumerate(history)
        ],
    )
    keys, base = [], 0
    for n, last in enumerate(reconciled):
        key = format_l1_key("t", 0, base, last, term, str(n) * 32)
        await store.l1_insert(
            L1Row(key, row.pid, base, last, 1 + last, term, 1, L1State.COPY_FINISHED, 0.0, 0.0, 0)
        )
        keys.append(key)
        base = last + 1
    await store.append(
        row.pid,
        term,
        [LogRecord(1 + len(history), term, len(history), AdvanceReconciledOffset(base - 1, base))],
    )
    await objects.put(topic_record_key("t"), encode_topic_record(TopicRecord("t", 1, 0.0)))
    return row, term, keys


async def l1_reads(store: MemoryLogStore, objects: MemoryObjectStore, row: PartitionRow) -> dict[int, Record]:
    """Every record the partition's valid L1 objects hold, by offset, as the daemon reads them."""
    actor = SimpleNamespace(row=row, state=await replay_state(store, row))
    catalog = L1Catalog(objects, store, lambda: 0.0)
    found: dict[int, Record] = {}
    for l1 in await catalog.refresh(actor):  # type: ignore[arg-type]
        for start, run in await catalog.read_runs(l1):
            found.update((start + i, r) for i, r in enumerate(run))
    return found


async def test_a_compaction_after_the_backup_gives_back_what_it_kept_of_the_restored_range() -> None:
    """Restored: 12 records of a compacted topic, 0-4 and 5-9 reconciled into objects that a
    compaction after the backup replaced by one for 0-12 (it holds offset 12, written after the
    backup, which supersedes offset 8's key, and the unreconciled 10-11) and deleted. The
    restore copies what that object holds at 0-9 into a new compacted object under a term
    above the bucket's, committed as a compaction superseding the gone rows: every record
    the object kept there reads back; 10-11 are not taken from it (above the LRO), and 8
    is gone with the record that superseded it."""
    store, objects = MemoryLogStore(), MemoryObjectStore()
    history = keyed(*[(f"k{i}", "v1") for i in range(5)], *[(f"k{i}", "v2") for i in range(5)])
    history += keyed(("k5", "v1"), ("k6", "v1"))
    row, term, gone = await restored_compacted_partition(store, objects, history, [4, 9])
    after_backup = Record(b"k3", b"v3")  # offset 12, lost with the restore
    kept = {o: history[o] for o in (5, 6, 7, 9, 10, 11)} | {12: after_backup}
    lost = await put_compacted(objects, 0, 12, term + 1, kept, "a")
    await put_l1(objects, 13, term + 2, records(2, "later"), "b")  # the lost history goes on
    with pytest.raises(ObjectNotFound):  # the defect: the restored rows name gone objects
        await l1_reads(store, objects, row)

    summary = await adopt_all(store, objects, 5.0)
    assert (summary.repaired, summary.missing) == ({"t/0": [(0, 9)]}, {})
    reads = await l1_reads(store, objects, row)
    assert reads == {o: history[o] for o in (5, 6, 7, 9)}  # each key's latest value before the backup
    state = await replay_state(store, row)
    [new] = [r for r in await store.l1_list(row.pid, [L1State.COPY_FINISHED])]
    assert (new.base_offset, new.last_offset, new.term) == (0, 9, term + 3) == (0, state.lro, state.term)
    assert new.term > max(
        parse_l1_key(k).term for k in objects.keys() if k.startswith("level_one/") and k != new.key
    )
    compaction = await store.l1_compaction_state(row.pid)
    assert new.key in compaction.compacted_keys and compaction.cleaner_offsets == {term + 3: -1}
    assert {r.key: r.state for r in await store.l1_list(row.pid) if r.key in gone} == dict.fromkeys(
        gone, L1State.DELETE_STARTED
    )
    assert await objects.get(lost)  # left for the daemon's stray sweep
    # The unreconciled 10-11 stay the log's (L0's) to reconcile: not in L1 yet.
    assert (state.lro, state.high_watermark) == (9, 12)

    # A second run changes nothing.
    rows_before, log_before = await store.l1_list(row.pid), state.next_log_offset
    again = await adopt_all(store, objects, 6.0)
    assert (again.repaired, again.missing) == ({}, {})
    assert await store.l1_list(row.pid) == rows_before
    assert (await replay_state(store, row)).next_log_offset == log_before


async def test_a_range_whose_last_record_compaction_removed_stays_named() -> None:
    """A compacted object ends on a record (a fetch inside it relies on it). When the compaction
    after the backup removed the gone range's last record (its key written again since, at
    offset 6), no object ending there can be made: the range stays named, not repaired."""
    store, objects = MemoryLogStore(), MemoryObjectStore()
    history = keyed(*[(f"k{i}", "v1") for i in range(6)])
    row, term, [gone] = await restored_compacted_partition(store, objects, history, [5])
    kept = {o: history[o] for o in range(5)} | {6: Record(b"k5", b"v2")}
    await put_compacted(objects, 0, 6, term + 1, kept, "a")
    summary = await adopt_all(store, objects, 5.0)
    assert (summary.repaired, summary.missing) == ({}, {"t/0": [(0, 5, True)]})
    assert [r.key for r in await store.l1_list(row.pid)] == [gone]  # no object written


async def restored_partition(
    store: MemoryLogStore, objects: MemoryObjectStore, acked: list[list[Record]], reconciled: int
) -> PartitionRow:
    """A restored partition of t/0: one placeholder per batch of `acked`, the first `reconciled`
    batches in L1 objects of its term (in the bucket, its metastore naming them), its LRO at
    their end; its topic record in the bucket."""
    [row] = await store.create_topic("t", 1, 1, 0.0)
    term = (await store.begin_term(row.pid, 0, 0)).term
    base, at = 0, 1
    for i, batch in enumerate(acked):
        extent = encode_extent(batch)
        placeholder = Placeholder(1, L0_KEY, 0, len(extent), len(batch), checksum(extent))
        await store.append(row.pid, term, [LogRecord(at, term, base, placeholder)])
        last = base + len(batch) - 1
        if i < reconciled:
            key = await put_l1(objects, base, term, batch, str(i))
            await store.l1_insert(
                L1Row(key, row.pid, base, last, at, term, 1, L1State.COPY_FINISHED, 0.0, 0.0, 0)
            )
            await store.append(
                row.pid, term, [LogRecord(at + 1, term, last + 1, AdvanceReconciledOffset(last, at))]
            )
            at += 1
        base, at = last + 1, at + 1
    await objects.put(topic_record_key("t"), encode_topic_record(TopicRecord("t", 1, 0.0)))
    return row


async def rebuilt_reads(objects: MemoryObjectStore) -> tuple[int, int, dict[int, Record]]:
    """t/0 as a rebuild from the bucket alone, on an empty control plane, brings it back: its
    high watermark, its term and the records its L1 objects serve."""
    store = MemoryLogStore()
    await rebuild_from_bucket(store, objects, 100.0)
    [row] = await store.list_partitions()
    state = await replay_state(store, row)
    return state.high_watermark, state.term, await l1_reads(store, objects, row)


def restore_marks(objects: MemoryObjectStore) -> list[tuple[str, int, int, int]]:
    return [parse_restore_key(k) for k in sorted(objects.keys()) if k.startswith(RESTORES_ROOT)]


async def test_a_rebuild_after_a_restore_does_not_serve_the_discarded_history_past_it() -> None:
    """The double disaster: a restore to a backup at high watermark 10 (0-4 reconciled, 5-9 not);
    the discarded history had gone on after the backup, under the same term (5-9 and 10-14) and
    under a later one (15-19). The restored daemon acknowledges new records at 10 and on, in L0
    only, and the control plane is lost: a rebuild from the bucket alone brought back the
    discarded history's 10-19 at offsets the restored daemon had acknowledged anew, wrong data
    served silently. The restore's mark keeps them out: the partition comes back at 0-9 (the
    unreconciled records are lost, as documented), and what the restored history reconciles
    after the restore, under a later term, comes back as it is."""
    store, objects = MemoryLogStore(), MemoryObjectStore()
    acked = [records(5, "a"), records(5, "b")]
    await restored_partition(store, objects, acked, reconciled=1)
    await put_l1(objects, 5, 1, acked[1], "5")  # reconciled after the backup: adopted as it is
    await put_l1(objects, 10, 1, records(5, "lost"), "6")
    await put_l1(objects, 15, 2, records(5, "later"), "7")

    summary = await adopt_all(store, objects, 10.0)
    [adopted] = summary.partitions
    assert (adopted.lro_after, adopted.adopted, adopted.copied, adopted.term) == (9, 1, 0, 3)
    assert restore_marks(objects) == [("t", 0, 3, 10, 0)]  # t's record: created at 0

    restored = dict(enumerate(acked[0] + acked[1]))
    assert await rebuilt_reads(objects) == (10, 3, restored)
    # The restored daemon (term 4) reconciles its own 10-12 and the control plane is lost again.
    mine = records(3, "mine")
    await put_l1(objects, 10, 4, mine, "8")
    assert await rebuilt_reads(objects) == (13, 5, restored | {10 + i: r for i, r in enumerate(mine)})


async def test_each_restores_mark_applies_to_a_rebuild() -> None:
    """Restored to a backup at 10 (mark: term 3, 10) while the discarded history had reconciled
    10-11 and 12-19; the restored daemon (term 4) acknowledged 10-14, in L0 only, and a backup
    of it is restored in turn (its mark: term 5, 15, for 12-19). The restored history's 10-14
    are in L0 only again when the control plane is lost: the first restore's mark still keeps
    the first discarded history's 10-11 out, which the second's alone does not (they end below
    15)."""
    objects = MemoryObjectStore()
    acked = [records(10, "a")]
    first = MemoryLogStore()
    await restored_partition(first, objects, acked, reconciled=1)
    await put_l1(objects, 10, 2, records(2, "lost"), "5")
    await put_l1(objects, 12, 2, records(8, "lost-later"), "6")
    assert (await adopt_all(first, objects, 10.0)).partitions == []
    assert restore_marks(objects) == [("t", 0, 3, 10, 0)]  # t's record: created at 0
    # The second backup: the restored daemon's log (term 4) with 10-14 acknowledged.
    second = MemoryLogStore()
    row = await restored_partition(second, objects, acked, reconciled=1)
    term = (await second.begin_term(row.pid, 3, 10, at_least=4)).term
    extent = encode_extent(records(5, "again"))
    await second.append(
        row.pid, term, [LogRecord(4, term, 10, Placeholder(1, L0_KEY, 0, len(extent), 5, checksum(extent)))]
    )
    await adopt_all(second, objects, 20.0)
    assert restore_marks(objects) == [("t", 0, 3, 10, 0), ("t", 0, 5, 15, 0)]

    # The rebuilt term is at or above every mark's (above every object's alone it would be 3): what
    # the rebuilt daemon reconciles at 15 and on is not taken for the second discarded history.
    assert await rebuilt_reads(objects) == (10, 5, dict(enumerate(acked[0])))
    await objects.delete_many([format_restore_key("t", 0, 3, 10, 0)])  # the first mark alone gone
    high_watermark, _, reads = await rebuilt_reads(objects)
    assert (high_watermark, reads[10]) == (12, records(2, "lost")[0])  # the defect it prevents


async def test_a_restore_mark_of_a_deleted_topic_drops_nothing_of_a_topic_made_again() -> None:
    """t was restored (its mark names its record's creation), then deleted, and the mark's
    removal with it failed; a topic made again with the name reconciled 0-9 under its first
    terms. A rebuild from the bucket alone dropped them (the mark's term is above theirs and its
    high watermark below): acknowledged records lost. The mark names the deleted topic, and the
    rebuild ignores it, for the new topic's record (created later) as for no record at all."""
    objects = MemoryObjectStore()
    store = MemoryLogStore()
    acked = [records(5, "a")]
    await restored_partition(store, objects, acked, reconciled=1)
    await put_l1(objects, 5, 1, records(5, "lost"), "5")  # the discarded history's
    await adopt_all(store, objects, 10.0)
    [mark] = restore_marks(objects)
    assert (mark.term, mark.high_watermark, mark.topic_created) == (2, 5, 0)
    # t deleted: its L1 objects and record go, its mark stays (the failed removal).
    await objects.delete_many([k for k in objects.keys() if not k.startswith(RESTORES_ROOT)])
    # t made again (its record created at 50), its 0-9 reconciled under term 1.
    again = records(10, "again")
    await put_l1(objects, 0, 1, again, "6")
    await objects.put(topic_record_key("t"), encode_topic_record(TopicRecord("t", 1, 50.0)))
    assert await rebuilt_reads(objects) == (10, 2, dict(enumerate(again)))
    summary = await rebuild_from_bucket(MemoryLogStore(), objects, 100.0)
    assert summary.marks_ignored == 1
    assert "1 restore mark of topics deleted since (ignored" in "\n".join(describe(summary))
    # Its record's write failed (none in the bucket): the mark names the deleted record still.
    await objects.delete_many([topic_record_key("t")])
    assert await rebuilt_reads(objects) == (10, 2, dict(enumerate(again)))
    # A mark naming no record (an earlier release's) applies to the name, as it did.
    await objects.put(format_restore_key("t", 0, 2, 5), b"")
    assert await rebuilt_reads(objects) == (0, 2, {})


async def test_a_partition_with_a_restore_mark_and_no_object_left_comes_back_under_its_term() -> None:
    """The restored daemon's stray sweep deleted the discarded history's objects, and nothing
    was reconciled since: the partition comes back empty, but under the mark's term, so that
    what the rebuilt daemon reconciles at the marked offsets is not left out by the mark in a
    later rebuild."""
    objects = MemoryObjectStore()
    await objects.put(topic_record_key("t"), encode_topic_record(TopicRecord("t", 1, 0.0)))
    await objects.put(format_restore_key("t", 0, 7, 0), b"")
    store = MemoryLogStore()
    summary = await rebuild_from_bucket(store, objects, 100.0)
    [row] = await store.list_partitions()
    state = await replay_state(store, row)
    assert (state.term, state.high_watermark, [p.term for p in summary.partitions]) == (7, 0, [7])
