"""Which L1 objects found in the bucket a partition may adopt (`core/adoption.py`), and the
check that an L1 object's records are the ones a placeholder acknowledged (`l0format`)."""

from __future__ import annotations

import itertools

import msgspec

from levelzero.core.adoption import lineage, next_start_after, restored_history, starting_at, term_above
from levelzero.core.keys import L1Key
from levelzero.core.l0format import Record, checksum, encode_extent, records_match_extent


def key(base: int, last: int, term: int, uuid: str = "0" * 32) -> L1Key:
    return L1Key("t", 0, base, last, term, uuid)


def test_a_zombies_late_object_loses_to_the_newer_terms_in_either_order() -> None:
    """Seed 004's case: term 1 recorded up to 19; term 2 took over and reconciled 20-39; term 1's
    zombie then uploaded 20-29 (its catch-up refused). Listing order does not matter."""
    live = [key(0, 9, 1), key(10, 19, 1), key(20, 39, 2), key(40, 49, 2)]
    zombie = key(20, 29, 1, "f" * 32)
    for keys in itertools.permutations([*live, zombie]):
        assert lineage(keys) == live


def test_an_older_term_counts_only_below_every_newer_terms_start() -> None:
    keys = [key(0, 9, 1), key(10, 19, 3), key(5, 14, 2), key(20, 29, 5), key(15, 24, 4)]
    # term 5 starts at 20: term 4's 15-24 reaches it (out); term 3's 10-19 is below (in), then
    # term 2's 5-14 reaches 10 (out); term 1's 0-9 is below 10 (in).
    assert lineage(keys) == [key(0, 9, 1), key(10, 19, 3), key(20, 29, 5)]


def test_candidates_at_an_offset_newest_term_first_then_longest() -> None:
    kept = lineage([key(10, 14, 2, "a" * 32), key(10, 19, 2, "b" * 32), key(0, 9, 1), key(30, 39, 2)])
    assert starting_at(kept, 10) == [key(10, 19, 2, "b" * 32), key(10, 14, 2, "a" * 32)]
    assert starting_at(kept, 20) == []
    assert next_start_after(kept, 20) == 30 and next_start_after(kept, 30) is None


def test_a_restore_mark_drops_the_discarded_historys_objects_reaching_its_high_watermark() -> None:
    """Restored to high watermark 20, the restored history writing from term 5: the discarded
    history's objects (terms below 5) reaching offset 20 go, wholly (10-24 too); below 20 both
    histories hold the same records and everything stays; term 5 and above stay everywhere."""
    below = [key(0, 9, 2), key(10, 19, 4), key(12, 19, 3)]
    discarded = [key(10, 24, 3), key(20, 29, 4), key(20, 20, 1), key(30, 39, 2)]
    restored = [key(20, 29, 5), key(15, 34, 6)]
    assert restored_history([*below, *discarded, *restored], [(5, 20)]) == [*below, *restored]
    assert restored_history(discarded, []) == discarded  # no mark: nothing dropped
    # Restored to an empty partition: every object of an older term is the discarded history's.
    assert restored_history([*below, *restored], [(5, 0)]) == restored


def test_several_restore_marks_each_apply() -> None:
    """Restored to 20 (from term 5), then again to 12 (from term 8): each mark drops its own
    discarded history; the second drops the first restored history's objects past 12 too."""
    keys = [key(0, 9, 1), key(10, 19, 3), key(20, 29, 4), key(20, 29, 6), key(10, 11, 7), key(12, 14, 7)]
    assert restored_history(keys, [(5, 20)]) == [key(0, 9, 1), key(10, 19, 3), key(20, 29, 6), *keys[4:]]
    assert restored_history(keys, [(8, 12)]) == [key(0, 9, 1), key(10, 11, 7)]
    assert restored_history(keys, [(5, 20), (8, 12)]) == [key(0, 9, 1), key(10, 11, 7)]
    assert restored_history([*keys, key(12, 19, 8)], [(8, 12), (5, 20)])[-1] == key(12, 19, 8)


def test_an_adopting_term_is_above_every_term_in_the_bucket() -> None:
    assert term_above([key(0, 9, 7), key(10, 19, 3)], current=4) == 8
    assert term_above([], current=4) == 5


def test_records_match_the_extent_they_were_acknowledged_as() -> None:
    records = [Record(b"k", b"v" * 300), Record(None, b"", 1_700_000_000_000, (("h", None), ("i", b"x")))]
    assert records_match_extent(records, checksum(encode_extent(records)))
    assert not records_match_extent(records, checksum(encode_extent(records[:1])))
    changed = [records[0], msgspec.structs.replace(records[1], value=b"!")]
    assert not records_match_extent(changed, checksum(encode_extent(records)))


def test_records_of_a_version_1_extent_match_it() -> None:
    """Version 1 wrote `[key, value]` records; they decode with the later fields' defaults."""
    plain = [Record(b"k", b"v"), Record(None, b"w" * 200)]
    version_1 = msgspec.msgpack.encode([(r.key, r.value) for r in plain])
    assert records_match_extent(plain, checksum(version_1))
    assert not records_match_extent([Record(b"k", b"v", 5), plain[1]], checksum(version_1))
