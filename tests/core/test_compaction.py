"""The pure rules of compaction: the cleaner-offset map's lineage check (seed 004's table, both
arrival orders), which records a pass keeps, and when a pass is due."""

from __future__ import annotations

import random
import struct
from collections.abc import Sequence

import msgspec

from levelzero.core.compaction import (
    KEY_MAP_ENTRIES_MAX,
    PassInput,
    EncodedOf,
    Retained,
    build_compacted_object,
    clean_limit,
    cleaner_map_refusal,
    compaction_due,
    contiguous_runs,
    extend_cleaner_map,
    known_old,
    last_index_per_key,
    l1_object_runs,
    retain,
)
from levelzero.core.l0format import NO_TIMESTAMP, Record, build_object, encode_extent, max_timestamp
from levelzero.core.txn_marks import TXN_HEADER

A_TERM, B_TERM = 0, 1


def _apply(accepted: dict[int, int], current: int, writer: int, claim: dict[int, int]) -> dict[int, int]:
    return accepted if cleaner_map_refusal(accepted, current, writer, claim) else dict(claim)


def test_seed_table_zombie_result_is_refused_in_either_arrival_order() -> None:
    accepted = _apply({}, A_TERM, A_TERM, {A_TERM: 100})  # A compacts under LE-0
    assert accepted == {0: 100}
    b_claim = extend_cleaner_map(accepted, B_TERM, 155)  # B leads (LE-1) and compacts
    assert b_claim == {0: 100, 1: 155}
    zombie = {A_TERM: 123}  # A, back from a pause, uploads its pending result
    b_first = _apply(_apply(accepted, B_TERM, B_TERM, b_claim), B_TERM, A_TERM, zombie)
    zombie_first = _apply(_apply(accepted, B_TERM, A_TERM, zombie), B_TERM, B_TERM, b_claim)
    assert b_first == zombie_first == {0: 100, 1: 155}
    assert "zombie" in (cleaner_map_refusal({0: 100}, B_TERM, A_TERM, zombie) or "")


def test_a_map_rewriting_an_earlier_terms_end_is_refused() -> None:
    assert cleaner_map_refusal({0: 100}, 1, 1, {0: 123, 1: 155}) is not None
    assert cleaner_map_refusal({0: 100}, 1, 1, {1: 155}) is not None  # drops term 0's end
    assert cleaner_map_refusal({}, 1, 1, {0: 5, 1: 155}) is not None  # invents term 0's
    assert cleaner_map_refusal({0: 100, 1: 155}, 1, 1, {0: 100, 1: 120}) is not None  # goes back
    assert cleaner_map_refusal({0: 100, 1: 155}, 1, 1, {0: 100, 1: 200}) is None


def _retain(
    offsets: list[int],
    records: list[Record],
    written: list[int],
    clean_upto: int,
    now_ms: int,
    delete_retention_ms: int,
) -> Retained:
    """`retain` given whole records: their keys and each one encoded on its own, as a pass's
    input holds them (`PassInput`)."""
    keys = [r.key for r in records]
    encoded = [msgspec.msgpack.encode(r) for r in records]
    kept = retain(offsets, keys, written, clean_upto, now_ms, delete_retention_ms, _encoded_of(encoded))
    assert kept.extent == encode_extent(kept.records)  # the kept bytes are the records' own
    return kept


def _encoded_of(encoded: list[bytes]) -> EncodedOf:
    def of(indices: Sequence[int]) -> list[bytes]:
        assert list(indices) == sorted(set(indices)), indices
        return [encoded[i] for i in indices]

    return of


def _clean_limit(
    offsets: list[int],
    records: list[Record],
    written: list[int],
    reconciled_upto: int,
    now_ms: int,
    min_lag_ms: int,
    key_map_entries_max: int = KEY_MAP_ENTRIES_MAX,
) -> int:
    keys, timestamps = [r.key for r in records], [r.timestamp_ms for r in records]
    return clean_limit(
        offsets, keys, timestamps, written, reconciled_upto, now_ms, min_lag_ms, key_map_entries_max
    )


def _records(pairs: list[tuple[bytes, bytes | None]]) -> list[Record]:
    return [Record(k, v, timestamp_ms=1_000) for k, v in pairs]


def test_retain_keeps_the_latest_record_per_key_at_its_offset() -> None:
    records = _records([(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1"), (b"b", b"2")])
    offsets = [10, 11, 12, 13, 14]
    kept = _retain(offsets, records, [0] * 5, 14, now_ms=2_000, delete_retention_ms=10_000)
    assert kept.offsets == [12, 13, 14]
    assert [(r.key, r.value) for r in kept.records] == [(b"a", b"2"), (b"c", b"1"), (b"b", b"2")]
    assert kept.removed == 2


def test_tombstones_stay_until_delete_retention_then_go() -> None:
    records = _records([(b"a", b"1"), (b"a", None), (b"b", b"1")])
    young = _retain([0, 1, 2], records, [0] * 3, 2, now_ms=1_500, delete_retention_ms=1_000)
    assert young.offsets == [1, 2] and young.records[0].value is None
    old = _retain([0, 1, 2], records, [0] * 3, 2, now_ms=2_000, delete_retention_ms=1_000)
    assert old.offsets == [2] and old.tombstones_dropped == 1


def test_records_above_the_clean_limit_are_untouched() -> None:
    records = _records([(b"a", b"1"), (b"a", b"2"), (b"a", b"3")])
    kept = _retain([0, 1, 2], records, [0] * 3, 0, now_ms=2_000, delete_retention_ms=0)
    assert kept.offsets == [0, 1, 2]


def test_clean_limit_stops_at_the_reconciled_offset_the_lag_and_a_full_key_map() -> None:
    records = [Record(bytes([i]), b"v", timestamp_ms=t) for i, t in enumerate([100, 200, 300, 400])]
    offsets, written = [0, 1, 2, 3], [0] * 4
    assert _clean_limit(offsets, records, written, 2, now_ms=1_000, min_lag_ms=0) == 2
    assert _clean_limit(offsets, records, written, 3, now_ms=1_000, min_lag_ms=750) == 1
    assert _clean_limit(offsets, records, written, 3, now_ms=1_000, min_lag_ms=0, key_map_entries_max=3) == 2


def test_compaction_is_due_at_the_dirty_ratio() -> None:
    assert compaction_due(0, 10, 0.5)
    assert compaction_due(50, 50, 0.5)
    assert not compaction_due(60, 40, 0.5)
    assert not compaction_due(10, 0, 0.0)


def test_max_compaction_lag_makes_old_dirty_data_due_whatever_the_ratio() -> None:
    assert not compaction_due(90, 10, 0.5, dirty_age_ms=999, max_compaction_lag_ms=1000)
    assert compaction_due(90, 10, 0.5, dirty_age_ms=1000, max_compaction_lag_ms=1000)
    assert not compaction_due(90, 10, 0.5, dirty_age_ms=10**12, max_compaction_lag_ms=None)
    assert not compaction_due(90, 0, 0.5, dirty_age_ms=10**12, max_compaction_lag_ms=0)  # nothing dirty


def test_contiguous_runs() -> None:
    assert contiguous_runs([3, 4, 5, 9, 11, 12]) == [(3, 3), (9, 1), (11, 2)]


def test_the_last_record_of_a_pass_stays_even_an_expired_tombstone() -> None:
    records = _records([(b"a", b"1"), (b"a", None)])
    kept = _retain([0, 1], records, [0, 0], 1, now_ms=10_000, delete_retention_ms=0)
    assert kept.offsets == [1] and kept.records[0].value is None


def test_records_without_a_key_are_dropped_by_a_pass() -> None:
    records = [Record(None, b"x"), Record(b"a", b"1"), Record(b"a", b"2")]
    assert _clean_limit([0, 1, 2], records, [0] * 3, 2, now_ms=0, min_lag_ms=0) == 2
    kept = _retain([0, 1, 2], records, [0] * 3, 2, now_ms=0, delete_retention_ms=10)
    assert kept.offsets == [2]


def test_a_compacted_object_gives_each_record_its_offset() -> None:
    records = _records([(b"a", b"2"), (b"c", b"1"), (b"b", None)])
    data = build_compacted_object(3, 7, [12, 13, 20], encode_extent(records), 3)
    runs = l1_object_runs(data, 10, "test")
    assert [(base, [r.key for r in rs]) for base, rs in runs] == [(12, [b"a", b"c"]), (20, [b"b"])]


def _reference_retain(offsets, records, written, clean_upto, now_ms, delete_retention_ms):
    """The rule spelled out record by record: what the pass's faster code must equal."""
    pairs = zip(offsets, records, strict=True)
    latest = {r.key: o for o, r in pairs if o <= clean_upto and r.key is not None}
    cleaned_last = max((o for o in offsets if o <= clean_upto), default=None)
    kept = []
    for o, r, w in zip(offsets, records, written, strict=True):
        if o <= clean_upto and o not in (offsets[-1], cleaned_last):
            if r.key is None or latest[r.key] != o:
                continue
            time_ms = w if r.timestamp_ms == -1 else r.timestamp_ms
            if r.value is None and now_ms - time_ms >= delete_retention_ms:
                continue
        kept.append(o)
    return kept


def _reference_limit(offsets, records, written, reconciled_upto, now_ms, min_lag_ms, key_map_max):
    limit, seen = -1, set()
    for o, r, w in zip(offsets, records, written, strict=True):
        time_ms = w if r.timestamp_ms == -1 else r.timestamp_ms
        # (no lag: no time looked at, a record stamped in the future included, as Kafka's)
        if o > reconciled_upto or (min_lag_ms > 0 and time_ms > now_ms - min_lag_ms):
            break
        if r.key is not None:
            if r.key not in seen and len(seen) >= key_map_max:
                break
            seen.add(r.key)
        limit = o
    return limit


def test_a_pass_keeps_and_stops_exactly_as_the_rule_spelled_out_record_by_record() -> None:
    rng = random.Random(34)
    for _ in range(400):
        n = rng.randint(1, 40)
        offsets = sorted(rng.sample(range(100), n))
        records = [
            Record(
                rng.choice([None, b"a", b"b", b"c", b"d"]),
                rng.choice([None, b"", b"v"]),
                timestamp_ms=rng.choice([-1, rng.randint(0, 100)]),
            )
            for _ in range(n)
        ]
        written = [rng.randint(0, 100) for _ in range(n)]
        now, lag, retention = rng.randint(50, 150), rng.randint(0, 60), rng.randint(0, 80)
        upto, key_max = rng.choice([-1, *offsets, 200]), rng.randint(1, 5)
        limit = _clean_limit(offsets, records, written, upto, now, lag, key_max)
        assert limit == _reference_limit(offsets, records, written, upto, now, lag, key_max)
        clean_upto = rng.choice([-1, *offsets])
        kept = _retain(offsets, records, written, clean_upto, now, retention)
        assert kept.offsets == _reference_retain(offsets, records, written, clean_upto, now, retention)
        assert kept.records == [records[offsets.index(o)] for o in kept.offsets]


def _l1_object(records: list[Record], offsets: list[int], compacted: bool) -> bytes:
    """An L1 object as the reconciler writes it (one run) or as a compaction does (its runs)."""
    if compacted:
        return build_compacted_object(2, 7, offsets, encode_extent(records), len(records))
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    data, _ = build_object(2, [(7, encode_extent(records), len(records))])
    return data


def test_a_pass_scanning_keys_and_bytes_keeps_what_whole_records_would() -> None:
    """The pass's input, decoded only as far as keys and each record's bytes, from objects
    both the reconciler's and a compaction's: the same offsets, keys, timestamps and bytes as
    whole records, and the pass over it keeps, record by record, what the rule says; the new
    object's extent is the kept records' own bytes, and its newest timestamp theirs."""
    rng = random.Random(3434)
    for _ in range(200):
        scanned, offsets, records, written = PassInput(), [], [], []
        offset = rng.randint(0, 5)
        for _ in range(rng.randint(1, 4)):
            n = rng.randint(1, 12)
            compacted = rng.random() < 0.5
            if compacted:
                at = sorted(rng.sample(range(offset, offset + 3 * n), n))
            else:
                at = list(range(offset, offset + n))
            chunk = [
                Record(
                    rng.choice([None, b"a", b"b", b"c", b"\x00" * 300]),
                    rng.choice([None, b"", b"v", b"w" * 70_000]),
                    timestamp_ms=rng.choice([NO_TIMESTAMP, rng.randint(0, 100)]),
                    headers=rng.choice([(), (("h", b"x"), ("n", None))]),
                )
                for _ in range(n)
            ]
            when = rng.randint(0, 100)
            newest = rng.choice([None, max_timestamp(chunk), max_timestamp(chunk) + 5])
            scanned.add_object(_l1_object(chunk, at, compacted), at[0], when, newest, "test")
            offsets += at
            records += chunk
            written += [when] * n
            offset = at[-1] + rng.randint(1, 4)
        assert scanned.offsets == offsets
        assert scanned.keys == [r.key for r in records]
        some = sorted(rng.sample(range(len(records)), rng.randint(0, len(records))))  # some objects only
        assert [bytes(e) for e in scanned.encoded(some)] == [msgspec.msgpack.encode(records[i]) for i in some]
        everyone = range(len(records))
        assert [bytes(e) for e in scanned.encoded(everyone)] == [msgspec.msgpack.encode(r) for r in records]
        assert scanned.timestamps_ms() == [r.timestamp_ms for r in records]
        now, lag, retention = rng.randint(50, 150), rng.randint(0, 60), rng.randint(0, 80)
        upto, key_max = rng.choice([-1, *offsets, 500]), rng.randint(1, 5)
        want = _reference_limit(offsets, records, written, upto, now, lag, key_max)
        latest = last_index_per_key(scanned.keys)  # the key map, shared by both steps or not
        given = rng.choice([None, latest])
        limit = clean_limit(
            offsets, scanned.keys, scanned.timestamps_ms(), written, upto, now, lag, key_max, given
        )
        assert limit == want
        if known_old(scanned.objects, now - lag):  # every record past the lag: no timestamp read
            assert clean_limit(offsets, scanned.keys, None, written, upto, now, lag, key_max, given) == want
        clean_upto = rng.choice([-1, offsets[-1], *offsets])
        kept = retain(offsets, scanned.keys, written, clean_upto, now, retention, scanned.encoded, given)
        assert kept.offsets == _reference_retain(offsets, records, written, clean_upto, now, retention)
        assert kept.records == [records[offsets.index(o)] for o in kept.offsets]
        assert kept.extent == encode_extent(kept.records)
        rebuilt = build_compacted_object(2, 7, kept.offsets, kept.extent, len(kept.records))
        runs = l1_object_runs(rebuilt, kept.offsets[0], "test")
        read_back = [(b + i, r) for b, rs in runs for i, r in enumerate(rs)]
        assert read_back == list(zip(kept.offsets, kept.records, strict=True))


def test_known_old_needs_every_objects_newest_timestamp_and_write_time_past_the_lag() -> None:
    assert known_old([(10, 20), (NO_TIMESTAMP, 30)], 30)
    assert not known_old([(10, 20), (31, 30)], 30)  # a record's timestamp past it
    assert not known_old([(10, 31)], 30)  # a record without a timestamp may count from 31
    assert not known_old([(None, 0)], 30)  # unknown: the records are read


def _txn(key: bytes, value: bytes, producer_id: int, kind: int) -> Record:
    header = (TXN_HEADER, struct.pack(">qhb", producer_id, 0, kind))
    return Record(key, value, 1_000, (header,))


def test_aborted_records_supersede_nothing_commit_markers_go_abort_markers_stay() -> None:
    """Producer 7 commits a=1 (0, marker 1), aborts a=2 b=9 (2, 3, marker 4); producer 8 writes
    a=3 outside any transaction (5). Cleaned to 4: a=1 is the latest of `a` read_committed sees
    there, the aborted records and the commit marker go, the abort marker stays; above, a=3."""
    records = [
        _txn(b"a", b"1", 7, -1),
        _txn(b"\x00\x00\x00\x01", b"", 7, 1),
        _txn(b"a", b"2", 7, -1),
        _txn(b"b", b"9", 7, -1),
        _txn(b"\x00\x00\x00\x00", b"", 7, 0),
        Record(b"a", b"3", 1_000, ()),
    ]
    data, _ = build_object(2, [(7, encode_extent(records), len(records))])

    def scan(aborted: list[tuple[int, int, int]] | None) -> tuple[PassInput, list[int]]:
        scanned = PassInput()
        scanned.add_object(data, 0, 0, None, "test")
        if aborted is not None:
            scanned.apply_transactions(aborted)
        kept = retain(scanned.offsets, scanned.keys, [0] * 6, 4, 2_000, 86_400_000, scanned.encoded)
        return scanned, kept.offsets

    scanned, kept = scan([(7, 2, 4)])
    keys = scanned.keys
    assert keys[1] is None and keys[2] is None and keys[3] is None
    assert keys[0] == keys[5] == b"a" and keys[4] not in (None, b"a", b"\x00\x00\x00\x00")
    assert kept == [0, 4, 5]
    # Without the aborted list the aborted a=2 and b=9 would win over the committed a=1.
    assert scan(None)[1] == [1, 2, 3, 4, 5]
    # An object without transactional records is not decoded for it: its keys stay.
    plain = PassInput()
    plain_data, _ = build_object(2, [(7, encode_extent([Record(b"a", b"1", 1_000, ())]), 1)])
    plain.add_object(plain_data, 0, 0, None, "test")
    plain.apply_transactions([(7, 0, 0)])
    assert plain.keys == [b"a"]


def test_the_cleaned_ranges_last_record_stays_whatever_it_is() -> None:
    """a=0 (0); producer 7 commits a=1 (1, marker 2); producer 8's transaction is open from 3
    (b=2), so the pass cleans to 2. a=0 goes; the commit marker stays, being the cleaned range's
    last record: a read_committed fetch at 2 must find a record below the last stable offset (3).
    Cleaned to 3 (the transaction ended), the marker goes; a tombstone that is the cleaned
    range's last record stays past delete.retention.ms too."""
    records = [
        Record(b"a", b"0", 1_000, ()),
        _txn(b"a", b"1", 7, -1),
        _txn(b"\x00\x00\x00\x01", b"", 7, 1),
        _txn(b"b", b"2", 8, -1),
        _txn(b"\x00\x00\x00\x01", b"", 8, 1),
        Record(b"c", None, 1_000, ()),
        Record(b"d", b"1", 1_000, ()),
    ]
    data, _ = build_object(2, [(7, encode_extent(records), len(records))])
    scanned = PassInput()
    scanned.add_object(data, 0, 0, None, "test")
    scanned.apply_transactions([])

    def kept(clean_upto: int) -> list[int]:
        return retain(scanned.offsets, scanned.keys, [0] * 7, clean_upto, 2_000, 0, scanned.encoded).offsets

    assert kept(2) == [1, 2, 3, 4, 5, 6]
    assert kept(3) == [1, 3, 4, 5, 6]
    assert kept(5) == [1, 3, 5, 6]  # the tombstone (retention 0) stays as the range's last
    assert kept(6) == [1, 3, 6]
